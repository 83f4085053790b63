"""A ParametricEnvironment's critic sees standardised events (sagips.models.ScaledInput, critic_scale: the mean and
spread of the reference events the rank holds; before any are attached, the support's middle and half-width) and
starts with its first layer's kinks at those events (sagips.models.kinks_at). A critic fed raw events with every
kink at 0 sits at chance for hundreds of steps on a user's peak at 5 on [0, 10]; the environment's critic learns at
once (docs/environments.md, "What the base class supplies")."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sagips.config import from_dict
from sagips.models import ScaledInput, kinks_at, mlp
from sagips.parametric import ParametricEnvironment


class Peak(ParametricEnvironment):
    name = "peak_critic_test"
    parameters = {"mu": (4.0, 6.0)}
    true_params = {"mu": 5.0}
    support = (0.0, 10.0)

    def density(self, p, x):
        return torch.exp(-0.5 * ((x - p[:, :1]) / 0.5) ** 2)


class Free(ParametricEnvironment):  # a simulator without a support: its events are not clipped
    name = "free_critic_test"
    parameters = {"a": (1.0, 3.0)}
    true_params = {"a": 2.0}
    event_width = 2

    def simulate(self, p, u):
        return torch.stack((p[:, None, 0] * 10 + u[..., 0], u[..., 1] - 3), dim=-1)


def make(cls):
    cfg = from_dict(cls.Config, {"hidden": 16, "layers": 2}, "environment.")
    cfg.name = cls.name
    return cls(cfg, "cpu", 0)


def test_scaled_input_is_the_net_on_standardised_input_with_the_nets_keys():
    torch.manual_seed(0)
    net = mlp(2, 1, 8, 2)
    keys = list(net.state_dict())
    scaled = ScaledInput(net, [1.0, -2.0], [4.0, 0.5])
    x = torch.randn(5, 2) * 3
    torch.testing.assert_close(scaled(x), net((x - torch.tensor([1.0, -2.0])) / torch.tensor([4.0, 0.5])))
    assert list(scaled.state_dict()) == keys  # shift and scale are not saved: a state loads as before


def test_the_scale_comes_from_the_support_or_from_the_data():
    peak = make(Peak)
    assert peak.critic_scale() == ([5.0], [5.0])  # no events yet: the support's middle and half-width
    assert isinstance(peak.build_discriminator(), ScaledInput)
    x = np.random.default_rng(0).normal(2.0, 0.5, (5000, 1)).astype(np.float32)  # events in a corner of [0, 10]
    peak.attach_subset({"events": x}, {})
    (shift,), (scale,) = peak.critic_scale()  # where the events are, not the support's middle (smear1d's lesson)
    assert shift == pytest.approx(float(x.mean()), rel=1e-5) and scale == pytest.approx(float(x.std(ddof=1)), rel=1e-4)
    D = peak.build_discriminator()
    assert D.shift.item() == pytest.approx(shift) and D.scale.item() == pytest.approx(scale)
    free = make(Free)
    assert free.critic_scale() == ([0.0, 0.0], [1.0, 1.0])  # no events attached yet: unchanged
    events = np.stack((np.random.default_rng(1).normal(20.0, 3.0, 4000), np.full(4000, 7.0)), axis=1)
    free.attach_subset({"events": events.astype(np.float32)}, {})
    shift, scale = free.critic_scale()
    assert shift == pytest.approx([events[:, 0].mean(), 7.0], rel=1e-5)
    assert scale == pytest.approx([events[:, 0].std(ddof=1), 1.0], rel=1e-4)  # a constant column: scale 1


def sample(p, n, gen):
    """A peak of fraction f at mu (width s) on an exponential background of slope lam, on [0, 10]."""
    f, mu, s, lam = p
    g = torch.randn(n, generator=gen) * s + mu
    e = -torch.log(1 - torch.rand(n, generator=gen) * (1 - math.exp(-10 * lam))) / lam
    x = torch.where(torch.rand(n, generator=gen) < f, g, e)
    return x[(x >= 0) & (x <= 10)][:, None]


def critic_loss_after(D, steps=300):
    gen = torch.Generator().manual_seed(2)
    opt = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.99))
    for _ in range(steps):
        real, fake = sample((0.2, 5.0, 0.5, 0.4), 2048, gen), sample((0.35, 4.5, 0.3, 0.5), 2048, gen)
        logits = D(torch.cat((real, fake)))
        target = torch.cat((torch.ones(len(real), 1), torch.zeros(len(fake), 1)))
        loss = 2 * torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def test_kinks_at_reference_events():
    torch.manual_seed(0)
    net = mlp(1, 1, 8, 2)
    kinks_at(net, torch.linspace(0.0, 10.0, 1001)[:, None])
    torch.testing.assert_close(-net[0].bias / net[0].weight[:, 0], (torch.arange(8.0) + 0.5) * 10 / 8)  # quantiles
    pts = torch.randn(500, 2)
    wide = kinks_at(mlp(2, 1, 16, 2), pts)
    w, b = wide[0].weight, wide[0].bias  # each unit's kink passes through one of the points
    on = ((pts @ w.T + b).abs() < 1e-5).any(dim=0)
    assert bool(on.all())


def test_a_critic_on_the_reference_events_learns_where_raw_events_leave_it_at_chance():
    """The environment's critic (standardised, kinks at its reference events) against the same network on raw
    events, kinks at 0: a fresh critic, a user's peak on a background against the false mode a run sat in."""
    env = make(Peak)
    env.cfg.hidden, env.cfg.layers = 64, 3
    env.attach_subset({"events": sample((0.2, 5.0, 0.5, 0.4), 100_000, torch.Generator().manual_seed(4)).numpy()}, {})
    torch.manual_seed(3)
    scaled = env.build_discriminator()
    torch.manual_seed(3)
    raw = mlp(1, 1, 64, 3)  # the same weights, without the standardisation
    chance = 2 * math.log(2)
    assert critic_loss_after(raw) > chance - 0.01
    assert critic_loss_after(scaled) < chance - 0.05


