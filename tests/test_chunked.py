"""Row-chunked critic passes (sagips/chunked.py) give the unchunked loss and gradients, in every place they are used."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sagips.chunked import auto_chunk_rows, chunked_loss
from sagips.models import mlp


def _grads(params):
    return torch.cat([p.grad.flatten() for p in params])


def _close(a, b, rtol=1e-4):
    """Equal up to float32 summation order: max |a - b| small against max |b|."""
    return float((a - b).abs().max()) <= rtol * float(b.abs().max()) + 1e-7


@pytest.mark.parametrize("chunk", [1, 7, 64, 100, 299, 300, 1000])
def test_chunked_equals_one_pass(chunk):
    torch.manual_seed(0)
    D = mlp(2, 1, hidden=16, layers=3)
    x = torch.randn(300, 2, requires_grad=True)
    t = (torch.rand(300, 1) > 0.5).float()
    n = len(x)

    def fn(xs, ts):
        return F.binary_cross_entropy_with_logits(D(xs), ts, reduction="sum") / n

    ref = F.binary_cross_entropy_with_logits(D(x), t)
    ref.backward()
    g_ref, gx_ref = _grads(D.parameters()).clone(), x.grad.clone()
    D.zero_grad(set_to_none=True)
    x.grad = None
    loss = chunked_loss(fn, (x, t), D.parameters(), chunk)
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-5
    (loss * 8.0).backward()  # a loss scale (GradScaler) multiplies every gradient
    assert _close(_grads(D.parameters()), 8.0 * g_ref)
    assert _close(x.grad, 8.0 * gx_ref)


def test_frozen_parameters_get_no_gradient_and_inputs_do():
    torch.manual_seed(1)
    D = mlp(3, 1, hidden=8, layers=2).requires_grad_(False)
    src = torch.randn(50, 3, requires_grad=True)
    x = src * 2.0  # a non-leaf input: the gradient must flow on to src
    loss = chunked_loss(lambda xs: D(xs).sum(), (x,), D.parameters(), 16)
    loss.backward()
    assert all(p.grad is None for p in D.parameters())
    s2 = src.detach().clone().requires_grad_()
    D(s2 * 2.0).sum().backward()
    assert _close(src.grad, s2.grad)


def test_no_grad_mode_and_bad_shapes():
    D = mlp(2, 1, hidden=8, layers=2)
    x = torch.randn(40, 2)
    with torch.no_grad():
        assert torch.allclose(chunked_loss(lambda a: D(a).sum(), (x,), D.parameters(), 8), D(x).sum())
    with pytest.raises(ValueError, match="row counts"):
        chunked_loss(lambda a, b: a.sum(), (x, torch.zeros(39, 1)), D.parameters(), 8)


def test_chunked_under_bf16_autocast_runs_the_forward_in_bf16():
    torch.manual_seed(2)
    D = mlp(2, 1, hidden=32, layers=2)
    x = torch.randn(256, 2)
    seen = []
    D[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunked_loss(lambda a: D(a).float().sum() / 256, (x,), D.parameters(), 64)
    loss.backward()
    assert set(seen) == {torch.bfloat16} and len(seen) == 4
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in D.parameters())


def test_auto_chunk_rows():
    D = mlp(2, 1, hidden=128, layers=4)  # 513 activations per row
    rows = auto_chunk_rows(-1, torch.device("cpu"), D)
    assert rows & (rows - 1) == 0 and 0.7 < rows * 513 * 4 / (8 << 20) < 1.42  # a power of two near 8 MiB
    assert auto_chunk_rows(-1, torch.device("cpu"), D, threads=2) == 2 * rows
    assert auto_chunk_rows(-1, torch.device("cpu"), D, elem_bytes=2) == 2 * rows
    assert auto_chunk_rows(-1, torch.device("cpu"), mlp(2, 1, hidden=4096, layers=8)) == 256
    assert auto_chunk_rows(-1, torch.device("cuda", 0), D) == 0
    assert auto_chunk_rows(0, torch.device("cpu"), D) == 0
    assert auto_chunk_rows(1000, torch.device("cpu"), D) == 1000


def _proxy(param_samples=64, events=50):
    from sagips.config import load
    from sagips_environments.proxy1d import Proxy1D

    cfg = load(None, [f"environment.param_samples={param_samples}", f"environment.events_per_sample={events}",
                      "environment.reference_events=20000"])
    arrays, attrs = Proxy1D.generate_reference(cfg.environment, 1)
    env = Proxy1D(cfg.environment, "cpu", seed=3)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    return env


def test_proxy1d_losses_chunked_equal_unchunked():
    env = _proxy()
    torch.manual_seed(4)
    G, D = env.build_generator(), env.build_discriminator()
    real = env.real_batch()
    fake = env.synthesize(G, real)
    out = {}
    for chunk in (0, 512):
        env.chunk_rows = chunk
        D.zero_grad(set_to_none=True)
        G.zero_grad(set_to_none=True)
        loss_d = env.d_loss(D, real, tuple(f.detach() for f in fake))
        loss_d.backward()
        g_d = _grads(D.parameters()).clone()
        D.requires_grad_(False)
        loss_g, _ = env.g_loss(D, real, fake)
        loss_g.backward(retain_graph=True)
        D.requires_grad_(True)
        out[chunk] = (float(loss_d), float(loss_g), g_d, _grads(G.parameters()).clone())
    assert abs(out[0][0] - out[512][0]) < 1e-5 and abs(out[0][1] - out[512][1]) < 1e-5
    assert _close(out[512][2], out[0][2]) and _close(out[512][3], out[0][3])
    assert float(out[0][2].abs().max()) > 0 and float(out[0][3].abs().max()) > 0


def test_optigan_losses_chunked_equal_unchunked():
    from sagips.config import load
    from sagips_environments.optigan import OptiGAN
    from sagips_environments.optigan.mc import simulate_points

    cfg = load(None, ["environment.name=optigan", "environment.batch_size=600", "environment.quality_points=2"])
    env = OptiGAN(cfg.environment, "cpu", seed=5)
    ph, co, _ = simulate_points(OptiGAN.crystal(cfg.environment), np.array([[0.0, 0.0, 1.0], [0.5, 0.2, 2.0]]),
                                400, [5, 1])
    env.attach_data({"photons": ph, "conditions": co}, {}, np.random.default_rng(0))
    torch.manual_seed(6)
    G, D = env.build_generator(), env.build_discriminator()
    out = {}
    for chunk in (0, 128):
        env.chunk_rows = chunk
        env.gen.manual_seed(7)  # the same batch, noise and interpolation weights for both
        real = env.real_batch()
        fake = env.synthesize(G, real)
        D.zero_grad(set_to_none=True)
        G.zero_grad(set_to_none=True)
        loss_d = env.d_loss(D, real, fake.detach())
        loss_d.backward()
        logged = dict(env._last)
        g_d = _grads(D.parameters()).clone()
        D.requires_grad_(False)
        loss_g, _ = env.g_loss(D, real, fake)
        loss_g.backward()
        D.requires_grad_(True)
        out[chunk] = (float(loss_d), float(loss_g), g_d, _grads(G.parameters()).clone(), logged)
    a, b = out[0], out[128]
    assert abs(a[0] - b[0]) < 1e-4 and abs(a[1] - b[1]) < 1e-5
    assert _close(b[2], a[2]) and _close(b[3], a[3])
    assert float(a[4]["gp"]) > 0
    for k in ("w_dist", "gp"):
        assert abs(float(a[4][k]) - float(b[4][k])) < 1e-4
    # the logged parts add up to the loss: gp - w_dist
    assert abs(float(b[4]["gp"] - b[4]["w_dist"]) - b[0]) < 1e-4
