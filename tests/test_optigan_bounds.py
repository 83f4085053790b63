"""environment.output_bounds: the generator's outputs folded into the crystal's physical bounds by reflection."""
import numpy as np
import pytest
import torch

from sagips.config import from_dict
from sagips.environment import get_environment
from sagips_environments.optigan.nets import reflect_into


def test_reflect_into_folds_at_the_bounds():
    lo, hi = torch.tensor([-1.5, 0.7, -torch.inf]), torch.tensor([1.5, 1.0, torch.inf])
    y = torch.tensor([[0.3, 0.8, 7.0],      # inside: unchanged; the unbounded column passes through
                      [1.7, 1.1, -9.0],     # past the upper bound: mirrored back (1.5 - 0.2, 1.0 - 0.1)
                      [-1.9, 0.5, 0.0],     # past the lower bound: mirrored back (-1.5 + 0.4, 0.7 + 0.2)
                      [4.7, 1.35, 1.0]])    # past both: a triangle wave (4.7 -> -1.7 -> -1.3; 1.35 -> 0.65 -> 0.75)
    want = torch.tensor([[0.3, 0.8, 7.0], [1.3, 0.9, -9.0], [-1.1, 0.9, 0.0], [-1.3, 0.75, 1.0]])
    assert torch.allclose(reflect_into(y, lo, hi), want, atol=1e-5)
    # differentiable, slope +-1
    x = torch.tensor([[0.2, 0.8, 1.0], [1.8, 1.2, 1.0]], requires_grad=True)
    reflect_into(x, lo, hi).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 1.0]]))


def _env(**kw):
    env_cls = get_environment("optigan")
    cfg = from_dict(env_cls.Config, dict(photons_per_point=40, grid_side=2, grid_depths=1, heldout_points=1,
                                         heldout_photons=40, batch_size=4096, **kw), "environment.")
    arrays, attrs = env_cls.generate_reference(cfg, 3)
    env = env_cls(cfg, "cpu", seed=0)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    return env


def test_generator_outputs_stay_in_the_crystal_with_reflect():
    torch.manual_seed(0)
    x = torch.cat([5 * torch.randn(4000, 10), torch.rand(4000, 3)], 1)
    env = _env(output_bounds="reflect")
    G = env.build_generator()
    with torch.no_grad():
        for p in G.model.parameters():  # a wide output, far outside the face
            p.mul_(4.0)
        out = G(x)
    w, cos_c = env.cfg.crystal_width / 2, env.crystal(env.cfg).cos_critical
    assert out[:, :2].abs().max() <= w + 1e-5 and out[:, :2].abs().max() > 0.9 * w
    assert out[:, 4].min() >= cos_c - 1e-5 and out[:, 4].max() <= 1.0 + 1e-5
    assert out[:, 2:4].abs().max() <= np.sqrt(1 - cos_c ** 2) + 1e-5
    # the state dict keeps its keys (the bounds come from the config, not the checkpoint)
    plain = _env().build_generator()
    assert set(G.state_dict()) == set(plain.state_dict())
    # default (the paper, opengate): a raw linear output, unbounded
    plain.load_state_dict(G.state_dict())
    with torch.no_grad():
        raw = plain(x)
    assert raw[:, :2].abs().max() > w + 0.1
    inside = ((raw[:, :2].abs() <= w).all(1) & (raw[:, 4] >= cos_c) & (raw[:, 4] <= 1)
              & (raw[:, 2:4].abs() <= 0.69).all(1))
    assert torch.allclose(out[inside], raw[inside], atol=1e-5)


def test_output_bounds_rejects_unknown_values():
    from sagips.config import ConfigError

    with pytest.raises(ConfigError):
        _env(output_bounds="clamp")


def test_energy_bounds_without_reflect_is_an_error():
    from sagips.config import ConfigError

    with pytest.raises(ConfigError, match="output_bounds=reflect"):
        _env(output_bounds="none", energy_bounds=True)


