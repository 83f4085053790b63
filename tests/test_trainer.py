"""The per-rank epoch loop: one exchange hook after the generator backward; AMP paths on CPU; device choice."""
import numpy as np
import pytest
import torch

from sagips.config import load
from sagips.errors import ConfigError
from sagips.trainer import Trainer, select_device
from sagips_environments.proxy1d import Proxy1D

SMALL = ["environment.param_samples=8", "environment.events_per_sample=16", "train.progress=false",
         "train.quality_samples=16"]


def make_trainer(tmp_path, sets=(), exchange=None):
    cfg = load(None, SMALL + list(sets))
    arrays, attrs = Proxy1D.generate_reference(cfg.environment, 0, n_events=2000)
    env = Proxy1D(cfg.environment, "cpu", seed=1)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    return Trainer(cfg, env, 0, 1, str(tmp_path), exchange=exchange, is_root=False)


def test_exchange_hook_sees_the_generator_weight_gradients_and_its_result_is_used(tmp_path):
    seen = {}

    def exchange(buf, epoch, weight=1.0):
        seen["n"], seen["epoch"], seen["norm"] = buf.size, epoch, float(np.abs(buf).sum())
        assert weight == 1.0
        buf[:] = 0.0  # an exchange that returns zero gradients: the weights must not move
        return {"calls": 1}

    tr = make_trainer(tmp_path, exchange=exchange)
    w_before = [p.detach().clone() for p in tr.G.parameters() if p.ndim > 1]
    out = tr.step(1)
    assert seen["n"] == 50_688 and seen["epoch"] == 1 and seen["norm"] > 0 and out["calls"] == 1
    w_after = [p.detach() for p in tr.G.parameters() if p.ndim > 1]
    assert all(torch.equal(a, b) for a, b in zip(w_before, w_after))  # Adam with zero grads: no step


def test_non_finite_gradient_is_dropped_then_stops(tmp_path):
    from sagips.trainer import NonFiniteError

    calls = []

    def exchange(buf, epoch, weight=1.0):
        calls.append((weight, bool(np.isfinite(buf).all()), float(np.abs(buf).sum())))
        buf[:] = 1e-3  # "the others' mean"
        return {}

    tr = make_trainer(tmp_path, ["train.max_bad_steps=3"], exchange=exchange)
    tr.step(1)
    assert calls[-1][0] == 1.0
    with torch.no_grad():
        tr.G[2].weight[0, 0] = float("nan")  # poisons this rank's generator gradient
    tr.step(2)
    weight, finite, norm = calls[-1]
    assert weight == 0.0 and finite and norm == 0.0  # dropped: zeros with weight 0, never NaN on the wire
    assert tr.bad_steps == 1
    # counted on the device and read every max_bad_steps epochs: at epoch 3 the streak is 2, below the limit; it
    # reaches 3 at epoch 4, and the read at epoch 6 stops the run (within max_bad_steps epochs of it)
    tr.step(3)
    tr.step(4)
    tr.step(5)
    with pytest.raises(NonFiniteError, match=r"5 generator steps in a row .*epoch 6.*max_bad_steps=3\), with the "
                                             r"generator at r_0=.*, r_5=[^,]*: check the pipeline there"):
        tr.step(6)


def test_training_without_exchange_moves_the_generator(tmp_path):
    tr = make_trainer(tmp_path)
    w = tr.G[0].weight.detach().clone()
    out = tr.step(1)
    assert np.isfinite(float(out["loss_g"])) and not torch.equal(w, tr.G[0].weight)


def test_bf16_autocast_on_cpu(tmp_path):
    tr = make_trainer(tmp_path, ["train.amp=bf16"])
    dtypes = []
    tr.D[0].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    out = tr.step(1)
    assert torch.bfloat16 in dtypes
    assert np.isfinite(float(out["loss_d"])) and np.isfinite(float(out["loss_g"]))
    assert all(p.dtype == torch.float32 for p in tr.G.parameters())  # master weights stay float32


