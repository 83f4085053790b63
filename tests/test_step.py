"""Issue 38: the epoch is one step definition with no host reads, run eagerly or replayed as CUDA graphs.

On the CPU: no `.item()`, `bool()`, `.cpu()`, `.tolist()`, `float()` or `int()` of a tensor in an epoch that neither
logs nor checks; the step equals a plain GAN step written here from the environment's methods; the NaN guard skips a
poisoned step alike on two ranks that exchange in step. On CUDA (skipped elsewhere, each with its reason): a graph run
and an eager run from the same seed agree, and a resume from a graph run's state is exact.
"""
import threading

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sagips.config import load
from sagips.environment import get_environment
from sagips.trainer import Trainer

PROXY = ["environment.param_samples=8", "environment.events_per_sample=16", "train.quality_samples=16",
         "environment.reference_events=4000"]
OPTIGAN = ["environment.name=optigan", "environment.photons_per_point=60", "environment.grid_side=2",
           "environment.grid_depths=2", "environment.heldout_points=2", "environment.heldout_photons=200",
           "environment.quality_photons=100", "environment.batch_size=64"]
QUIET = ["train.progress=false", "train.log_every=1000", "train.checkpoint_every=1000", "train.state_every=1000",
         "train.epochs=1000"]
HOST_READS = ("item", "__bool__", "cpu", "tolist", "__float__", "__int__", "numpy")


class ScalarReads(TorchDispatchMode):
    """Counts the reads of a tensor's value into the host made below Python too (an op that takes a tensor where it
    wants a number converts it with aten._local_scalar_dense: a sync on a GPU, an error inside a graph capture)."""

    READS = ("_local_scalar_dense", "is_nonzero", "equal")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket.__name__ in self.READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def make_trainer(tmp_path, sets=(), exchange=None, device="cpu", seed=1):
    cfg = load(None, QUIET + list(sets))
    env_cls = get_environment(cfg.environment.name)
    arrays, attrs = env_cls.generate_reference(cfg.environment, 0)
    env = env_cls(cfg.environment, device, seed=seed)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    torch.manual_seed(seed)
    return Trainer(cfg, env, 0, 1, str(tmp_path), exchange=exchange, is_root=False)


def halve(buf, epoch, weight=1.0):
    """A stand-in exchange: 'the mean with a rank whose gradient is zero'."""
    buf *= np.float32(0.5)
    return {}


@pytest.mark.parametrize("sets, exchanged", [
    (PROXY, False),  # ensemble: no exchange, the skip decided on the device alone
    (PROXY + ["train.ema=0.9", "train.lr_final=0.1", "environment.d_steps=2"], True),
    (PROXY + ["train.amp=bf16"], True),
    (OPTIGAN, True),  # the gradient penalty's double backward, EMA, the fold
], ids=["proxy-alone", "proxy-ema-schedule-exchange", "proxy-bf16-exchange", "optigan-exchange"])
def test_a_non_log_epoch_reads_nothing_on_the_host(tmp_path, monkeypatch, sets, exchanged):
    tr = make_trainer(tmp_path, sets, exchange=halve if exchanged else None)
    tr.step(1)  # epoch 1 checks the environment and logs: host reads are fine there
    calls = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            calls.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    assert not tr.checks_at(2) and not tr.checks_at(3)
    with ScalarReads() as below:
        tr.step(2)
        tr.step(3)
    assert calls == [], f"host reads in a non-log epoch: {calls}"
    assert below.seen == [], f"host reads below Python in a non-log epoch: {below.seen}"
    monkeypatch.undo()
    with ScalarReads() as check:
        assert tr.bad_steps == 0  # a host read (.item()), which the counter must see
    assert check.seen, "the counter would not notice a host read"
    assert tr.checks_at(10)  # every max_bad_steps epochs the guard is read (one read)


def test_hvd_step_reads_only_the_exchange_buffers(tmp_path, monkeypatch):
    tr = make_trainer(tmp_path, PROXY + ["mode=hvd"], exchange=halve)
    tr.d_exchange = halve
    tr.step(1)
    calls = []
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append("item"))
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self: calls.append("bool") or True)
    tr.step(2)
    assert calls == []


