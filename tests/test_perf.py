"""FLOP counting, the matmul references, and the fast paths of the epoch loop compute what the plain ones did."""
import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sagips.config import load
from sagips.models import mlp
from sagips.perf import matmul_peak, matmul_rate, n_params, retain_freed_memory, train_flops
from sagips.trainer import Trainer
from sagips_environments.proxy1d import Proxy1D

SMALL = ["environment.param_samples=8", "environment.events_per_sample=16", "train.progress=false"]


def make_trainer(tmp_path, sets=()):
    cfg = load(None, SMALL + list(sets))
    arrays, attrs = Proxy1D.generate_reference(cfg.environment, 0, n_events=2000)
    env = Proxy1D(cfg.environment, "cpu", seed=1)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    return Trainer(cfg, env, 0, 1, str(tmp_path), is_root=False)


def test_train_flops_is_six_phi_rows_with_the_papers_parameter_counts(tmp_path):
    env = make_trainer(tmp_path).env
    phi_d, phi_g = n_params(env.build_discriminator()), n_params(env.build_generator())
    assert (phi_d, phi_g) == (50_049, 51_206)  # SAGIPS Table III networks
    assert train_flops(phi_d, 2 * 102_400) == 6 * 50_049 * 204_800 == 61_500_211_200
    assert train_flops(phi_g, 1024) == 6 * 51_206 * 1024


def test_matmul_references_are_positive_and_finite():
    for rate in (matmul_peak("cpu", torch.float32, n=256, min_seconds=0.02),
                 matmul_rate(1000, 128, 128, "cpu", torch.bfloat16, min_seconds=0.02)):
        assert rate > 0 and math.isfinite(rate)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_retain_freed_memory_applies_on_linux():
    assert retain_freed_memory() is True


def test_inplace_activations_give_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    fast, plain = mlp(2, 1), mlp(2, 1, inplace=False)
    plain.load_state_dict(fast.state_dict())
    assert fast[1].inplace and not plain[1].inplace
    x = torch.randn(300, 2, requires_grad=True)
    outs, grads = [], []
    for net in (fast, plain):
        x.grad = None
        y = net(x)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([x.grad.clone()] + [p.grad.clone() for p in net.parameters()])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("loss", ["bce", "mse"])
def test_one_critic_forward_on_real_and_fake_equals_two(tmp_path, loss):
    tr = make_trainer(tmp_path, [f"environment.loss={loss}", "environment.d_input=log"])
    env, D = tr.env, tr.D
    real = env.real_batch()
    with torch.no_grad():
        fake = env.synthesize(tr.G, real)
    fused = env.d_loss(D, real, fake)
    fused.backward()
    g_fused = [p.grad.clone() for p in D.parameters()]
    D.zero_grad(set_to_none=True)
    adv = F.binary_cross_entropy_with_logits if loss == "bce" else F.mse_loss
    n = len(real)
    two = (adv(D(torch.log(real)), torch.ones(n, 1)) + adv(D(torch.log(fake[0])), torch.zeros(n, 1)))
    two.backward()
    torch.testing.assert_close(fused, two, rtol=1e-6, atol=1e-7)
    for a, p in zip(g_fused, D.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-7)


def test_frozen_critic_weights_leave_the_generator_gradients_unchanged(tmp_path):
    tr = make_trainer(tmp_path)
    env, G, D = tr.env, tr.G, tr.D
    state = env.gen.get_state()
    grads = []
    for freeze in (False, True):
        env.gen.set_state(state)
        G.zero_grad(set_to_none=True)
        D.zero_grad(set_to_none=True)
        D.requires_grad_(not freeze)
        loss, _ = env.g_loss(D, env.real_batch(), env.synthesize(G, None))
        D.requires_grad_(True)
        loss.backward()
        grads.append([p.grad.clone() for p in G.parameters()])
        assert all((p.grad is None) == freeze for p in D.parameters())
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_step_restores_the_critics_trainable_weights(tmp_path):
    tr = make_trainer(tmp_path)
    frozen = tr.D[0].bias
    frozen.requires_grad_(False)  # a weight frozen on purpose stays frozen
    tr.step(1)
    assert all(p.requires_grad for p in tr.D.parameters() if p is not frozen) and not frozen.requires_grad
    assert all(p.grad is not None for p in tr.D.parameters() if p is not frozen)  # the critic step's gradients
