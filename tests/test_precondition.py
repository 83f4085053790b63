"""environment.precondition=fisher (sagips/precondition.py): the generator's gradient times I^(-1/2).

The matrix against scipy's matrix square root of benchmarks/toy1d.fisher (an independent numpy quadrature); the
backward pass against the chain rule written here; the forward pass unchanged; the refresh at the prediction; a
singular information keeps the last matrix; no host read in a non-log epoch; a resumed run is bit-identical (in
tests/test_toy1d_e2e.py)."""
import sys

import numpy as np
import pytest
import torch
from scipy import linalg

from benchmarks import toy1d
from sagips.config import from_dict
from sagips.precondition import FisherPreconditioner, unit_inverse_sqrt
from tests._plugins import SMEAR_SRC, TOY_SRC, add_to_sys_path, toy_site

WIDTH = np.array([2.5, 2.0, 1.9])  # toy1d's box: a in [0.5, 3], b in [-1, 1], c in [0.1, 2]


@pytest.fixture(scope="module")
def classes():
    sys.path[:0] = [str(TOY_SRC), str(SMEAR_SRC)]
    try:
        from sagips_smear1d import Smear1D
        from sagips_toy1d import Toy1D
    finally:
        del sys.path[:2]
    return Toy1D, Smear1D


def toy(classes, precondition="fisher", seed=0):
    Toy1D = classes[0]
    return Toy1D(from_dict(Toy1D.Config, {"precondition": precondition}, "environment."), "cpu", seed)


def expected(p):
    """I_u^(-1/2) by scipy's sqrtm of the independent Fisher matrix, scaled to trace 3."""
    info = toy1d.fisher(np.asarray(p)) * WIDTH[:, None] * WIDTH[None, :]
    m = np.linalg.inv(np.real(linalg.sqrtm(info)))
    return m * 3 / np.trace(m)


@pytest.mark.parametrize("p", [[1.7, -0.4, 0.9], [2.5, -0.637, 1.028], [0.8, 0.5, 1.8]])
def test_the_matrix_whitens_the_independent_fisher_information(p):
    m = unit_inverse_sqrt(toy1d.fisher(np.asarray(p)), WIDTH)
    np.testing.assert_allclose(m, expected(p), rtol=1e-6, atol=1e-9)
    info = toy1d.fisher(np.asarray(p)) * WIDTH[:, None] * WIDTH[None, :]
    white = m @ info @ m
    np.testing.assert_allclose(white / white[0, 0], np.eye(3), atol=1e-6)  # the score's noise: the same everywhere


def test_a_nearly_unconstrained_direction_gets_at_most_1000x_the_step():
    from sagips.precondition import MAX_CONDITION

    rot = np.array([[0.6, 0.8], [-0.8, 0.6]])
    m = unit_inverse_sqrt(rot @ np.diag([1.0, 1e-9]) @ rot.T, [1.0, 1.0])
    w = np.linalg.eigvalsh(m)
    np.testing.assert_allclose(w[1] / w[0], MAX_CONDITION ** 0.5, rtol=1e-6)
    m = unit_inverse_sqrt(rot @ np.diag([1.0, 1e-4]) @ rot.T, [1.0, 1.0])  # below the cap: whitened in full
    np.testing.assert_allclose(np.linalg.eigvalsh(m)[::-1] / np.linalg.eigvalsh(m)[0], [100.0, 1.0], rtol=1e-6)


def test_a_density_that_fails_in_float64_stops_with_one_line():
    from sagips import ParametricEnvironment
    from sagips.environment import EnvironmentCheckError

    def density(self, p, x):
        if x.dtype != torch.float32:
            raise TypeError("this density is written for float32 only")
        return 1 + p[:, :1] * x

    cls = type("test_pc_f32", (ParametricEnvironment,), {"name": "test_pc_f32", "parameters": {"a": (0.1, 1.0)},
                                                        "true_params": {"a": 0.5}, "density": density})
    env = cls(from_dict(cls.Config, {}, "environment."), "cpu", 0)
    torch.manual_seed(0)
    with pytest.raises(EnvironmentCheckError, match=r"^density: the Fisher preconditioner .* float32 only\); make it "
                                                    r"work for any device and dtype, or set environment.precondition="
                                                    r"none$"):
        env.adapt(env.build_generator())


def test_singular_or_broken_information_keeps_the_last_matrix():
    pc = FisherPreconditioner(2, "cpu")
    assert pc.refresh(np.diag([4.0, 1.0]), [1.0, 1.0])
    np.testing.assert_allclose(pc.m.numpy(), np.diag([2 / 3, 4 / 3]), rtol=1e-6)  # diag(1/2, 1) scaled to trace 2
    before = pc.m.clone()
    for bad in (np.ones((2, 2)), np.full((2, 2), np.nan), np.diag([1.0, -1.0]), None):
        assert not pc.refresh(bad, [1.0, 1.0])
        assert torch.equal(pc.m, before)


