"""The per-rank epoch loop: critic step(s), generator step, gradient exchange, checkpoints and metrics.

Each rank owns a generator replica and its *own* discriminator. Only the generator's gradients cross ranks: after
the generator backward, the trainer hands its flat gradient buffer to one exchange hook (`sagips.comm.modes`),
then steps the generator's optimizer with whatever came back.

One epoch is one step definition (`Trainer.plan`): device segments separated by host points (the exchange, the
straggler sleep, the fault drill). Inside a segment nothing reads a device value on the host: the NaN guard decides on
the device (sagips/guard.py), optimizers skip a bad step on the device (fused Adam's `found_inf`), the learning-rate
schedule is a device tensor, and the guard's counts are read only at check epochs (log, state, every
`max_bad_steps` epochs) or with the exchange's own device-to-host copy. So the same segments run eagerly or are
recorded once as CUDA graphs and replayed (train.cuda_graph, sagips/graph.py).
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

from sagips.adam import make_adam
from sagips.chunked import auto_chunk_rows
from sagips.comm.buffer import GradBuffer
from sagips.config import Config, ConfigError
from sagips.environment import Environment
from sagips.io.checkpoint import save_checkpoint, unwrapped_keys
from sagips.models import unwrap
from sagips.io.metrics import MetricsWriter
from sagips.guard import BadSteps
from sagips.io.state import RankStates
from sagips.profiling import CRITIC, DATA, EPOCH, EXCHANGE, GENERATOR, LOG, Ranges

Exchange = Callable[[np.ndarray, int], dict]

#: the precision probe's largest batch (rows): the critic's time per row no longer depends on the batch beyond it
PROBE_MAX_ROWS = 1 << 16
#: seconds between progress-bar updates where stderr is not a terminal (a batch job's log, mpiexec's pipe)
PROGRESS_PIPE_S = 10.0


def select_device(kind: str, local_rank: int) -> torch.device:
    """cuda:(local_rank % device_count) when CUDA is present (and allowed), else cpu."""
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but CUDA is not available on this host; use train.device=auto")
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


def _is_fused(opt: torch.optim.Optimizer) -> bool:
    return bool(opt.defaults.get("fused"))


def _chain(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    """One device segment that runs `first`, then `then`."""
    def both() -> None:
        first()
        then()
    return both


def rank_seeds(seed: int, member: int, rank: int) -> tuple[int, int]:
    """Independent (torch, numpy) seeds for one rank of one ensemble member."""
    s = np.random.SeedSequence([seed, member, rank]).generate_state(2, dtype=np.uint32)
    return int(s[0]), int(s[1])


class NonFiniteError(RuntimeError):
    """Too many generator steps in a row had non-finite gradients (its message says all: no traceback)."""


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
                 exchange: Exchange | None = None, gather_quality: Callable[[dict, int], list[dict] | None] | None = None,
                 is_root: bool = True, share: Callable[[Any], Any] | None = None, computes_quality: bool = True,
                 decide: Callable[[Callable[[], Any]], Any] | None = None):
        """share: a broadcast from rank 0 of the run (e.g. comm.bcast), so that every rank runs in the precision that
        rank 0 resolved for train.amp (auto probes the hardware once, on rank 0); None resolves it here.
        decide: runs a function on one rank of the whole job and returns its result on every rank (sagips.run: over
        the world, every member of --ensemble-size), so that train.amp=auto's probe is one decision for all members;
        called on every rank. None: `share`'s run decides alone.
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
        dev = env.device
        #: the epoch the step is in, on the device (the schedule's clock: a graph replay advances it too)
        self.epoch_t = torch.zeros((), dtype=torch.float64, device=dev)
        #: the learning rates as device tensors, read by the fused Adam kernels (None: a float set from the host)
        self.lr_t = {o: torch.full((), lr, dtype=torch.float32, device=dev) if _is_fused(o) else None
                     for o, lr in ((self.opt_g, t.lr_g), (self.opt_d, t.lr_d))}
        self._bind_lr()
        self.guard = BadSteps(dev)  #: the NaN guard's counts, on the device
        self.amp_dtype, self.precision = self._resolve_precision(share, decide)
        self.resolve_chunk_rows()
        # fp16 needs loss scaling; bf16 has float32's exponent range and does not
        scaling = self.amp_dtype == torch.float16
        self.scaler_d = torch.amp.GradScaler(env.device.type, enabled=scaling)
        self.scaler_g = torch.amp.GradScaler(env.device.type, enabled=scaling)
        hvd = cfg.mode == "hvd"  # the paper's Horovod baseline: every parameter of both networks is averaged
        self.grads = GradBuffer(self.G, exchange_bias=cfg.comm.exchange_bias or hvd)
        #: the critic's gradients in one flat buffer too (no allocation per step; hvd: averaged by d_exchange, set
        #: by sagips.run, every step)
        self.d_grads = GradBuffer(self.D, exchange_bias=True)
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
        self.stop_requested = False  #: set by a signal handler (SIGTERM from PBS): save state, then stop
        self.states = RankStates(out_dir, rank)  #: this rank's training states (--resume replaces it)
        #: called with each newer epoch whose state every rank holds (rank 0 writes the `latest` marker)
        self.on_state_complete: Callable[[int], None] | None = None
        #: agrees the stop between ranks (sagips.comm.stop.StopAgreement); None: this rank stops on its own request
        self.stop_agreement = None
        self.ranges = Ranges(t.profile, env.device)  #: named profiler ranges (train.profile; no-ops when off)
        self.G_ema: torch.nn.Module | None = None  #: train.ema > 0: the averaged generator (made at its first update)
        self.ema_k = torch.zeros((), dtype=torch.float32, device=dev)  #: its updates so far (device)
        self._plan: list[tuple[str, Callable]] | None = None  #: the step's segments (built at the first step)
        self._out: dict[str, Any] = {}  #: the step's losses (device tensors; a graph's static outputs)
        self._stats: dict[str, Any] = {}  #: the host points' results of this epoch (exchange counters)
        #: train.cuda_graph (sagips.graph.SegmentRunner; made at the first step)
        self.graphs = None

    def _resolve_precision(self, share, decide):
        """(autocast dtype, record) for train.amp on this device (sagips.precision.resolve)."""
        from sagips.precision import resolve

        def make():
            # the probe times what predicts the epoch: the critic's own batch (real + synthetic rows, up to
            # PROBE_MAX_ROWS: the time per row is flat beyond), in the row chunks this run will use in each dtype
            rows = min(PROBE_MAX_ROWS, max(256, 2 * self.env.events_per_epoch))
            return resolve(self.cfg.train.amp, self.env.device, self.D, rows, chunk_rows=self._chunk_rows_for)

        auto = self.cfg.train.amp == "auto"
        if decide is not None:
            # auto's probe is timing, and members that probed apart trained in different precisions (seen: float32
            # and bf16 in one ensemble, 1.15x and 0.77x around the 0.9 threshold); an explicit or resumed
            # precision keeps its own (run-wide) path below
            res = decide(lambda: make() if auto else None)
            if auto and res is not None:
                return res
        res = make() if share is None or self.rank == 0 else None
        return share(res) if share is not None else res

    def _chunk_rows_for(self, dtype: torch.dtype | None) -> int:
        """train.chunk_rows resolved for this process's threads and autocast dtype `dtype` (None: float32)."""
        elem = 4 if dtype is None else torch.finfo(dtype).bits // 8
        return auto_chunk_rows(self.cfg.train.chunk_rows, self.env.device, self.D, torch.get_num_threads(), elem)

    def resolve_chunk_rows(self) -> int:
        """Set env.chunk_rows from train.chunk_rows for this process's threads and the autocast dtype."""
        self.env.chunk_rows = self._chunk_rows_for(self.amp_dtype)
        return self.env.chunk_rows

    @property
    def G_eval(self) -> torch.nn.Module:
        """The generator to evaluate and checkpoint: the weight average when train.ema > 0, else G."""
        return self.G_ema if self.G_ema is not None else self.G

    @property
    def ema_steps(self) -> int:
        """Updates of the weight average so far (a host read)."""
        return int(self.ema_k.item())

    @torch.no_grad()
    def update_ema(self) -> None:
        """G_ema <- d G_ema + (1 - d) G with d = min(ema, (1 + k) / (10 + k)) at update k (a short warm-up, so that
        the average does not remember the random initialisation); buffers are copied. k and d live on the device."""
        import copy

        base = unwrap(self.G)  # (the DDP peer wraps G)
        if self.G_ema is None:
            self.G_ema = copy.deepcopy(base).requires_grad_(False)
            self.ema_k.zero_()
        k = self.ema_k
        weight = 1.0 - torch.clamp((1.0 + k) / (10.0 + k), max=self.cfg.train.ema)
        # ema += weight * (G - ema): _foreach_lerp_ would read a tensor weight on the host (no such overload);
        # _foreach_mul_ has one
        ema = list(self.G_ema.parameters())
        diff = torch._foreach_sub(list(base.parameters()), ema)
        torch._foreach_mul_(diff, weight)
        torch._foreach_add_(ema, diff)
        for b_ema, b in zip(self.G_ema.buffers(), base.buffers()):
            b_ema.copy_(b)
        k.add_(1.0)

    # ------------------------------------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: networks, optimizers, scalers, RNGs, data subset."""
        st = self.state
        return {
            "epoch": st.epoch, "time_s": st.time_s, "stats": dict(st.stats), "rank": self.rank,
            "environment": self.env.name,
            # the generator unwrapped (the DDP peer wraps it): the keys of a checkpoint, for the export and analyze
            "generator": unwrap(self.G).state_dict(), "discriminator": self.D.state_dict(),
            "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict(),
            "scaler_g": self.scaler_g.state_dict(), "scaler_d": self.scaler_d.state_dict(),
            "rng_env": self.env.gen.get_state(), "rng_torch": torch.get_rng_state(), "bad_steps": self.bad_steps,
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
            raise ConfigError(f"--resume: the saved state is from environment {sd.get('environment')!r}, "
                              f"this run is {self.env.name!r}")
        sd["generator"] = unwrapped_keys(sd["generator"])  # (a DDP state from before it was saved unwrapped)
        for name, net in (("generator", unwrap(self.G)), ("discriminator", self.D)):
            try:
                net.load_state_dict(sd[name])
            except RuntimeError as e:  # torch's message lists every tensor: one line that says what to do
                first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e))[:160]
                raise ConfigError(f"--resume: the saved {name} does not fit this config's networks ({first}); the "
                                  f"sizes of the networks (e.g. environment.hidden, layers) differ from the saved "
                                  f"run's: resume without --config, which takes the settings in its run.json") from None
        self.opt_g.load_state_dict(sd["opt_g"])
        self.opt_d.load_state_dict(sd["opt_d"])
        self._bind_lr()  # load_state_dict replaced the param groups' lr with the saved values
        self.guard.set_streak(int(sd.get("bad_steps", 0)))
        self.scaler_g.load_state_dict(sd["scaler_g"])
        self.scaler_d.load_state_dict(sd["scaler_d"])
        self.env.gen.set_state(sd["rng_env"])
        torch.set_rng_state(sd["rng_torch"])
        self._check_data_key(sd.get("data_key") or {})
        saved_idx = sd["subset_idx"].numpy() if "subset_idx" in sd else np.zeros(0, dtype=np.int64)
        if saved_idx.size and not sd.get("data_key") and (self.data_key or {}).get("subset") == "blocks":
            # a state from before issue 23: its rows were a uniform choice, which data.subset=rows rebuilds
            raise ConfigError("--resume: the saved state holds the row indices of an older version's subset; "
                              "resume with --set data.subset=rows")
        if saved_idx.size and getattr(self.env, "subset_idx", None) is not None \
                and not np.array_equal(saved_idx, self.env.subset_idx):
            self.env.select_subset(saved_idx)
        self.env.load_extra_state(sd.get("env_state", {}))
        if "generator_ema" in sd and self.cfg.train.ema > 0:
            import copy

            self.G_ema = copy.deepcopy(unwrap(self.G)).requires_grad_(False)
            self.G_ema.load_state_dict(sd["generator_ema"])
            self.ema_k.fill_(float(sd["ema_steps"]))
        self.state = TrainState(epoch=int(sd["epoch"]), time_s=float(sd["time_s"]), stats=dict(sd["stats"]))
        self.epoch_t.fill_(float(self.state.epoch))
        self._set_lr(self.state.epoch)  # the rates of the epoch reached (the next step advances them)

    def _check_data_key(self, saved: dict[str, Any]) -> None:
        """The subset this run rebuilt from its key must be the saved state's: the same file layout, seed, fraction
        and mode, and with data.share=node the same node index. Otherwise a one-line ConfigError (sagips.run makes a
        refusal on some ranks, e.g. of the ranks now on another node, a refusal on every rank)."""
        now = self.data_key or {}
        if not saved or not now:
            return
        if saved.get("file") is None and now.get("file") is None and saved.get("layout") != now.get("layout"):
            raise ConfigError(f"--resume: the generated reference data are not the ones this run was trained on "
                              f"(layout {saved.get('layout')}; now {now.get('layout')}): a setting that makes them "
                              f"changed (environment.true_params, environment.reference_events, --seed, or the "
                              f"environment's code); resume with the run's values")
        if saved.get("file") and not now.get("file"):
            raise ConfigError(f"--resume: the run was trained on data file {saved['file']}, and this resume's "
                              f"settings generate the data instead: add --set environment.data_file={saved['file']}, "
                              f"or resume without --config (it takes the run's own settings)")
        if now.get("file") and not saved.get("file"):
            raise ConfigError(f"--resume: the run was trained on generated data, not on data file {now['file']}: "
                              f"resume without environment.data_file")
        if saved.get("layout") != now.get("layout"):  # (two files)
            raise ConfigError(f"--resume: data file {now['file']} is not the data this run was trained on "
                              f"({saved['file']}, layout {saved.get('layout')}; now {now.get('layout')}); resume "
                              f"with the original file")
        saved, now = {"share": "rank", **saved}, {"share": "rank", **now}  # (a state from before data.share)
        diff = [k for k in ("seed", "member", "rank", "subset_fraction", "subset", "share", "node", "split")
                if saved.get(k) != now.get(k)]
        if diff:
            changes = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise ConfigError(f"--resume: the data subset's key changed ({changes}); resume with the run's settings")

    def save_state(self) -> None:
        self.check_guard(self.state.epoch)  # the run's bad-step counts are current in the saved stats
        self.states.save(self.state.epoch, self.state_dict())
        if self.stop_agreement is None:  # a single rank: its own state is complete at once
            self.state_complete(self.state.epoch)

    def state_complete(self, epoch: int) -> None:
        """Every rank holds the state of `epoch`: old states may go, and on_state_complete (rank 0: the marker)."""
        if self.states.set_complete(epoch) and self.on_state_complete is not None:
            self.on_state_complete(epoch)

    def _autocast(self):
        # a recorded graph must not keep autocast's casts of the weights from its recording: no cast cache there
        return torch.autocast(self.env.device.type, dtype=self.amp_dtype or torch.float32,
                              enabled=self.amp_dtype is not None, cache_enabled=self.graphs is None
                              or not self.graphs.enabled)

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

    # ------------------------------------------------------------------------------------------------ one epoch
    def step(self, epoch: int) -> dict[str, Any]:
        """One epoch: the plan's device segments (eager, or replayed graphs) and host points, in order. Returns the
        losses (device tensors: with graphs, the graph's static outputs, which the next epoch overwrites; clone what
        you keep) and the exchange's counters; reads the NaN guard only at check epochs."""
        if self._plan is None:
            self._plan = self.plan()
            self.graphs = self._segment_runner()
        self._stats = {}
        if any(lr is None for lr in self.lr_t.values()):  # Adam without a fused kernel: its lr is a float
            self._set_lr(epoch)
        for i, (kind, fn) in enumerate(self._plan):
            if kind == "host":
                fn(epoch)
            else:
                self.graphs.run(i, fn)
        self.graphs.step_done()
        if self.checks_at(epoch):
            self.check_guard(epoch)
        return {**self._out, **self._stats}

    def plan(self) -> list[tuple[str, Callable]]:
        """The epoch as ("device", fn()) segments and ("host", fn(epoch)) points; adjacent device parts are merged.

            schedule + critic step(s) + generator backward + NaN guard + D2H copy   (device)
            straggler sleep, fault drill; exchange of the generator's gradients     (host)
            H2D copy + generator step                                               (device)
            weight average (comm.outer_sync=weights)                                (host)
            weight average of the generator (train.ema)                             (device)

        hvd adds, per critic step, a host point for the critic's exchange between its backward and its step."""
        parts: list[tuple[str, Callable]] = [("device", self._advance_schedule)]
        for _ in range(self.env.n_critic):
            if self.d_exchange is not None:
                parts += [("device", self._critic_backward), ("host", self._exchange_critic),
                          ("device", self._critic_apply_exchanged)]
            else:
                parts += [("device", self._critic_step)]
        parts += [("device", self._generator_backward), ("host", self._pipeline_knobs)]
        if self.exchange is not None:
            parts += [("host", self._exchange_generator)]
        parts += [("device", self._generator_apply)]
        if self.average_weights is not None:
            parts += [("host", self._maybe_average_weights)]
        if self.cfg.train.ema > 0:
            parts += [("device", self.update_ema)]
        merged: list[tuple[str, Callable]] = []
        for kind, fn in parts:
            if kind == "device" and merged and merged[-1][0] == "device":
                merged[-1] = ("device", _chain(merged[-1][1], fn))
            else:
                merged.append((kind, fn))
        return merged

    def graph_obstacles(self) -> list[str]:
        """What keeps this step from being recorded as a CUDA graph (empty: nothing)."""
        out = []
        if self.scaler_d.is_enabled() or self.scaler_g.is_enabled():
            out.append("fp16 loss scaling (GradScaler keeps per-step state on the host)")
        if any(lr is None for lr in self.lr_t.values()):
            out.append("Adam has no fused kernel here (train.fused_adam=false or an unsupported device)")
        if self.G is not unwrap(self.G):
            out.append("a wrapped generator (the DDP baseline)")
        if self.delay_s:
            out.append("pipeline.delay_s (a host sleep inside the step)")
        why = self.env.graph_obstacle()
        if why:
            out.append(why)
        return out

    def _segment_runner(self):
        from sagips.graph import SegmentRunner, resolve

        mode = self.cfg.train.cuda_graph
        cuda = self.env.device.type == "cuda"
        use, why = resolve(mode, self.env.device, self.graph_obstacles() if cuda else [])
        if use:  # Optimizer.step refuses a capture unless its groups say so; the fused kernel ignores the flag
            for opt in (self.opt_g, self.opt_d):
                for group in opt.param_groups:
                    group["capturable"] = True
        elif cuda and self.rank == 0:
            print(f"sagips: train.cuda_graph={mode}: the step runs eagerly ({why})", file=sys.stderr, flush=True)
        return SegmentRunner(self.env.device, use, generators=[self.env.gen], fallback=mode == "auto", why=why,
                             warmup=self.cfg.train.cuda_graph_warmup, announce=self.rank == 0)

    def checks_at(self, epoch: int) -> bool:
        """Whether the step reads the NaN guard's counts at `epoch` (one device-to-host read)."""
        # (state epochs read it in save_state: the saved stats are current there)
        return epoch % self.cfg.train.max_bad_steps == 0 or self.logs_at(epoch)

    def check_guard(self, epoch: int) -> None:
        """Read the NaN guard: add its counts to the run's, and stop (NonFiniteError) after max_bad_steps bad
        generator steps in a row (seen here within max_bad_steps epochs of the last of them)."""
        counts = self.guard.take()
        stats = self.state.stats
        for k in ("bad_grad", "bad_loss_d"):
            stats[k] = stats.get(k, 0) + counts[k]
        limit = self.cfg.train.max_bad_steps
        if counts["worst"] >= limit:
            raise NonFiniteError(f"rank {self.rank}: {counts['worst']} generator steps in a row had NaN/Inf "
                                 f"gradients (seen at epoch {epoch}, train.max_bad_steps={limit}){self._where()}: "
                                 f"check the pipeline there (a simulator's or density's value or gradient), or "
                                 f"narrow environment.bounds; if it is finite there, lower the learning rates")

    def _where(self) -> str:
        """', with the generator at a=1.2, b=...': the parameters the generator predicts now (the steps that gave NaN
        were skipped, so its weights are finite), for a NaN of the pipeline in one corner of the bounds."""
        try:
            with torch.no_grad():
                p = self.env.quality(unwrap(self.G), 256)["params"]
            names = self.env.parameter_names() or [f"r_{i}" for i in range(len(p))]
            return ", with the generator at " + ", ".join(f"{n}={float(v):.4g}" for n, v in zip(names, p))
        except Exception:  # (the message stands without it)
            return ""

    @property
    def bad_steps(self) -> int:
        """Generator steps in a row, up to now, with a non-finite gradient on this rank (a host read)."""
        return int(self.guard.streak.item())

    # -- the segments (device work only: nothing here reads a device value on the host) --------------------------
    def _advance_schedule(self) -> None:
        """epoch_t += 1, and the learning rates of that epoch (a pure function of it, so a resume continues it)."""
        self.epoch_t.add_(1.0)
        t = self.cfg.train
        if t.lr_final == 1.0 and t.lr_d_final in (None, 1.0):
            return
        x = (self.epoch_t - 1.0) / max(1, t.epochs - 1)
        for opt, lr0, final in self._schedule():
            lr = self.lr_t[opt]
            if lr is not None:
                lr.copy_(lr0 * torch.pow(final, x))

    def _critic_forward(self) -> torch.Tensor:
        env = self.env
        with self.ranges(CRITIC):
            with self.ranges(DATA):
                real = env.real_batch()
            if not self.checked:
                self.check_environment(real)
            with torch.no_grad():
                fake = env.synthesize(self.G, real)
            with self._autocast():
                loss_d = env.d_loss(self.D, real, fake)
        self._out["loss_d"] = loss_d
        return loss_d

    def _critic_step(self) -> None:
        """One critic step; a non-finite loss is skipped on the device (never reaches the critic's weights)."""
        loss_d = self._critic_forward()
        self.d_grads.zero_()
        self.scaler_d.scale(loss_d).backward()
        self.scaler_d.unscale_(self.opt_d)
        bad_loss = ~torch.isfinite(loss_d)
        bad = bad_loss
        if self.scaler_d.is_enabled():  # fp16: an overflowed gradient is skipped too, as GradScaler.step would
            bad = bad | ~torch.isfinite(self.d_grads.flat).all()
        self._optimizer_step(self.opt_d, bad)
        self.scaler_d.update()
        self.guard.critic(bad_loss)

    def _critic_backward(self) -> None:
        """hvd: the critic's backward, its NaN guard, and the D2H copy of its gradients for the exchange."""
        loss_d = self._critic_forward()
        g = self.d_grads
        g.zero_()
        self.scaler_d.scale(loss_d).backward()
        self.scaler_d.unscale_(self.opt_d)
        self.guard.critic(~torch.isfinite(loss_d))
        g.mask_non_finite()
        g.offload_async()

    def _exchange_critic(self, epoch: int) -> None:
        g = self.d_grads
        with self.ranges(EXCHANGE):
            self.d_exchange(g.wait(), epoch, weight=g.weight)

    def _critic_apply_exchanged(self) -> None:
        """hvd: every rank steps on the same mean (skipped where it is not finite or nobody contributed)."""
        g = self.d_grads
        g.load_back()
        self._optimizer_step(self.opt_d, ~g.usable())
        self.scaler_d.update()  # the loss scale follows this rank's own overflow

    def _generator_backward(self) -> None:
        env, G, D = self.env, self.G, self.D
        with self.ranges(GENERATOR):
            with self.ranges(DATA):
                real = env.real_batch() if env.g_loss_reads_real else None
            fake = env.synthesize(G, real)  # the pipeline runs in float32, outside autocast
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
            # zeros with weight 0 (dropped from the mean) and still takes part, so that nobody waits for it. The
            # verdict travels to the host with the gradients (GradBuffer.weight).
            ok = self.grads.mask_non_finite()
            self.guard.generator(ok)
            if self.exchange is not None:
                self.grads.offload_async()
        self._out.update(loss_g=loss_g, **extras, bad_grad=(~ok).to(torch.float32))

    def _pipeline_knobs(self, epoch: int) -> None:
        if self.delay_s:  # the straggler knob: a slow pipeline on chosen ranks
            time.sleep(self.delay_s)
        if epoch == self.fail_epoch:
            raise FaultDrill(f"pipeline.fail_epoch: the fault drill's error on rank {self.rank} at epoch {epoch}")

    def _exchange_generator(self, epoch: int) -> None:
        g = self.grads
        with self.ranges(EXCHANGE):
            buf = g.wait()  # where the host waits anyway: the gradients and the guard's verdict are in host memory
            self._stats.update(self.exchange(buf, epoch, weight=g.weight) or {})

    def _generator_apply(self) -> None:
        # The step follows the EXCHANGED gradient, not this rank's own: a rank whose gradient overflowed (fp16)
        # applies the group's mean like the others (GradScaler.step would skip it on the local overflow, and the
        # replicas would drift); every rank skips only where nobody contributed (the mean is all zeros). So ranks
        # that exchange in step (allreduce, arar, arar-arar; all ranks on an outer epoch) keep identical weights.
        # Biases are exchanged only with comm.exchange_bias: otherwise they train on local gradients and may differ,
        # as in the paper. In rma-arar-arar the ranks of a group combine what has arrived, so their weights differ
        # between outer epochs by design.
        if self.exchange is not None:
            self.grads.load_back()  # the H2D copy of the mean: device work of this segment
            skip = ~self.grads.usable()
        else:
            skip = self.grads.ok.eq(0)
        self._optimizer_step(self.opt_g, skip)
        self.scaler_g.update()  # the loss scale still backs off on this rank's own overflow

    def _maybe_average_weights(self, epoch: int) -> None:
        if self.average_weights.due(epoch):
            with self.ranges(EXCHANGE):
                self._average_weights(epoch)

    def _optimizer_step(self, opt: torch.optim.Optimizer, skip: torch.Tensor) -> None:
        """opt.step(), skipped on the device where `skip` (0-dim bool) is true: the fused kernel reads it as its
        `found_inf` (the flag GradScaler hands it) and leaves weights, moments and step count as they were. Adam
        without a fused kernel reads `skip` on the host (the one host read left; such a step is never recorded)."""
        if self.lr_t[opt] is None:
            if not bool(skip):
                opt.step()
            return
        opt.grad_scale, opt.found_inf = None, skip.to(torch.float32)
        try:
            opt.step()
        finally:
            del opt.grad_scale, opt.found_inf

    @torch.no_grad()
    def _average_weights(self, epoch: int) -> None:
        """comm.outer_sync=weights: the generator's weights and Adam moments, and its weight average (train.ema) where
        there is one, <- their mean over all ranks (one Allreduce of one flat float32 buffer), so that the generator
        that is checkpointed is the same on every rank too. Moments that this rank has not made yet count as zeros
        and are not written back."""
        G = unwrap(self.G)
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
        self.epoch_t.fill_(float(st.epoch))  # the device's clock starts where the run stands (0, or a resume)
        try:
            while st.epoch < t.epochs:
                epoch = st.epoch + 1
                with self.ranges(EPOCH):
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
                            self.env.adapt(self.G_eval)
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

    def _schedule(self):
        """(optimizer, lr0, final) of each network: lr(e) = lr0 * final ** ((e - 1) / (epochs - 1))."""
        t = self.cfg.train
        d_final = t.lr_final if t.lr_d_final is None else t.lr_d_final
        return ((self.opt_g, t.lr_g, t.lr_final), (self.opt_d, t.lr_d, d_final))

    def _bind_lr(self) -> None:
        """Make each fused Adam's param groups read the device learning rate (after construction or a load)."""
        for opt, lr in self.lr_t.items():
            if lr is not None:
                for group in opt.param_groups:
                    group["lr"] = lr

    def _set_lr(self, epoch: int) -> None:
        """The schedule's rates of `epoch` set from the host (lr_final, lr_d_final: a pure function of the epoch, so
        a resume continues it): a float for Adam without a fused kernel, a fill of the device tensor otherwise
        (on resume; each step then advances it on the device, `_advance_schedule`)."""
        x = (epoch - 1) / max(1, self.cfg.train.epochs - 1)
        for opt, lr0, final in self._schedule():
            lr = lr0 * final ** x
            if self.lr_t[opt] is not None:
                self.lr_t[opt].fill_(lr)
            else:
                for group in opt.param_groups:
                    group["lr"] = lr

    def _log(self, epoch: int, out: dict[str, Any], bar) -> None:
        if not self.computes_quality:
            return
        q = self.env.quality(self.G_eval, self.cfg.train.quality_samples)
        all_q = self.gather_quality(q, epoch) if self.gather_quality is not None else [q]
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

        # into a file or a pipe (a batch job's log, or mpiexec's forwarding) a bar is a line per update: one every
        # PROGRESS_PIPE_S (seen: 754 updates, 77 kB, in a 4-minute job of 4 members at 1 s)
        every = 1.0 if sys.stderr.isatty() else PROGRESS_PIPE_S
        return tqdm(total=self.cfg.train.epochs, initial=self.state.epoch, unit="epoch", dynamic_ncols=True,
                    file=sys.stderr, mininterval=every, desc=self.progress_desc or self.cfg.mode)