def test_device_choice():
    assert select_device("cpu", 3) == torch.device("cpu")
    if torch.cuda.is_available():
        assert select_device("auto", 5) == torch.device("cuda", 5 % torch.cuda.device_count())
    else:
        assert select_device("auto", 5) == torch.device("cpu")
        with pytest.raises(ConfigError, match="CUDA is not available on this host; use train.device=auto"):
            select_device("cuda", 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned-memory offload and fp16 GradScaler")
def test_cuda_offload_is_pinned_and_round_trips(tmp_path):  # pragma: no cover - runs on GPU machines only
    from sagips.comm.buffer import GradBuffer

    G = torch.nn.Linear(4, 3).cuda()
    buf = GradBuffer(G, exchange_bias=True)
    assert buf.host.is_pinned()
    G(torch.randn(2, 4, device="cuda")).sum().backward()
    arr = buf.offload()
    np.testing.assert_allclose(arr[:12], G.weight.grad.cpu().numpy().ravel())
    arr[:] = 1.0
    buf.load_back()
    torch.cuda.synchronize()
    assert torch.all(G.weight.grad == 1.0)


def _weights(module):
    return [p.detach().double().numpy().copy() for p in module.parameters()]


def test_ema_follows_its_recurrence_with_warm_up_and_cap(tmp_path):
    # ema = 0.2: the warm-up (1 + k) / (10 + k) sets the decay at k = 1 (0.18), the cap at k = 2 (0.25 > 0.2)
    tr = make_trainer(tmp_path, ["train.ema=0.2"])
    expect = None
    for k in range(3):
        tr.step(k + 1)
        w = _weights(tr.G)
        d = min(0.2, (1 + k) / (10 + k))
        expect = w if expect is None else [d * e + (1 - d) * x for e, x in zip(expect, w)]
        got = _weights(tr.G_ema)
        for a, b in zip(got, expect):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert tr.ema_steps == 3 and tr.G_eval is tr.G_ema
    assert any(not np.allclose(a, b) for a, b in zip(_weights(tr.G_ema), _weights(tr.G)))  # it does average
    assert make_trainer(tmp_path / "off").G_eval is not None  # ema off: G itself is evaluated


def test_ema_is_checkpointed_and_resumes_bit_identical(tmp_path):
    from sagips.io.checkpoint import list_checkpoints, load_checkpoint
    from sagips.io.state import load_state
    from sagips.trainer import StopRequested

    sets = ["train.ema=0.9", "train.epochs=4", "train.checkpoint_every=2", "train.state_every=2",
            "train.log_every=100"]
    torch.manual_seed(7)  # as sagips.run seeds each rank before building its networks
    ref = make_trainer(tmp_path / "ref", sets)
    ref.fit(progress=False)
    ck = load_checkpoint(list_checkpoints(tmp_path / "ref")[0][4])["generator"]
    for k, v in ref.G_ema.state_dict().items():
        assert torch.equal(ck[k], v), f"checkpoint {k} is not the averaged generator"
    assert not all(torch.equal(ck[k], v) for k, v in ref.G.state_dict().items())

    torch.manual_seed(7)
    cut = make_trainer(tmp_path / "cut", sets)
    cut.stop_requested = True  # like SIGTERM: the state of epoch 1 is saved, then the run stops
    with pytest.raises(StopRequested):
        cut.fit(progress=False)
    resumed = make_trainer(tmp_path / "cut", sets)
    resumed.load_state_dict(load_state(tmp_path / "cut", 0, 1))
    assert resumed.ema_steps == 1
    resumed.fit(progress=False)
    for name, m_ref, m_res in (("G", ref.G, resumed.G), ("G_ema", ref.G_ema, resumed.G_ema)):
        for (k, a), b in zip(m_ref.state_dict().items(), m_res.state_dict().values()):
            assert torch.equal(a, b), f"{name}.{k} differs after resume"


def test_fused_adam_on_cpu_matches_the_default_adam():
    from sagips.adam import make_adam

    torch.manual_seed(0)
    nets = [torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)]
    nets[1].load_state_dict(nets[0].state_dict())
    fused = make_adam(nets[0].parameters(), 1e-2, (0.5, 0.9), fused=True)
    plain = make_adam(nets[1].parameters(), 1e-2, (0.5, 0.9), fused=False)
    assert not plain.defaults.get("fused")
    for _ in range(5):
        g = [torch.randn_like(p) for p in nets[0].parameters()]
        for net, opt in zip(nets, (fused, plain)):
            for p, gi in zip(net.parameters(), g):
                p.grad = gi.clone()
            opt.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # torch >= 2.4 has a CPU kernel: it must be the one in use
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    assert bool(fused.defaults.get("fused")) == ((major, minor) >= (2, 4))


def test_threads_per_rank_under_pinning_and_without():
    from sagips.trainer import threads_per_rank

    node = [set(range(32))] * 4  # no binding: 4 ranks share the host's 32 cores
    assert threads_per_rank(0, set(range(32)), node) == 8
    pinned = [set(range(8 * i, 8 * i + 8)) for i in range(4)]  # Polaris: --depth 8 --cpu-bind depth
    assert threads_per_rank(0, pinned[1], pinned) == 8  # its own 8 cores, not 8 // 4 = 2
    job_cpuset = [set(range(8))] * 4  # a job-wide cpuset of 8 cores for 4 ranks
    assert threads_per_rank(0, set(range(8)), job_cpuset) == 2
    assert threads_per_rank(0, {0, 1}, [{0, 1}] * 4) == 1  # oversubscribed: never 0
    assert threads_per_rank(3, {0}, [{0}] * 4) == 3  # an explicit train.threads wins
    assert threads_per_rank(0, {0, 1, 2, 3}, []) == 4


