"""The per-rank epoch loop: critic step(s), generator step, gradient exchange, checkpoints and metrics.

Each rank owns a generator replica and its *own* discriminator. Only the generator's gradients cross ranks: after
the generator backward, the trainer hands its flat gradient buffer to one exchange hook (`sagips.comm.modes`),
then steps the generator's optimizer with whatever came back.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sagips.chunked import auto_chunk_rows
from sagips.comm.buffer import GradBuffer
from sagips.config import Config
from sagips.environment import Environment
from sagips.io.checkpoint import save_checkpoint
from sagips.io.metrics import MetricsWriter
from sagips.io.state import RankStates
from sagips.profiling import CRITIC, DATA, EPOCH, EXCHANGE, GENERATOR, LOG, Ranges

Exchange = Callable[[np.ndarray, int], dict]


def select_device(kind: str, local_rank: int) -> torch.device:
    """cuda:(local_rank % device_count) when CUDA is present (and allowed), else cpu."""
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but CUDA is not available on this host; use train.device=auto")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def threads_per_rank(requested: int, own_cpus: set[int], node_cpus: list[set[int]]) -> int:
    """Torch threads for one rank: `requested` if > 0; else the cores it may use, shared with the ranks that share them.

    `node_cpus` holds the CPU affinity of every rank on this host (its own included). Where the launcher pinned
    each rank to its own cores (Polaris: `mpiexec --depth 8 --cpu-bind depth`), the rank's affinity is already its
    share: all of it. Where ranks share one set (no binding, or a job-wide cpuset), the set is divided among the
    ranks that hold it, so that together they do not oversubscribe it.
    """
    if requested > 0:
        return requested
    sharing = sum(1 for cpus in node_cpus if cpus == own_cpus) or 1
    return max(1, len(own_cpus) // sharing)


def affinity() -> set[int]:
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def set_threads(requested: int, node_cpus: list[set[int]] | None = None) -> int:
    """Set torch's intra-op threads by `threads_per_rank` (node_cpus None: this process alone on its cores)."""
    own = affinity()
    n = threads_per_rank(requested, own, node_cpus if node_cpus is not None else [own])
    torch.set_num_threads(n)
    return n