def test_energy_bounds_fold_ekine_into_the_data_range():
    torch.manual_seed(1)
    x = torch.cat([5 * torch.randn(4000, 10), torch.rand(4000, 3)], 1)
    env = _env(output_bounds="reflect", energy_bounds=True)
    e = env.data[:, 5].cpu().numpy()
    G = env.build_generator()
    with torch.no_grad():
        for p in G.model.parameters():
            p.mul_(4.0)
        out = G(x)
    assert out[:, 5].min() >= e.min() - 1e-4 and out[:, 5].max() <= e.max() + 1e-4
    free = _env(output_bounds="reflect").build_generator()  # without energy_bounds EKine stays unbounded
    free.load_state_dict(G.state_dict())
    with torch.no_grad():
        raw = free(x)[:, 5]
    assert raw.min() < e.min() - 0.1 or raw.max() > e.max() + 0.1


def test_onto_unit_sphere_keeps_dz_and_azimuth():
    from sagips_environments.optigan.nets import onto_unit_sphere

    # (dX, dY) = (3, 4) has azimuth (0.6, 0.8); dZ = 0.8 leaves sqrt(1 - 0.64) = 0.6 for the transverse part
    y = torch.tensor([[0.1, -0.2, 3.0, 4.0, 0.8, 2.5],
                      [0.0, 0.0, -0.5, 0.0, 1.0, 1.0]], dtype=torch.float64)
    want = torch.tensor([[0.1, -0.2, 0.36, 0.48, 0.8, 2.5],
                         [0.0, 0.0, -1e-6, 0.0, 1.0, 1.0]], dtype=torch.float64)
    assert torch.allclose(onto_unit_sphere(y), want, atol=1e-5)
    # finite gradients, even at dZ = 1 and at (dX, dY) = 0
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 0.2, -0.1, 0.9, 2.0]], requires_grad=True)
    onto_unit_sphere(x).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_unit_direction_puts_generated_directions_on_the_escape_cone():
    torch.manual_seed(2)
    x = torch.cat([5 * torch.randn(4000, 10), torch.rand(4000, 3)], 1)
    env = _env(output_bounds="reflect", unit_direction=True)
    G = env.build_generator()
    with torch.no_grad():
        for p in G.model.parameters():
            p.mul_(4.0)
        out = G(x)
    cos_c = env.crystal(env.cfg).cos_critical
    assert torch.allclose(out[:, 2:5].norm(dim=1), torch.ones(len(out)), atol=1e-5)
    assert out[:, 4].min() >= cos_c - 1e-5
    assert set(G.state_dict()) == set(_env().build_generator().state_dict())
    # dZ, X, Y and EKine are those of the same weights without the option; only (dX, dY) change, along their azimuth
    free = _env(output_bounds="reflect").build_generator()
    free.load_state_dict(G.state_dict())
    with torch.no_grad():
        ref = free(x)
    keep = [0, 1, 4, 5]
    assert torch.allclose(out[:, keep], ref[:, keep], atol=1e-6)
    cross = out[:, 2] * ref[:, 3] - out[:, 3] * ref[:, 2]
    assert cross.abs().max() < 1e-5 and ((out[:, 2] * ref[:, 2] + out[:, 3] * ref[:, 3]) >= 0).all()
    assert not torch.allclose(out[:, 2:4], ref[:, 2:4], atol=1e-3)  # the option does something
    # the MC's own directions are unit vectors: the constraint is the data's
    d = env.data[:, 2:5]
    assert torch.allclose(d.norm(dim=1), torch.ones(len(d)), atol=1e-5)


def test_unit_direction_without_reflect_is_an_error():
    from sagips.config import ConfigError

    with pytest.raises(ConfigError, match="unit_direction=true needs"):
        _env(output_bounds="none", unit_direction=True)