def _reference_run(tmp_path, sets, epochs, exchange):
    """The GAN step written plainly from the environment's methods (torch's Adam, the schedule as floats, host
    checks): the truth that Trainer.step's device-side guard, fused kernels and segments must reproduce."""
    tr = make_trainer(tmp_path, sets)  # the same seeds, networks and data as the trainer under test
    env, G, D, t = tr.env, tr.G, tr.D, tr.cfg.train
    opt_g = torch.optim.Adam(G.parameters(), lr=t.lr_g, betas=(t.beta1, t.beta2))
    opt_d = torch.optim.Adam(D.parameters(), lr=t.lr_d, betas=(t.beta1, t.beta2))
    losses = []
    for epoch in range(1, epochs + 1):
        x = (epoch - 1) / max(1, t.epochs - 1)
        for opt, lr0 in ((opt_g, t.lr_g), (opt_d, t.lr_d)):
            opt.param_groups[0]["lr"] = lr0 * t.lr_final ** x
        for _ in range(env.n_critic):
            real = env.real_batch()
            with torch.no_grad():
                fake = env.synthesize(G, real)
            loss_d = env.d_loss(D, real, fake)
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
        real = env.real_batch() if env.g_loss_reads_real else None  # proxy1d's generator loss reads none
        fake = env.synthesize(G, real)
        loss_g, _ = env.g_loss(D, real, fake)
        opt_g.zero_grad()
        loss_g.backward()
        for p in G.parameters():
            if p.ndim > 1 and exchange:  # the exchanged part: the weights (comm.exchange_bias=false)
                p.grad.mul_(0.5)
        opt_g.step()
        losses.append((float(loss_d), float(loss_g)))
    return G, D, np.array(losses)