def make_adam(params, lr: float, betas: tuple[float, float], fused: bool) -> torch.optim.Adam:
    """Adam with the fused kernel where this torch has one for the parameters' device (CUDA; CPU since torch 2.4:
    one kernel per step instead of ~10 small ops per tensor, 3x faster for the paper's networks), else the default."""
    params = list(params)
    if fused:
        try:
            return torch.optim.Adam(params, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype in this torch
            pass
    return torch.optim.Adam(params, lr=lr, betas=betas)


def rank_seeds(seed: int, member: int, rank: int) -> tuple[int, int]:
    """Independent (torch, numpy) seeds for one rank of one ensemble member."""
    s = np.random.SeedSequence([seed, member, rank]).generate_state(2, dtype=np.uint32)
    return int(s[0]), int(s[1])


class NonFiniteError(RuntimeError):
    """Too many generator steps in a row had non-finite gradients."""


class StopRequested(Exception):
    """Raised after the state was saved because a stop signal (e.g. SIGTERM) arrived."""

    def __init__(self, epoch: int):
        super().__init__(f"stopped by a signal after epoch {epoch}; the state is saved, continue with --resume")
        self.epoch = epoch


@dataclass
class TrainState:
    epoch: int = 0
    time_s: float = 0.0  #: accumulated training wall seconds on this rank
    stats: dict[str, float] = field(default_factory=dict)  #: counters summed over the run (e.g. RMA drops)


class FaultDrill(RuntimeError):
    """The error that pipeline.fail_epoch raises (a drill of the failure path)."""


class Trainer:
    def __init__(self, cfg: Config, env: Environment, rank: int, world_size: int, out_dir: str,
                 exchange: Exchange | None = None, gather_quality: Callable[[dict], list[dict] | None] | None = None,
                 is_root: bool = True, share: Callable[[Any], Any] | None = None, computes_quality: bool = True):
        """share: a broadcast from rank 0 of the run (e.g. comm.bcast), so that every rank runs in the precision that
        rank 0 resolved for train.amp (auto probes the hardware once, on rank 0); None resolves it here.
        computes_quality: False on a rank whose logged quality nobody uses (it then skips the quality entirely)."""
        self.cfg, self.env, self.rank, self.world_size = cfg, env, rank, world_size
        self.out_dir = out_dir
        self.exchange = exchange
        #: the key of this rank's data subset (set by sagips.run; saved in the states, checked on --resume)
        self.data_key: dict[str, Any] | None = None
        self.gather_quality = gather_quality
        self.computes_quality = computes_quality
        self.is_root = is_root
        self.share = share
        self.checked = False  #: the first-epoch checks of the environment ran in this process (sagips.checks)
        t = cfg.train
        self.G = env.build_generator()
        self.D = env.build_discriminator()
        self.opt_g = make_adam(self.G.parameters(), t.lr_g, (t.beta1, t.beta2), t.fused_adam)
        self.opt_d = make_adam(self.D.parameters(), t.lr_d, (t.beta1, t.beta2), t.fused_adam)
        self.amp_dtype, self.precision = self._resolve_precision(share)
        self.resolve_chunk_rows()
        # fp16 needs loss scaling; bf16 has float32's exponent range and does not
        scaling = self.amp_dtype == torch.float16
        self.scaler_d = torch.amp.GradScaler(env.device.type, enabled=scaling)
        self.scaler_g = torch.amp.GradScaler(env.device.type, enabled=scaling)
        hvd = cfg.mode == "hvd"  # the paper's Horovod baseline: every parameter of both networks is averaged
        self.grads = GradBuffer(self.G, exchange_bias=cfg.comm.exchange_bias or hvd)
        #: hvd: the critic's gradients in one flat buffer, averaged by d_exchange (set by sagips.run) every step
        self.d_grads = GradBuffer(self.D, exchange_bias=True) if hvd else None
        self.d_exchange: Exchange | None = None
        #: comm.outer_sync=weights (sagips.comm.modes.WeightAverage, set by sagips.run): on its outer epochs the
        #: generator's weights and Adam moments are replaced by their mean over all ranks after the step
        self.average_weights = None
        self.state = TrainState()
        self.delay_s = cfg.pipeline.delay_s if rank in cfg.pipeline.delay_ranks else 0.0
        self.fail_epoch = cfg.pipeline.fail_epoch if rank in cfg.pipeline.fail_ranks else 0
        self.metrics = MetricsWriter(os.path.join(out_dir, "metrics.jsonl")) if is_root else None
        self.last_quality: dict[str, Any] | None = None
        self.progress_desc = ""  #: progress bar label (e.g. the ensemble member)
        self.bad_steps = 0  #: consecutive generator steps with a non-finite gradient on this rank
        self.stop_requested = False  #: set by a signal handler (SIGTERM from PBS): save state, then stop
        self.states = RankStates(out_dir, rank)  #: this rank's training states (--resume replaces it)
        #: called with each newer epoch whose state every rank holds (rank 0 writes the `latest` marker)
        self.on_state_complete: Callable[[int], None] | None = None
        #: agrees the stop between ranks (sagips.comm.stop.StopAgreement); None: this rank stops on its own request
        self.stop_agreement = None
        self.ranges = Ranges(t.profile, env.device)  #: named profiler ranges (train.profile; no-ops when off)
        self.G_ema: torch.nn.Module | None = None  #: train.ema > 0: the averaged generator (made at its first update)
        self.ema_steps = 0

    def _resolve_precision(self, share):
        """(autocast dtype, record) for train.amp on this device (sagips.precision.resolve)."""
        from sagips.precision import resolve

        res = None
        if share is None or self.rank == 0:
            rows = min(2048, max(256, 2 * self.env.events_per_epoch))
            res = resolve(self.cfg.train.amp, self.env.device, self.D, rows)
        return share(res) if share is not None else res

    def resolve_chunk_rows(self) -> int:
        """Set env.chunk_rows from train.chunk_rows for this process's threads and the autocast dtype."""
        elem = 4 if self.amp_dtype is None else torch.finfo(self.amp_dtype).bits // 8
        self.env.chunk_rows = auto_chunk_rows(self.cfg.train.chunk_rows, self.env.device, self.D,
                                              torch.get_num_threads(), elem)
        return self.env.chunk_rows

    @property
    def G_eval(self) -> torch.nn.Module:
        """The generator to evaluate and checkpoint: the weight average when train.ema > 0, else G."""
        return self.G_ema if self.G_ema is not None else self.G

    @torch.no_grad()
    def update_ema(self) -> None:
        """G_ema <- d G_ema + (1 - d) G with d = min(ema, (1 + k) / (10 + k)) at update k (a short warm-up, so that
        the average does not remember the random initialisation); buffers are copied."""
        import copy

        base = getattr(self.G, "module", self.G)  # the DDP peer wraps G
        if self.G_ema is None:
            self.G_ema = copy.deepcopy(base).requires_grad_(False)
            self.ema_steps = 0
        k = self.ema_steps
        d = min(self.cfg.train.ema, (1.0 + k) / (10.0 + k))
        torch._foreach_lerp_(list(self.G_ema.parameters()), list(base.parameters()), 1.0 - d)
        for b_ema, b in zip(self.G_ema.buffers(), base.buffers()):
            b_ema.copy_(b)
        self.ema_steps = k + 1

    # ------------------------------------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: networks, optimizers, scalers, RNGs, data subset."""
        st = self.state
        return {
            "epoch": st.epoch, "time_s": st.time_s, "stats": dict(st.stats), "rank": self.rank,
            "environment": self.env.name,
            "generator": self.G.state_dict(), "discriminator": self.D.state_dict(),
            "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict(),
            "scaler_g": self.scaler_g.state_dict(), "scaler_d": self.scaler_d.state_dict(),
            "rng_env": self.env.gen.get_state(), "rng_torch": torch.get_rng_state(),
            # the data subset: its key (a pure function of it gives the rows: sagips/io/shard.py for a file, the
            # seeded rng handed to attach_data otherwise), not the rows; the indices only where no key was recorded
            # (a Trainer used outside sagips.run)
            "data_key": dict(self.data_key or {}),
            **({"subset_idx": torch.as_tensor(self.env.subset_idx)}
               if getattr(self.env, "subset_idx", None) is not None and not self.data_key else {}),
            "env_state": self.env.extra_state(),
            **({"generator_ema": self.G_ema.state_dict(), "ema_steps": self.ema_steps} if self.G_ema is not None
               else {}),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd.get("environment") != self.env.name:
            from sagips.config import ConfigError

            raise ConfigError(f"--resume: the saved state is from environment {sd.get('environment')!r}, "
                              f"this run is {self.env.name!r}")
        self.G.load_state_dict(sd["generator"])
        self.D.load_state_dict(sd["discriminator"])
        self.opt_g.load_state_dict(sd["opt_g"])
        self.opt_d.load_state_dict(sd["opt_d"])
        self.scaler_g.load_state_dict(sd["scaler_g"])
        self.scaler_d.load_state_dict(sd["scaler_d"])
        self.env.gen.set_state(sd["rng_env"])
        torch.set_rng_state(sd["rng_torch"])
        self._check_data_key(sd.get("data_key") or {})
        saved_idx = sd["subset_idx"].numpy() if "subset_idx" in sd else np.zeros(0, dtype=np.int64)
        if saved_idx.size and not sd.get("data_key") and (self.data_key or {}).get("subset") == "blocks":
            from sagips.config import ConfigError

            # a state from before issue 23: its rows were a uniform choice, which data.subset=rows rebuilds
            raise ConfigError("--resume: the saved state holds the row indices of an older version's subset; "
                              "resume with --set data.subset=rows")
        if saved_idx.size and getattr(self.env, "subset_idx", None) is not None \
                and not np.array_equal(saved_idx, self.env.subset_idx):
            self.env.select_subset(saved_idx)
        self.env.load_extra_state(sd.get("env_state", {}))
        if "generator_ema" in sd and self.cfg.train.ema > 0:
            import copy

            self.G_ema = copy.deepcopy(getattr(self.G, "module", self.G)).requires_grad_(False)
            self.G_ema.load_state_dict(sd["generator_ema"])
            self.ema_steps = int(sd["ema_steps"])
        self.state = TrainState(epoch=int(sd["epoch"]), time_s=float(sd["time_s"]), stats=dict(sd["stats"]))

    def _check_data_key(self, saved: dict[str, Any]) -> None:
        """The subset this run rebuilt from its key must be the saved state's: the same file layout, seed, fraction
        and mode, and with data.share=node the same node index. Otherwise a one-line ConfigError (sagips.run makes a
        refusal on some ranks, e.g. of the ranks now on another node, a refusal on every rank)."""
        from sagips.config import ConfigError

        now = self.data_key or {}
        if not saved or not now:
            return
        if saved.get("layout") != now.get("layout") or (saved.get("file") is None) != (now.get("file") is None):
            what = now.get("file") or "generated data"
            raise ConfigError(f"--resume: data file {what} is not the data this run was trained on "
                              f"({saved.get('file') or 'generated data'}, layout {saved.get('layout')}; now "
                              f"{now.get('layout')}); resume with the original file")
        saved, now = {"share": "rank", **saved}, {"share": "rank", **now}  # (a state from before data.share)
        diff = [k for k in ("seed", "member", "rank", "subset_fraction", "subset", "share", "node")
                if saved.get(k) != now.get(k)]
        if diff:
            changes = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise ConfigError(f"--resume: the data subset's key changed ({changes}); resume with the run's settings")

    def save_state(self) -> None:
        self.states.save(self.state.epoch, self.state_dict())
        if self.stop_agreement is None:  # a single rank: its own state is complete at once
            self.state_complete(self.state.epoch)

    def state_complete(self, epoch: int) -> None:
        """Every rank holds the state of `epoch`: old states may go, and on_state_complete (rank 0: the marker)."""
        if self.states.set_complete(epoch) and self.on_state_complete is not None:
            self.on_state_complete(epoch)

    # ------------------------------------------------------------------------------------------------ one epoch
    def _autocast(self):
        return torch.autocast(self.env.device.type, dtype=self.amp_dtype or torch.float32,
                              enabled=self.amp_dtype is not None)

    def check_environment(self, real: Any) -> None:
        """The first-epoch checks (sagips.checks) on rank 0, their verdict shared, so that every rank raises the
        same one-line FirstEpochCheckError before anything is exchanged."""
        from sagips.checks import FirstEpochCheckError, first_epoch_problem

        problem = first_epoch_problem(self.env, self.G, real) if self.rank == 0 else None
        if self.share is not None:
            problem = self.share(problem)
        self.checked = True
        if problem:
            raise FirstEpochCheckError(problem)

    def step(self, epoch: int) -> dict[str, float]:
        env, G, D, rng = self.env, self.G, self.D, self.ranges
        bad_d = 0
        for _ in range(env.n_critic):
            with rng(CRITIC):
                with rng(DATA):
                    real = env.real_batch()
                if not self.checked:
                    self.check_environment(real)
                with torch.no_grad():
                    fake = env.synthesize(G, real)
                with self._autocast():
                    loss_d = env.d_loss(D, real, fake)
                if self.d_exchange is not None:
                    bad_d += self._exchanged_critic_step(loss_d, epoch)
                    continue
                self.opt_d.zero_grad(set_to_none=True)
                if not torch.isfinite(loss_d):  # never let a non-finite loss reach the discriminator's weights
                    bad_d += 1
                    continue
                self.scaler_d.scale(loss_d).backward()
                self.scaler_d.step(self.opt_d)
                self.scaler_d.update()
        with rng(GENERATOR):
            with rng(DATA):
                real = env.real_batch()
            fake = env.synthesize(G, real)  # the pipeline runs in float32, outside autocast
            if self.delay_s:  # the straggler knob: a slow pipeline on chosen ranks
                time.sleep(self.delay_s)
            if epoch == self.fail_epoch:
                raise FaultDrill(f"pipeline.fail_epoch: the fault drill's error on rank {self.rank} at epoch {epoch}")
            # The generator step needs only the critic's input gradients: with the critic's weights frozen while the
            # graph is built, backward skips their weight-gradient matmuls (a third of the critic's work here).
            d_weights = [p for p in D.parameters() if p.requires_grad]
            try:
                for p in d_weights:
                    p.requires_grad_(False)
                with self._autocast():
                    loss_g, extras = env.g_loss(D, real, fake)
            finally:
                for p in d_weights:
                    p.requires_grad_(True)
            self.grads.zero_()
            self.scaler_g.scale(loss_g).backward()
            self.scaler_g.unscale_(self.opt_g)  # exchange true gradients: every rank has its own loss scale
            # A NaN/Inf gradient must not poison the other ranks through the exchange: this rank then contributes
            # zeros with weight 0 (dropped from the mean) and still takes part, so that nobody waits for it.
            finite = self.grads.is_finite()
            if not finite:
                self.grads.zero_()
            self.bad_steps = 0 if finite else self.bad_steps + 1
            stats = {"bad_grad": int(not finite), "bad_loss_d": bad_d}
            if self.exchange is not None:
                with rng(EXCHANGE):
                    buf = self.grads.offload()
                    stats.update(self.exchange(buf, epoch, weight=1.0 if finite else 0.0) or {})
                    self.grads.load_back()
                # The step follows the EXCHANGED gradient, not this rank's own: a rank whose gradient overflowed
                # (fp16) applies the group's mean like the others (GradScaler.step would skip it on the local
                # overflow, and the replicas would drift); every rank skips only where nobody contributed (the mean
                # is all zeros). So ranks that exchange in step (allreduce, arar, arar-arar; all ranks on an outer
                # epoch) keep identical weights. Biases are exchanged only with comm.exchange_bias: otherwise they
                # train on local gradients and may differ, as in the paper. In rma-arar-arar the ranks of a group
                # combine what has arrived, so their weights differ between outer epochs by design.
                if self.grads.is_finite() and bool(self.grads.flat.any()):
                    self.opt_g.step()
            elif finite:
                self.scaler_g.step(self.opt_g)
            self.scaler_g.update()  # the loss scale still backs off on this rank's own overflow
            if self.average_weights is not None and self.average_weights.due(epoch):
                with rng(EXCHANGE):
                    self._average_weights(epoch)
            if self.cfg.train.ema > 0:
                self.update_ema()
        if self.bad_steps >= self.cfg.train.max_bad_steps:
            raise NonFiniteError(f"rank {self.rank}: {self.bad_steps} generator steps in a row had NaN/Inf "
                                 f"gradients (epoch {epoch}, train.max_bad_steps={self.cfg.train.max_bad_steps}); "
                                 f"lower the learning rates or check the pipeline and data")
        return {"loss_d": loss_d, "loss_g": loss_g, **extras, **stats}

    def _exchanged_critic_step(self, loss_d: torch.Tensor, epoch: int) -> int:
        """hvd: one critic step on the gradient averaged over all ranks (like the generator's: a rank whose loss or
        gradient is not finite contributes zeros with weight 0 and still takes part). Returns 1 for a bad loss."""
        g = self.d_grads
        g.zero_()
        finite = good_loss = bool(torch.isfinite(loss_d))  # one device sync
        if finite:
            self.scaler_d.scale(loss_d).backward()
            self.scaler_d.unscale_(self.opt_d)
            if not g.is_finite():
                g.zero_()
                finite = False
        buf = g.offload()
        self.d_exchange(buf, epoch, weight=1.0 if finite else 0.0)
        g.load_back()
        if g.is_finite() and bool(g.flat.any()):  # as for the generator: every rank steps on the same mean
            self.opt_d.step()
        if good_loss:  # unscale_ ran: the loss scale follows this rank's own overflow
            self.scaler_d.update()
        return int(not good_loss)

    @torch.no_grad()
    def _average_weights(self, epoch: int) -> None:
        """comm.outer_sync=weights: the generator's weights and Adam moments, and its weight average (train.ema) where
        there is one, <- their mean over all ranks (one Allreduce of one flat float32 buffer), so that the generator
        that is checkpointed is the same on every rank too. Moments that this rank has not made yet count as zeros
        and are not written back."""
        G = getattr(self.G, "module", self.G)
        params = list(G.parameters())
        tensors = [p.data for p in params]
        for p in params:
            st = self.opt_g.state.get(p, {})
            tensors += [st.get(k, torch.zeros_like(p)) for k in ("exp_avg", "exp_avg_sq")]
        n_moments = len(tensors)
        if self.G_ema is not None:  # made at the same epoch on every rank, so every buffer has the same length
            tensors += [p.data for p in self.G_ema.parameters()]
        flat = torch.cat([t.reshape(-1).float() for t in tensors]).cpu().numpy()
        self.average_weights(flat, epoch)
        back = torch.from_numpy(flat)
        offset = 0
        for i, t in enumerate(tensors):
            k = t.numel()
            if i >= n_moments:  # the weight average's parameters
                t.copy_(back[offset:offset + k].view_as(t))
                offset += k
                continue
            owner = params[i] if i < len(params) else params[(i - len(params)) // 2]
            key = None if i < len(params) else ("exp_avg", "exp_avg_sq")[(i - len(params)) % 2]
            if key is None or key in self.opt_g.state.get(owner, {}):
                t.copy_(back[offset:offset + k].view_as(t))
            offset += k

    # ------------------------------------------------------------------------------------------------ the run
    def fit(self, progress: bool = True) -> TrainState:
        t, st = self.cfg.train, self.state
        bar = self._progress_bar(progress)
        try:
            while st.epoch < t.epochs:
                epoch = st.epoch + 1
                with self.ranges(EPOCH):
                    if t.lr_final != 1.0 or t.lr_d_final not in (None, 1.0):
                        self._set_lr(epoch)
                    t0 = time.perf_counter()
                    out = self.step(epoch)
                    st.time_s += time.perf_counter() - t0
                    st.epoch = epoch
                    for k, v in out.items():  # integer counters from the exchange are summed over the run
                        if isinstance(v, int):
                            st.stats[k] = st.stats.get(k, 0) + v
                    if epoch == 1 or epoch % t.checkpoint_every == 0 or epoch == t.epochs:
                        save_checkpoint(self.out_dir, self.rank, epoch, st.time_s, self.G_eval, self.env.name)
                    if self.logs_at(epoch):
                        with self.ranges(LOG):
                            self._log(epoch, out, bar)
                    stop = self.stop_requested  # read once: a signal landing now is handled after the next epoch
                    if self.stop_agreement is not None:  # every rank stops at the same, agreed epoch
                        target = self.stop_agreement.after_epoch(epoch, stop, self.states.newest)
                        self.state_complete(self.stop_agreement.complete)
                        stop = target is not None and epoch >= target
                    if epoch % t.state_every == 0 or epoch == t.epochs or stop:
                        self.save_state()
                if bar is not None:
                    bar.update(1)
                if stop and epoch < t.epochs:
                    raise StopRequested(epoch)
        finally:
            if bar is not None:
                bar.close()
            if self.metrics is not None:
                self.metrics.close()
        return st

    def logs_at(self, epoch: int) -> bool:
        """Whether epoch `epoch` logs (and, where the ranks gather it, scores) the quality."""
        t = self.cfg.train
        return epoch == 1 or epoch % t.log_every == 0 or epoch == t.epochs

    def _set_lr(self, epoch: int) -> None:
        """lr(e) = lr0 * final ** ((e - 1) / (epochs - 1)), final = lr_final (lr_d_final for the discriminator, where
        set): a pure function of the epoch (resumable)."""
        t = self.cfg.train
        x = (epoch - 1) / max(1, t.epochs - 1)
        d_final = t.lr_final if t.lr_d_final is None else t.lr_d_final
        for opt, lr0, final in ((self.opt_g, t.lr_g, t.lr_final), (self.opt_d, t.lr_d, d_final)):
            for group in opt.param_groups:
                group["lr"] = lr0 * final ** x

    def _log(self, epoch: int, out: dict[str, Any], bar) -> None:
        if not self.computes_quality:
            return
        q = self.env.quality(self.G_eval, self.cfg.train.quality_samples)
        all_q = self.gather_quality(q) if self.gather_quality is not None else [q]
        if not self.is_root:
            return
        run_q = self.env.combine_quality(all_q) if len(all_q) > 1 else q
        self.last_quality = run_q
        rec = {"epoch": epoch, "time_s": round(self.state.time_s, 6),
               **{k: (float(v.detach()) if torch.is_tensor(v) else v) for k, v in out.items()},
               **{k: v for k, v in self.state.stats.items()},
               "quality_ranks": len(all_q), "quality_of": "all ranks" if len(all_q) == self.world_size else "rank 0",
               **run_q}
        self.metrics.write(rec)
        if bar is not None:
            bar.set_postfix(self.env.progress_fields(run_q), refresh=False)

    def _progress_bar(self, progress: bool):
        if not (progress and self.is_root and self.cfg.train.progress):
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.train.epochs, initial=self.state.epoch, unit="epoch", dynamic_ncols=True,
                    file=sys.stderr, mininterval=1.0, desc=self.progress_desc or self.cfg.mode)