def test_forward_is_unchanged_and_backward_is_the_gradient_times_m(classes):
    plain, pre = toy(classes, "none", seed=3), toy(classes, "fisher", seed=3)
    torch.manual_seed(0)
    G = plain.build_generator()
    m = torch.tensor([[2.0, 0.3, -0.1], [0.3, 0.5, 0.2], [-0.1, 0.2, 0.5]])
    pre.preconditioner.m.copy_(m)
    outs = []

    def keep(module, inputs, out):  # the generator's output u, with its gradient
        out.retain_grad()
        outs.append(out)

    G.register_forward_hook(keep)
    w = torch.tensor([0.7, -1.3, 0.4])
    for env in (plain, pre):
        p = env.params(G, 5)
        (p * w).sum().backward()
    assert torch.equal(outs[0], outs[1]) and plain.preconditioner is None
    dp_du = torch.tensor(WIDTH, dtype=torch.float32)  # p = low + width * u
    torch.testing.assert_close(outs[0].grad, (w * dp_du).expand(5, 3))
    torch.testing.assert_close(outs[1].grad, ((w * dp_du) @ m).expand(5, 3))


def test_adapt_refreshes_at_the_prediction_and_resume_state_round_trips(classes):
    env = toy(classes)
    torch.manual_seed(1)
    G = env.build_generator()
    assert torch.equal(env.preconditioner.m, torch.eye(3))
    env.adapt(G)
    np.testing.assert_allclose(env.preconditioner.m.numpy(), expected(env.predict(G, 256)), rtol=2e-4, atol=1e-6)
    other = toy(classes)
    other.load_extra_state(env.extra_state())
    assert torch.equal(other.preconditioner.m, env.preconditioner.m)
    assert toy(classes, "none").extra_state() == {}
    from sagips.config import ConfigError

    with pytest.raises(ConfigError, match=r"resume it with --set environment.precondition=none$"):
        toy(classes).load_extra_state({})  # a state saved with plain gradients (or before the option existed)


def test_a_simulator_has_no_preconditioner_and_rejects_the_key(classes):
    from sagips.config import ConfigError

    Smear1D = classes[1]
    assert Smear1D(from_dict(Smear1D.Config, {}, "environment."), "cpu", 0).preconditioner is None
    with pytest.raises(ConfigError, match="unknown config key 'environment.precondition'"):
        from_dict(Smear1D.Config, {"precondition": "fisher"}, "environment.")


def test_a_preconditioned_non_log_epoch_reads_nothing_on_the_host(tmp_path, tmp_path_factory, monkeypatch):
    from tests import test_step

    add_to_sys_path(toy_site(tmp_path_factory.mktemp("site")), monkeypatch)
    sets = ["environment.name=toy1d", "environment.param_samples=8", "environment.events_per_sample=16",
            "environment.reference_events=4000", "train.quality_samples=16", "environment.hidden=16"]
    tr = test_step.make_trainer(tmp_path, sets, exchange=test_step.halve)
    tr.step(1)
    tr.env.adapt(tr.G_eval)  # what fit() does after a log epoch: a refresh between steps, never inside one
    assert not torch.equal(tr.env.preconditioner.m, torch.eye(3))
    with test_step.ScalarReads() as below:
        tr.step(2)
        tr.step(3)
    assert below.seen == [], f"host reads below Python in a non-log epoch: {below.seen}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs record GPU work only")
def test_graph_replays_the_refreshed_matrix(tmp_path, tmp_path_factory, monkeypatch):  # pragma: no cover - GPU only
    """The refresh between epochs writes into the buffer a recorded graph reads: graph and eager runs agree."""
    from tests import test_step

    add_to_sys_path(toy_site(tmp_path_factory.mktemp("site")), monkeypatch)
    sets = ["environment.name=toy1d", "environment.param_samples=8", "environment.events_per_sample=16",
            "environment.reference_events=4000", "train.quality_samples=16", "environment.hidden=16"]
    trainers = test_step.graph_against_eager(
        tmp_path, lambda d, mode: test_step.make_trainer(d, sets + [f"train.cuda_graph={mode}"], device="cuda"), 100,
        between=lambda tr, e: tr.env.adapt(tr.G_eval) if e % 10 == 0 else None)
    assert not torch.equal(trainers["on"].env.preconditioner.m.cpu(), torch.eye(3))
