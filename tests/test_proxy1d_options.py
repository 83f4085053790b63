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


def test_critic_width_alone():
    env = make_env(["environment.d_hidden=32"])
    D, G = env.build_discriminator(), env.build_generator()
    assert D[0].out_features == 32 and D[2].in_features == 32
    assert G[0].out_features == 128  # the generator keeps environment.hidden
    # 2*32+32 + 3*(32*32+32) + 32+1 parameters
    assert sum(p.numel() for p in D.parameters()) == 96 + 3 * 1056 + 33