def test_a_local_fp16_overflow_still_applies_the_exchanged_mean(tmp_path):
    """Issue 21, item 3: with loss scaling, a rank whose own gradient overflowed must apply the group's (finite)
    mean like the others; GradScaler.step skipped it, and the replicas drifted apart."""
    def exchange(buf, epoch, weight=1.0):
        buf[:] = 1e-3  # "the others' mean"
        return {}

    tr = make_trainer(tmp_path, exchange=exchange)
    tr.scaler_g = torch.amp.GradScaler("cpu", init_scale=1e38)  # fp16's scaler; this scale overflows float32
    w = tr.G[0].weight.detach().clone()
    out = tr.step(1)
    assert out["bad_grad"] == 1  # this rank's own gradient overflowed ...
    assert not torch.equal(w, tr.G[0].weight)  # ... and it applied the exchanged mean all the same
    assert tr.scaler_g.get_scale() < 1e38  # while its loss scale backed off, as GradScaler does


def test_a_rank_whose_quality_nobody_uses_computes_none(tmp_path):
    """Issue 21, item 6: in rma-arar-arar only rank 0's quality is logged; the others skip it entirely."""
    tr = make_trainer(tmp_path)
    tr.computes_quality = False
    calls = []
    tr.env.quality = lambda *a, **k: calls.append(1) or {}
    tr._log(1, {}, None)
    assert calls == []
    tr.computes_quality = True
    tr.is_root = False  # a rank that computes its quality for a gather, but does not write the log
    tr._log(1, {}, None)
    assert calls == [1]


@pytest.mark.parametrize("d_final", [None, 0.5])
def test_learning_rates_follow_their_own_decays(tmp_path, d_final):
    """lr(e) = lr0 * final ** ((e - 1) / (epochs - 1)); the critic's final fraction is lr_d_final where set."""
    sets = ["train.epochs=5", "train.lr_g=2e-3", "train.lr_d=1e-3", "train.lr_final=0.1"]
    if d_final is not None:
        sets.append(f"train.lr_d_final={d_final}")
    fd = 0.1 if d_final is None else d_final
    want = [(2e-3 * 0.1 ** (k / 4), 1e-3 * fd ** (k / 4)) for k in range(5)]
    for fused in (True, False):  # the schedule as a device tensor (fused Adam), and as floats set from the host
        tr = make_trainer(tmp_path / str(fused), sets + [f"train.fused_adam={str(fused).lower()}"])
        assert (tr.lr_t[tr.opt_g] is not None) == fused and (tr.opt_g.param_groups[0]["lr"] is tr.lr_t[tr.opt_g]) \
            == fused
        seen = []
        step = tr.step
        # the rates the epoch's optimizer steps used (a tensor's value is read after the step)
        tr.step = lambda e, tr=tr, step=step, seen=seen: (
            step(e), seen.append(tuple(float(o.param_groups[0]["lr"]) for o in (tr.opt_g, tr.opt_d))))[0]
        tr.fit()
        np.testing.assert_allclose(seen, want, rtol=1e-6 if fused else 1e-12)  # float32 tensors: 1e-7 apart


def test_a_progress_bar_into_a_log_updates_every_progress_pipe_s(monkeypatch):
    """Into a file or mpiexec's pipe, every bar update is a line of the log: one per PROGRESS_PIPE_S, not per second."""
    import io
    from types import SimpleNamespace

    from sagips import trainer as trainer_mod

    class Tty(io.StringIO):
        def isatty(self):
            return True

    fake = SimpleNamespace(is_root=True, cfg=SimpleNamespace(train=SimpleNamespace(progress=True, epochs=10),
                                                             mode="arar"),
                           state=SimpleNamespace(epoch=0), progress_desc=None)
    for stream, every in ((io.StringIO(), trainer_mod.PROGRESS_PIPE_S), (Tty(), 1.0)):
        monkeypatch.setattr(trainer_mod.sys, "stderr", stream)
        bar = trainer_mod.Trainer._progress_bar(fake, True)
        assert bar.mininterval == every
        bar.close()
    assert trainer_mod.PROGRESS_PIPE_S >= 10
    assert trainer_mod.Trainer._progress_bar(SimpleNamespace(**{**vars(fake), "is_root": False}), True) is None