@pytest.mark.parametrize("exchanged", [False, True], ids=["alone", "exchange"])
def test_the_step_equals_a_plain_gan_step(tmp_path, exchanged):
    # (small rates: the sampler's bin index is a step function of p, so at large rates float rounding of the fused
    # kernels flips single events' bins, and the two runs part as any two GAN runs would)
    sets = PROXY + ["train.lr_g=1e-4", "train.lr_d=1e-4", "train.lr_final=0.2", "train.epochs=12",
                    "environment.d_steps=2"]
    G_ref, D_ref, ref_losses = _reference_run(tmp_path / "ref", sets, 12, exchanged)
    tr = make_trainer(tmp_path / "tr", sets, exchange=halve if exchanged else None)
    losses = np.array([[float(v.detach()) for v in (o["loss_d"], o["loss_g"])]
                       for o in (tr.step(e) for e in range(1, 13))])
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-7)
    for net, ref in ((tr.G, G_ref), (tr.D, D_ref)):
        for a, b in zip(net.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def _two_ranks(tmp_path, poison, epochs=4):
    """Two in-process ranks (threads) whose exchange is a weighted mean of both buffers, as the MPI modes compute it
    (weight 0 drops a contribution). `poison`: {rank: epoch} puts a NaN in that rank's generator before that epoch."""
    trainers, bufs, weights = [], [None, None], [0.0, 0.0]
    barrier = threading.Barrier(2)

    def exchange_of(rank):
        def exchange(buf, epoch, weight=1.0):
            bufs[rank], weights[rank] = buf.copy(), weight
            barrier.wait()
            total = max(sum(weights), 1.0)
            buf[:] = (bufs[0] * weights[0] + bufs[1] * weights[1]) / np.float32(total)
            barrier.wait()
            return {}
        return exchange

    for rank in range(2):
        trainers.append(make_trainer(tmp_path / str(rank), PROXY + ["train.max_bad_steps=100"],
                                     exchange=exchange_of(rank), seed=3 + rank))
    trainers[1].G.load_state_dict(trainers[0].G.state_dict())  # replicas start identical (sagips.run broadcasts)
    history = []

    def run(rank):
        tr = trainers[rank]
        for epoch in range(1, epochs + 1):
            if poison.get(rank) == epoch:
                with torch.no_grad():
                    tr.G[2].weight[0, 0] = float("nan")
            before = [p.detach().clone() for p in tr.G.parameters() if p.ndim > 1]
            tr.step(epoch)
            after = [p.detach().clone() for p in tr.G.parameters() if p.ndim > 1]
            history.append((rank, epoch, before, after))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    return trainers, {(r, e): (b, a) for r, e, b, a in history}


def test_nan_guard_one_poisoned_rank_applies_the_others_mean_on_both(tmp_path):
    trainers, hist = _two_ranks(tmp_path, poison={1: 2}, epochs=3)
    # epochs 2 and 3: its weights hold a NaN from then on
    assert [tr.guard.take()["bad_grad"] for tr in trainers] == [0, 2]
    for epoch in (2, 3):  # rank 1 contributes zeros with weight 0: both ranks step on rank 0's gradient
        (b0, a0), (b1, a1) = hist[(0, epoch)], hist[(1, epoch)]
        assert all(torch.isfinite(a).all() for a in a0)
        moved = [a - b for a, b in zip(a0, b0)]
        assert any(m.abs().max() > 0 for m in moved)
        moved1 = [a - b for a, b in zip(a1, b1)]  # rank 1's own NaN entry stays NaN: compare the others
        for m0, m1 in zip(moved, moved1):
            mask = torch.isfinite(m1)
            assert int((~mask).sum()) <= 1
            torch.testing.assert_close(m0[mask], m1[mask])


def test_nan_guard_both_poisoned_skip_alike(tmp_path):
    trainers, hist = _two_ranks(tmp_path, poison={0: 2, 1: 2}, epochs=2)
    for rank in range(2):  # nobody contributed: the mean is all zeros, and every rank skips the step
        b, a = hist[(rank, 2)]
        for x, y in zip(b, a):
            assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
    assert all(tr.bad_steps == 1 for tr in trainers)


def test_cuda_graph_auto_is_eager_on_a_cpu_and_on_refuses(tmp_path):
    from sagips.graph import GraphCaptureError

    tr = make_trainer(tmp_path, PROXY)
    tr.step(1)
    assert tr.graphs.record() == {"used": False, "why": "not a CUDA device", "segments": 0, "replays": 0,
                                  "warmup_epochs": 3}
    on = make_trainer(tmp_path / "on", PROXY + ["train.cuda_graph=on"])
    with pytest.raises(GraphCaptureError, match="needs a CUDA device"):
        on.step(1)


def test_plan_puts_the_exchanges_between_device_segments(tmp_path):
    tr = make_trainer(tmp_path, PROXY + ["train.ema=0.9"], exchange=halve)
    assert [k for k, _ in tr.plan()] == ["device", "host", "host", "device"]
    hvd = make_trainer(tmp_path / "hvd", PROXY + ["mode=hvd", "environment.d_steps=2"], exchange=halve)
    hvd.d_exchange = halve
    assert [k for k, _ in hvd.plan()] == ["device", "host", "device", "host", "device", "host", "host", "device"]


# ------------------------------------------------------------------------------------------------------ CUDA only
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs record GPU work only")


def _final(tr):
    return {k: v.detach().cpu().clone() for k, v in tr.G.state_dict().items()}


def graph_against_eager(tmp_path, build, epochs, between=None):
    """Train build(dir, cuda_graph) with train.cuda_graph off and on for `epochs` epochs (calling between(trainer, e)
    after each, e.g. a refresh that fit() makes between steps) and assert that the recorded run replayed and agrees
    with the eager one: the losses and the final generator weights to rtol 1e-3 / atol 1e-4. Returns {mode: trainer}."""
    runs, trainers = {}, {}
    for mode in ("off", "on"):
        tr = trainers[mode] = build(tmp_path / mode, mode)
        losses = []
        for e in range(1, epochs + 1):
            losses.append(float(tr.step(e)["loss_g"].detach()))
            if between is not None:
                between(tr, e)
        runs[mode] = (losses, _final(tr), tr.graphs.record())
    assert runs["on"][2]["used"] and runs["on"][2]["replays"] > 0, runs["on"][2]
    np.testing.assert_allclose(runs["on"][0], runs["off"][0], rtol=1e-3, atol=1e-4)
    for k, v in runs["off"][1].items():
        torch.testing.assert_close(runs["on"][1][k], v, rtol=1e-3, atol=1e-4)
    return trainers


@CUDA
@pytest.mark.parametrize("sets", [PROXY, PROXY + ["train.ema=0.9", "train.lr_final=0.1"], OPTIGAN + ["train.amp=bf16"]],
                         ids=["proxy", "proxy-ema-schedule", "optigan-bf16"])
@pytest.mark.parametrize("exchanged", [False, True], ids=["alone", "exchange"])
def test_graph_replay_agrees_with_eager(tmp_path, sets, exchanged):  # pragma: no cover - GPU machines only
    graph_against_eager(tmp_path, lambda d, mode: make_trainer(d, sets + [f"train.cuda_graph={mode}"],
                                                               exchange=halve if exchanged else None, device="cuda"),
                        200)


@CUDA
def test_resume_from_a_graph_runs_state_is_exact(tmp_path):  # pragma: no cover - GPU machines only
    sets = PROXY + ["train.cuda_graph=on", "train.epochs=12", "train.state_every=6", "train.log_every=6"]
    ref = make_trainer(tmp_path / "ref", sets, device="cuda")
    ref.fit(progress=False)
    cut = make_trainer(tmp_path / "cut", sets, device="cuda")
    for e in range(1, 7):
        cut.step(e)
    cut.state.epoch = 6
    sd = cut.state_dict()
    resumed = make_trainer(tmp_path / "cut2", sets, device="cuda")
    resumed.load_state_dict(sd)
    resumed.fit(progress=False)
    # bit-exact up to CUDA's atomics: the sampler's gather backward adds in a nondeterministic order on a GPU
    for k, v in _final(ref).items():
        torch.testing.assert_close(_final(resumed)[k], v, rtol=1e-5, atol=1e-7, msg=k)


@CUDA
def test_hvd_graph_replay_agrees_with_eager(tmp_path):  # pragma: no cover - GPU machines only
    """hvd: each critic step's exchange is a host point between two recorded segments."""
    def build(d, mode):
        tr = make_trainer(d, PROXY + ["mode=hvd", "environment.d_steps=2", f"train.cuda_graph={mode}"],
                          exchange=halve, device="cuda")
        tr.d_exchange = halve
        return tr

    on = graph_against_eager(tmp_path, build, 100)["on"]
    assert on.graphs.record()["segments"] >= 4, on.graphs.record()


@CUDA
def test_the_first_graph_replay_follows_the_recordings_own_work(tmp_path, monkeypatch):  # pragma: no cover - GPU only
    """sagips/graph.py, "The recording's own work": what torch.cuda.graph queues on the capture stream before the
    capture (the generators' offset reset) is done when each replay is launched. A sleep put in front of it on that
    stream stands for a GPU that runs it late."""
    begin, replay = torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.replay
    pending = []

    def late(self, *args, **kwargs):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the capture stream
        return begin(self, *args, **kwargs)

    def checked(self):
        pending.append(not tr.graphs.stream.query())
        return replay(self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", late)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", checked)
    tr = make_trainer(tmp_path, PROXY + ["train.cuda_graph=on"], device="cuda")
    for e in range(1, tr.cfg.train.cuda_graph_warmup + 3):
        tr.step(e)
    assert tr.graphs.record()["replays"] == len(pending) > 0, tr.graphs.record()
    assert not any(pending), "a replay was launched before the recording's own work on the capture stream was done"


@CUDA
def test_fit_replayed_agrees_with_eager_without_host_reads(tmp_path):  # pragma: no cover - GPU machines only
    """fit() as a user runs it (no loss read per epoch, the NaN guard read every 10 epochs), recorded and eager."""
    final = {}
    for mode in ("off", "on"):
        tr = make_trainer(tmp_path / mode, PROXY + ["train.ema=0.9", "train.epochs=200", f"train.cuda_graph={mode}"],
                          device="cuda")
        tr.fit(progress=False)
        assert tr.graphs.record()["used"] == (mode == "on"), tr.graphs.record()
        final[mode] = _final(tr)
    for k, v in final["off"].items():
        torch.testing.assert_close(final["on"][k], v, rtol=1e-3, atol=1e-4, msg=k)
