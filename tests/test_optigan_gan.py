"""optiGAN's pieces: the registry entry, opengate's network layout, the gradient penalty, the JS metric."""
import numpy as np
import pytest
import torch

from sagips.comm.buffer import GradBuffer
from sagips.environment import Environment, get_environment
from sagips_environments.optigan.js import feature_similarities, js_distance, similarity
from sagips_environments.optigan.nets import gradient_penalty


@pytest.fixture(scope="module")
def env_cls():
    return get_environment("optigan")


def _cfg(env_cls, **kw):
    from sagips.config import from_dict

    return from_dict(env_cls.Config, kw, "environment.")


def test_registered_like_a_third_party_environment(env_cls):
    assert issubclass(env_cls, Environment) and env_cls.name == "optigan"
    assert env_cls.datasets == {"photons": 6, "conditions": 3}
    env = env_cls(_cfg(env_cls), "cpu", seed=0)
    assert env.n_critic == 3 and env.events_per_epoch == 250_000  # the paper's settings are the defaults


def test_networks_have_opengates_layout(env_cls):
    env = env_cls(_cfg(env_cls), "cpu", seed=0)
    G, D = env.build_generator(), env.build_discriminator()
    g = {k: tuple(v.shape) for k, v in G.model.state_dict().items()}
    assert g == {"0.weight": (128, 13), "0.bias": (128,), "2.weight": (256, 128), "2.bias": (256,),
                 "4.weight": (512, 256), "4.bias": (512,), "6.weight": (6, 512), "6.bias": (6,)}
    assert [type(m).__name__ for m in G.model] == ["Linear", "ReLU"] * 3 + ["Linear"]
    d = {k: tuple(v.shape) for k, v in D.model.state_dict().items()}
    assert d == {"0.weight": (512, 9), "0.bias": (512,), "3.weight": (256, 512), "3.bias": (256,),
                 "6.weight": (128, 256), "6.bias": (128,), "8.weight": (1, 128), "8.bias": (1,)}
    assert isinstance(D.model[1], torch.nn.LeakyReLU) and D.model[1].negative_slope == 0.2
    assert isinstance(D.model[2], torch.nn.Dropout)
    # standardisation lives in buffers: not exchanged, not optimised, but saved with the state dict
    assert GradBuffer(G).n == sum(p.numel() for n, p in G.named_parameters() if p.ndim > 1)
    assert {"cond_mean", "cond_std", "out_mean", "out_std"} <= set(G.state_dict())
    out = G(torch.cat([torch.randn(5, 10), torch.rand(5, 3)], 1))
    assert out.shape == (5, 6) and D(torch.cat([out, torch.rand(5, 3)], 1)).shape == (5, 1)


def test_gradient_penalty_of_a_linear_critic():
    """D(x) = w . x + b has gradient w everywhere: GP = lam (|w| - 1)^2, whatever the samples."""
    torch.manual_seed(0)
    for w_norm in (0.3, 1.0, 2.5):
        critic = torch.nn.Linear(6, 1)
        with torch.no_grad():
            w = torch.randn(1, 6)
            critic.weight.copy_(w / w.norm() * w_norm)
        real, fake = torch.randn(64, 6), torch.randn(64, 6) * 3 + 1
        gp = gradient_penalty(critic, real, fake, lam=10.0)
        assert gp.item() == pytest.approx(10.0 * (w_norm - 1) ** 2, abs=1e-5)
    # conditional: only the photon part of the gradient counts; scale measures it in standardised units
    critic = torch.nn.Linear(9, 1, bias=False)
    with torch.no_grad():
        critic.weight.copy_(torch.tensor([[0.5, 0, 0, 0, 0, 0, 7, 7, 7]]))
    cond = torch.randn(32, 3)
    gp = gradient_penalty(critic, torch.randn(32, 6), torch.randn(32, 6), 10.0, cond=cond)
    assert gp.item() == pytest.approx(10.0 * 0.25, abs=1e-6)
    scale = torch.tensor([4.0, 1, 1, 1, 1, 1])
    gp = gradient_penalty(critic, torch.randn(32, 6), torch.randn(32, 6), 10.0, cond=cond, scale=scale)
    assert gp.item() == pytest.approx(10.0 * (2.0 - 1) ** 2, abs=1e-5)
    # the penalty is differentiable w.r.t. the critic (it trains the critic)
    gp.backward()
    assert critic.weight.grad is not None and critic.weight.grad[0, 0] != 0


def test_js_similarity_identical_disjoint_and_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2000, 6))
    assert feature_similarities(a, a).tolist() == [100.0] * 6
    assert similarity([a, a[:500]], [a, a[:500]])["mean"] == 100.0
    disjoint = similarity([a + 100.0], [a])  # all mass in the overflow bin, none of the reference's there
    assert disjoint["mean"] == pytest.approx(0.0, abs=1e-9)
    assert similarity([a - 100.0], [a])["mean"] == pytest.approx(0.0, abs=1e-9)
    scipy_distance = pytest.importorskip("scipy.spatial.distance")
    p, q = rng.uniform(size=20), rng.uniform(size=20)
    p[3] = 0.0
    assert js_distance(p, q) == pytest.approx(scipy_distance.jensenshannon(p, q, base=2), abs=1e-12)
    # two samples of one distribution: high but below 100 (the reason the ceiling is reported)
    b = rng.normal(size=(2000, 6))
    s = similarity([b], [a], bins=50)["mean"]
    assert 85.0 < s < 99.0


def test_quality_reports_the_ceiling(env_cls):
    cfg = _cfg(env_cls, photons_per_point=40, grid_side=2, grid_depths=1, heldout_points=2, heldout_photons=400,
               quality_photons=100, js_bins=20, batch_size=16)
    arrays, attrs = env_cls.generate_reference(cfg, 3)
    assert arrays["heldout_photons"].shape == (800, 6)
    env = env_cls(cfg, "cpu", seed=0)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    q = env.quality(env.build_generator())
    assert q["quality_set"] == "heldout" and q["quality_points"] == 2
    assert 60.0 < q["js_ceiling"] < 100.0 and 0.0 <= q["js"] < q["js_ceiling"]
    assert q["js_gap"] == pytest.approx(q["js_ceiling"] - q["js"])
    assert set(q["js_features"]) == {"X", "Y", "dX", "dY", "dZ", "EKine"}
    both = env.combine_quality([q, dict(q, js=q["js"] + 2.0)])
    assert both["js"] == pytest.approx(q["js"] + 1.0) and both["rank_js"] == [q["js"], q["js"] + 2.0]
    assert "ceiling" in env.summary_table(q)


def test_gradient_penalty_stays_float32_under_autocast():
    critic = torch.nn.Linear(6, 1)
    with torch.no_grad():
        critic.weight.fill_(1.0)  # |w| = sqrt(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gp = gradient_penalty(critic, torch.randn(16, 6), torch.randn(16, 6), 10.0)
    assert gp.dtype == torch.float32 and gp.item() == pytest.approx(10.0 * (6**0.5 - 1) ** 2, rel=1e-6)


def test_config_names_a_missing_file(env_cls, tmp_path):
    from sagips.config import ConfigError

    with pytest.raises(ConfigError, match="environment.heldout_file"):
        _cfg(env_cls, heldout_file=str(tmp_path / "nope.h5"))
