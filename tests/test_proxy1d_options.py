"""Proxy 1D tuning knobs: the generator's spread penalty and the output-layer init scale (defaults = the paper)."""
import numpy as np
import torch

from sagips.config import load
from sagips_environments.proxy1d import Proxy1D

SMALL = ["environment.param_samples=8", "environment.events_per_sample=16"]


def make_env(sets=()):
    cfg = load(None, SMALL + list(sets))
    arrays, attrs = Proxy1D.generate_reference(cfg.environment, 0, n_events=2000)
    env = Proxy1D(cfg.environment, "cpu", seed=1)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    return env


class Constant(torch.nn.Module):
    """A generator that ignores its noise: every noise vector gives the same p."""

    def __init__(self):
        super().__init__()
        self.logit = torch.nn.Parameter(torch.zeros(6))

    def forward(self, z):
        return torch.sigmoid(self.logit).expand(len(z), 6)


def test_spread_is_zero_for_a_constant_generator_and_positive_otherwise():
    env = make_env(["environment.spread_weight=10"])
    _, _, unit = env.synthesize(Constant())
    assert float(env.spread(unit)) == 0.0
    torch.manual_seed(0)
    G = env.build_generator()
    _, _, unit = env.synthesize(G)
    assert float(env.spread(unit)) > 1e-4


def test_spread_penalty_enters_the_generator_loss_and_its_gradient_reaches_G():
    torch.manual_seed(0)
    on, off = make_env(["environment.spread_weight=10"]), make_env()
    G, D = on.build_generator(), on.build_discriminator()
    loss_on, extras = on.g_loss(D, None, on.synthesize(G))
    loss_off, extras_off = off.g_loss(D, None, off.synthesize(G))  # same seed: the same noise and events
    assert "spread" not in extras_off  # the default is the paper's loss
    assert float(extras["spread"]) > 0
    assert abs(float(loss_on - loss_off) - float(10 * extras["spread"])) < 1e-5
    # the penalty alone has a gradient on the generator's first layer
    G.zero_grad()
    (on.spread(on.synthesize(G)[2])).backward()
    assert G[0].weight.grad is not None and float(G[0].weight.grad.abs().sum()) > 0


def test_output_layer_init_scale():
    torch.manual_seed(3)
    G1 = make_env().build_generator()
    torch.manual_seed(3)
    G01 = make_env(["environment.g_out_scale=0.1"]).build_generator()
    torch.manual_seed(3)
    G0 = make_env(["environment.g_out_scale=0"]).build_generator()
    assert torch.allclose(G01[-2].weight, 0.1 * G1[-2].weight)
    assert torch.equal(G01[0].weight, G1[0].weight)  # hidden layers keep their Kaiming init
    z = torch.randn(64, 6)
    with torch.no_grad():
        assert torch.allclose(G0(z), torch.full((64, 6), 0.5))  # every noise vector at the middle of the box
        assert G01(z).std(0).max() < G1(z).std(0).max()


def test_g_start_spreads_proxy1ds_starting_points():
    """environment.g_start (the same start_generator as a ParametricEnvironment's): 0 keeps every seed at the box's
    middle (with g_out_scale small), s > 0 starts each seed at its own point of the middle fraction s."""
    def start(seed, g_start):
        torch.manual_seed(seed)
        G = make_env(["environment.g_out_scale=0", f"environment.g_start={g_start}"]).build_generator()
        with torch.no_grad():
            return G(torch.randn(4, 6))[0]

    assert torch.allclose(start(1, 0.0), torch.full((6,), 0.5))
    starts = [start(seed, 0.8) for seed in range(6)]
    assert all(((u > 0.1) & (u < 0.9)).all() for u in starts)
    assert min((x - y).abs().max() for i, x in enumerate(starts) for y in starts[i + 1:]) > 0.01
    assert torch.equal(start(3, 0.8), starts[3])  # the seed decides


def test_critic_width_alone():
    env = make_env(["environment.d_hidden=32"])
    D, G = env.build_discriminator(), env.build_generator()
    assert D[0].out_features == 32 and D[2].in_features == 32
    assert G[0].out_features == 128  # the generator keeps environment.hidden
    # 2*32+32 + 3*(32*32+32) + 32+1 parameters
    assert sum(p.numel() for p in D.parameters()) == 96 + 3 * 1056 + 33


def test_fisher_preconditioner_on_proxy1d():
    """environment.precondition=fisher (sagips/precondition.py, as a ParametricEnvironment's): the events and the
    parameters are unchanged, the gradient that reaches the generator's output is multiplied by M, adapt takes M
    from Proxy1D.fisher at the prediction (unit_inverse_sqrt, checked independently), and M is saved for --resume."""
    from sagips.precondition import unit_inverse_sqrt

    plain, pre = make_env(), make_env(["environment.precondition=fisher"])
    assert plain.preconditioner is None and plain.extra_state() == {}
    torch.manual_seed(0)
    G = pre.build_generator()
    pre.adapt(G)
    width = np.asarray(pre.cfg.param_max) - np.asarray(pre.cfg.param_min)
    p_hat = pre.predict(G, 256).double().numpy()
    m = torch.as_tensor(unit_inverse_sqrt(pre.fisher(p_hat), width), dtype=torch.float32)
    torch.testing.assert_close(pre.preconditioner.m, m)
    assert not torch.allclose(m, torch.eye(6) * m.trace() / 6, atol=1e-2)  # the valleys make it far from a scale
    outs = []

    def keep(module, inputs, out):  # the generator's output u, with its gradient (returns None: output unchanged)
        out.retain_grad()
        outs.append(out)

    G.register_forward_hook(keep)
    w = torch.linspace(-1.0, 1.0, 6)
    for env in (plain, pre):
        env.gen.manual_seed(5)
        (env.params(G, 4) * w).sum().backward()
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1].grad, outs[0].grad @ m)
    other = make_env(["environment.precondition=fisher"])
    other.load_extra_state(pre.extra_state())
    assert torch.equal(other.preconditioner.m, pre.preconditioner.m)