def test_bounds_penalty_is_the_raw_excess_and_enters_the_generator_loss():
    from sagips.config import ConfigError

    with pytest.raises(ConfigError, match="bounds_penalty=2.0 needs environment.output_bounds=reflect"):
        _env(output_bounds="none", bounds_penalty=2.0)
    on, off = _env(output_bounds="reflect", bounds_penalty=2.0), _env(output_bounds="reflect")
    torch.manual_seed(0)
    G = on.build_generator()
    with torch.no_grad():
        for p in G.model.parameters():  # a wide output: many raw photons outside the face
            p.mul_(3.0)
    D = on.build_discriminator()
    real = on.real_batch()
    on.gen.manual_seed(5)
    fake = on.synthesize(G, real)
    assert G.excess is None  # taken by the environment: no module keeps a graph
    # an independent truth: the raw network (folds off) and the bounds, excess computed here
    from sagips_environments.optigan.env import unfolded

    on.gen.manual_seed(5)
    noise = torch.randn((len(real), on.cfg.noise_dim), generator=on.gen)
    with unfolded(G), torch.no_grad():
        raw = G(torch.cat([noise, real[:, 6:]], 1))
    lo, hi = (torch.as_tensor(b) for b in on.bounds())
    over = torch.clamp(lo - raw, min=0) + torch.clamp(raw - hi, min=0)
    want = ((over / G.out_std) ** 2).sum(1).mean()
    assert float(want) > 0.1
    assert abs(float(on._excess.detach()) - float(want)) < 1e-4 * float(want)
    on.d_loss(D, real, fake)  # g_loss reports the critic step's figures too
    loss_on, extras = on.g_loss(D, real, fake)
    off._last = dict(on._last)
    loss_off, _ = off.g_loss(D, real, fake)
    assert abs(float(loss_on - loss_off) - 2.0 * float(want)) < 1e-3 * float(want)
    assert float(extras["excess"]) == pytest.approx(float(want), rel=1e-4)
    G.zero_grad()
    loss_on.backward()  # the penalty's gradient reaches the generator
    assert float(G.model[0].weight.grad.abs().sum()) > 0


@pytest.mark.parametrize("outside, refused", [(0.05, True), (0.005, False)])
def test_reference_photons_outside_the_bounds_are_refused_in_one_line(outside, refused):
    """Real data whose directions were recorded after the exit face (or in another frame) lie outside the escape cone:
    output_bounds=reflect could never produce them, so a run on them is refused, naming the column and the fix; a
    fraction under 1 % (DATA_OUTSIDE_MAX) passes, and without output_bounds nothing is checked."""
    from sagips.config import ConfigError

    env_cls = get_environment("optigan")
    cfg = from_dict(env_cls.Config, dict(photons_per_point=500, grid_side=2, grid_depths=1, heldout_points=1,
                                         heldout_photons=40, output_bounds="reflect"), "environment.")
    arrays, attrs = env_cls.generate_reference(cfg, 3)
    n = len(arrays["photons"])
    arrays["photons"][: round(outside * n), 4] = 0.5  # dZ below cos(theta_c) = 0.716
    env = env_cls(cfg, "cpu", seed=0)
    if refused:
        with pytest.raises(ConfigError, match=r"environment.output_bounds=reflect: 5.0% of the reference photons lie "
                                              r"outside .*\(dZ 5.0%\).*set environment.output_bounds=none"):
            env.attach_data(arrays, attrs, np.random.default_rng(0))
    else:
        env.attach_data(arrays, attrs, np.random.default_rng(0))
    cfg.output_bounds = "none"
    arrays["photons"][:, 4] = 0.5
    env_cls(cfg, "cpu", seed=0).attach_data(arrays, attrs, np.random.default_rng(0))


def test_data_with_a_condition_per_photon_are_told_why_no_quality_point_has_photons():
    """GATE data read with TrackVertexPosition conditions: every photon its own point, so no point can be split in
    two halves for the JS quality; the one-line error says so and names the fix."""
    from sagips.config import ConfigError

    env_cls = get_environment("optigan")
    cfg = from_dict(env_cls.Config, dict(photons_per_point=50, grid_side=2, grid_depths=1, heldout_points=0),
                    "environment.")
    arrays, attrs = env_cls.generate_reference(cfg, 3)
    arrays = {"photons": arrays["photons"], "conditions": arrays["conditions"] + np.random.default_rng(0).uniform(
        0, 1e-3, arrays["conditions"].shape).astype(np.float32)}
    with pytest.raises(ConfigError, match=r"has 1 photon\(s\); at least 2 .* distinct conditions for 150 photons: a "
                                          r"condition per photon, e.g. from TrackVertexPosition.*FILE.root:x,y,z\)$"):
        env_cls(cfg, "cpu", seed=0).attach_data(arrays, attrs, np.random.default_rng(0))
