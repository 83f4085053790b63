"""Network sizes are the paper's (Table III) and the Kaiming init really runs."""
import math

import torch

from sagips.comm.buffer import GradBuffer
from sagips.models import mlp, n_params
from sagips_environments.proxy1d import Proxy1D, Proxy1DConfig


def test_paper_parameter_counts():
    env = Proxy1D(Proxy1DConfig(), "cpu", seed=0)
    assert n_params(env.build_generator()) == 51_206
    assert n_params(env.build_discriminator()) == 50_049


def test_generator_output_in_unit_box():
    env = Proxy1D(Proxy1DConfig(), "cpu", seed=0)
    out = env.build_generator()(torch.randn(256, 6))
    assert out.shape == (256, 6) and bool(((out >= 0) & (out <= 1)).all())


def test_kaiming_normal_init_applied():
    torch.manual_seed(0)
    net = mlp(128, 1, hidden=512, layers=2)
    w = net[2].weight  # 512 x 512 hidden layer
    expected = math.sqrt(2.0 / (1 + 0.2**2)) / math.sqrt(512)
    assert abs(w.std().item() / expected - 1) < 0.02
    assert torch.count_nonzero(net[0].bias) == 0
    # PyTorch's default (kaiming_uniform with a=sqrt(5)) would give a std ~ 1/sqrt(3 fan_in): clearly different
    assert abs(w.std().item() - 1 / math.sqrt(3 * 512)) > 0.3 * expected


def test_grad_buffer_fuses_weight_gradients_in_place():
    env = Proxy1D(Proxy1DConfig(), "cpu", seed=0)
    G = env.build_generator()
    buf = GradBuffer(G, exchange_bias=False)
    weights = sum(p.numel() for p in G.parameters() if p.ndim > 1)
    assert buf.n == weights == 50_688
    assert GradBuffer(env.build_generator(), exchange_bias=True).n == 51_206
    ptr = buf.array.ctypes.data
    for _ in range(2):  # backward accumulates into the views; no new storage appears
        buf.zero_()
        G(torch.randn(64, 6)).pow(2).sum().backward()
        assert buf.check_views()
    assert buf.array.ctypes.data == ptr
    w0 = G[0].weight
    # the exchanged array is the weights' gradient itself: editing it edits .grad (zero-copy on CPU)
    buf.array[:] = 0.0
    assert torch.count_nonzero(w0.grad) == 0
    assert torch.count_nonzero(G[0].bias.grad) > 0  # biases are outside the exchanged prefix