def proxy1d(**kw):
    from sagips_environments.proxy1d import Proxy1D
    cfg = from_dict(Proxy1D.Config, {"grid_points": 200, "d_hidden": 16, "layers": 2, **kw}, "environment.")
    env = Proxy1D(cfg, "cpu", 0)
    arrays, attrs = Proxy1D.generate_reference(cfg, seed=1, n_events=20_000)
    env.attach_subset(arrays, attrs)
    return env, arrays["events"]


@pytest.mark.parametrize("d_input", ["x", "log"])
def test_proxy1d_critic_on_the_data_scale(d_input):
    """environment.d_scale=data: proxy1d's critic standardised by the rank's events (seen through d_input), its
    kinks at them; d_scale=none is the paper's bare network."""
    torch.manual_seed(0)
    env, x = proxy1d(d_input=d_input, d_scale="data")
    D = env.build_discriminator()
    view = np.log(x.astype(np.float64)) if d_input == "log" else x.astype(np.float64)
    assert D.shift.tolist() == pytest.approx(view.mean(0).tolist(), rel=1e-6)
    assert D.scale.tolist() == pytest.approx(view.std(0, ddof=1).tolist(), rel=1e-5)
    pts = (torch.as_tensor(view, dtype=torch.float32) - D.shift) / D.scale
    on = ((pts @ D[0].weight.T + D[0].bias).abs() < 1e-4).any(dim=0)
    assert bool(on.all())  # every first-layer kink passes through one of the events
    torch.manual_seed(0)
    plain = proxy1d(d_input=d_input)[0].build_discriminator()
    assert type(plain) is torch.nn.Sequential and list(plain.state_dict()) == list(D.state_dict())
    assert (plain[0].bias == 0).all()  # the paper's start: every kink at the origin, below the events (x >= 0.1)


def test_the_scale_of_many_events_comes_from_every_kth_row():
    """Past SCALE_ROWS rows, a strided view sets the scale (no float64 copy of a rank's hundreds of millions of
    events); up to it, every row does."""
    from sagips.models import SCALE_ROWS, event_scale
    x = torch.from_numpy(np.random.default_rng(5).exponential(2.0, (2 * SCALE_ROWS + 7, 1)).astype(np.float32))
    shift, scale = event_scale(x)
    every_2nd = x[::2].double()
    assert shift == pytest.approx([every_2nd.mean().item()], rel=1e-9)
    assert scale == pytest.approx([every_2nd.std().item()], rel=1e-9)
    few = x[:1000]
    assert event_scale(few) == (pytest.approx([few.double().mean().item()]), pytest.approx([few.double().std().item()]))
