"""Ten minutes on Polaris before a large run: one verdict per question that only a real job can answer.

    qsub -A PROJECT launch/polaris/validate.pbs                     # 2 nodes of the debug queue, 15-minute walltime
    python launch/polaris/validate.py run --out DIR -- mpiexec -n 4  # anywhere: one host, CPU only (the test suite)

`run` is the driver: one process, outside mpiexec. It launches each step below under the launch prefix given after
`--` (on Polaris: mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth --hostfile $PBS_NODEFILE set_affinity_gpu.sh),
with a time limit, reads what the step wrote, prints one line per question

    validate: <question id>: pass|fail|skipped|timed out: <detail>

as soon as it is known, and appends it at once to DIR/verdicts.jsonl (one JSON object a line, each one write() of
an O_APPEND file: a walltime kill loses no verdict already known); at the end it writes the summary and the data
behind every verdict to DIR/validate.json (attach both to a bug report). Exit status 1 when a verdict is `fail` or
`timed out`. A question that needs Polaris (PALS, GPUs, two nodes) is `skipped: <reason>` elsewhere. A check that
runs out of its own time (its step's limit, validate's --budget-s, or the job's walltime: SIGTERM) is `timed out`.
Every input a check depends on is explicit (--log-every, --state-every, --kill-after-epoch, --fail-epoch,
--drill-timeout-s), whatever the preset says, and a combination that cannot pass (an epoch time from fewer than 3
records) is refused at the start.

The steps reuse the package, they do not re-implement it:
  pmi+rma_shared  `validate.py ranks` with SAGIPS_SUPERVISOR=1: sagips.supervise forks the rank before MPI_Init, as
                  `python -m sagips.run` does; the child must find its launcher (one world of N ranks, MPI rank =
                  launcher rank). Then sagips.comm.rma.RmaExchange with the shared backend, inner groups = nodes
                  (sagips.comm.topology), a few thousand exchanges with decodable payloads: no torn or mixed
                  contribution, none used twice, none older than max_staleness, ever used.
  kill            `validate.py train`: `python -m sagips.run` (sagips.run.main) in which one rank kills itself with
                  SIGKILL once the run's state reached epoch E. Verdicts: the job ends within comm.timeout_s of the
                  supervisor's line that names the rank; before training, each rank's torch threads
                  (sagips.trainer.threads_per_rank under the launcher's CPU binding), its GPU, and optiGAN's
                  DataLoader once (forkserver workers, whose AF_UNIX socket lives under TMPDIR); the epoch time
                  (metrics.jsonl) against the paper's A100 figure.
  pmi0+rma_allocate  the PMI check with SAGIPS_SUPERVISOR=0 (no fork); then the RMA stress with the allocate
                  backend (Win.Allocate + Put + Flush) and ONE group over all ranks, so that it spans the nodes: the
                  path that Cray MPICH's one-sided bugs on Slingshot hit (docs/polaris.md). If it fails or hangs, it
                  is run once more with FI_MR_CACHE_MONITOR=disabled, to tell whether that workaround helps here.
  error           `python -m sagips.run` with pipeline.fail_epoch / pipeline.fail_ranks (the fault drill): the job
                  ends within comm.timeout_s of the line that names the failed rank.
DRY_RUN=1 (or --dry-run): print each step's command line instead of running it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]

# The paper's A100 epoch time at its settings: derived from the paper (section VI-C3), as in
# benchmarks/scaling_model.py (A100_EPOCH_S, with its derivation); not a measurement.
PAPER_EPOCH_S = 0.035
PAPER_CONFIG = "configs/proxy1d.yaml"

QUESTIONS = {
    "pmi_supervised": "SAGIPS_SUPERVISOR=1: does each rank, forked before MPI_Init, still reach its launcher's PMI?",
    "pmi_unsupervised": "SAGIPS_SUPERVISOR=0: does each rank reach PMI (no fork)?",
    "rma_shared": "RMA exchange, shared backend (inner group = one node): any torn, mixed, reused or too stale "
                  "contribution used?",
    "rma_allocate": "RMA exchange, allocate backend, one group spanning the nodes: any torn, mixed, reused or too "
                    "stale contribution used, or a hang?",
    "kill_drill": "a rank killed (SIGKILL) mid-run: does the job end within comm.timeout_s, naming the rank?",
    "error_drill": "an error on one rank mid-run (pipeline.fail_epoch): does the job end within comm.timeout_s, "
                   "naming the rank?",
    "threads": "torch threads per rank under the launcher's CPU binding",
    "gpus": "the GPU each rank sees",
    "loader": "optiGAN's DataLoader after MPI_Init (forkserver workers, an AF_UNIX socket under TMPDIR): does every "
              "rank get its batches?",
    "epoch_time": f"epoch time against the paper's ({PAPER_EPOCH_S * 1e3:.0f} ms on an A100)",
}

# RMA stress payloads: sender s fills its own region with s * STRIDE + epoch (exact in float32 below 2**24), zeros
# elsewhere, so that a sum of contributions stays decodable: per sender region, one clean epoch, or nothing.
STRIDE = 100_000
MAX_GROUP = (2 ** 24) // STRIDE - 1

STATUSES = ("pass", "fail", "skipped", "timed out")
#: sagips.run settings that the drills set themselves (each from its own option): a --drill-set of one is refused
DRILL_KEYS = {"train.log_every": "--log-every", "train.state_every": "--state-every",
              "comm.timeout_s": "--drill-timeout-s", "pipeline.fail_epoch": "--fail-epoch",
              "pipeline.fail_ranks": "--victim", "train.epochs": "(the drills run until they are stopped)"}


# ================================================================================================ the rank side
def launcher_kind(environ=os.environ) -> str:
    if any(k.startswith("PALS_") for k in environ):
        return "pals"
    if "PMI_FD" in environ or "PMI_PORT" in environ or "HYDI_CONTROL_FD" in environ:
        return "hydra"
    if "PMIX_RANK" in environ:
        return "pmix"
    if "OMPI_COMM_WORLD_RANK" in environ:
        return "openmpi"
    if "SLURM_PROCID" in environ:
        return "slurm"
    return "unknown"


def _write_json(path, obj) -> None:
    from sagips.io.atomic import write_text

    write_text(path, json.dumps(obj, indent=1, default=str) + "\n")


def _pmi_record(world) -> dict:
    from sagips.supervise import is_supervised, launcher_rank

    return {"mpi_rank": world.Get_rank(), "launcher_rank": launcher_rank(), "launcher": launcher_kind(),
            "supervised": is_supervised(), "host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid(),
            "env_size": next((os.environ[k] for k in ("PMI_SIZE", "PALS_SIZE", "OMPI_COMM_WORLD_SIZE")
                              if k in os.environ), None)}


def decode(x, size: int, n: int) -> list[int]:
    """Per sender of a group of `size`: the epoch of its contribution in the sum `x` (0: none), or -1 when its region
    is not one clean contribution (torn: mixed values; or a value that no single contribution has)."""
    import numpy as np

    region, out = n // size, []
    for s in range(size):
        part = x[s * region:(s + 1) * region]
        v = float(part[0])
        if not np.all(part == part[0]):
            out.append(-1)
        elif v == 0:
            out.append(0)
        else:
            e = v - STRIDE * s
            out.append(int(e) if 1 <= e < STRIDE and e == int(e) else -1)
    return out


def payload(sender: int, size: int, n: int, epoch: int):
    import numpy as np

    x = np.zeros(n, np.float32)
    region = n // size
    x[sender * region:(sender + 1) * region] = sender * STRIDE + epoch
    return x


class StressLog:
    """What one rank saw in the stress loop; `bad` counts results that must never happen."""

    def __init__(self, me: int, size: int, max_staleness: int):
        self.me, self.size, self.max_staleness = me, size, max_staleness
        self.last = [0] * size
        self.exchanges = self.used = self.torn = self.stale = self.bad = 0
        self.first_bad: str | None = None

    def _flag(self, what: str) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad = what

    def check(self, epoch: int, x, n: int, stats: dict) -> None:
        got = decode(x, self.size, n)
        self.exchanges += 1
        self.torn += stats.get("rma_torn", 0)
        self.stale += stats.get("rma_stale", 0)
        used = 0
        if got[self.me] != epoch:
            self._flag(f"epoch {epoch}: own region holds {got[self.me]}")
        for s, e in enumerate(got):
            if s == self.me or e == 0:
                continue
            if e < 0:
                self._flag(f"epoch {epoch}: a torn or mixed contribution of sender {s} was used")
                continue
            used += 1
            if epoch - e > self.max_staleness:
                self._flag(f"epoch {epoch}: sender {s}'s epoch {e} used, older than max_staleness")
            if e <= self.last[s]:
                self._flag(f"epoch {epoch}: sender {s}'s epoch {e} used again or out of order (last {self.last[s]})")
            self.last[s] = max(self.last[s], e)
        self.used += used
        if stats.get("rma_used") != used:
            self._flag(f"epoch {epoch}: stats say {stats.get('rma_used')} used, the buffer holds {used}")

    def summary(self) -> dict:
        return {"exchanges": self.exchanges, "used": self.used, "torn_skipped": self.torn,
                "stale_dropped": self.stale, "bad": self.bad, "first_bad": self.first_bad}


def rma_stress(world, inner_size: int, backend: str, exchanges: int, n: int, max_staleness: int,
               timeout_s: float, seed: int = 0) -> dict:
    """`exchanges` RMA exchanges in every inner group, checked one by one (StressLog). Collective over `world`."""
    import numpy as np

    from sagips.comm.rma import RmaExchange
    from sagips.comm.topology import build_topology

    topo = build_topology(world, inner_size)
    inner = topo.inner
    size, me = inner.Get_size(), inner.Get_rank()
    if size > MAX_GROUP:
        raise ValueError(f"an RMA group of {size} ranks is larger than the stress payload can encode ({MAX_GROUP})")
    n = max(n // size, 1) * size
    group_hosts = sorted(set(inner.allgather(socket.gethostname())))
    log = StressLog(me, size, max_staleness)
    rng = np.random.default_rng([seed, world.Get_rank()])
    t0 = time.perf_counter()
    with RmaExchange(inner, n, max_staleness=max_staleness, timeout_s=timeout_s, backend=backend) as ex:
        used_backend = ex.backend
        ex.barrier()
        t0 = time.perf_counter()
        for epoch in range(1, exchanges + 1):
            if rng.random() < 0.1:  # uneven pace: readers meet slots being rewritten, contributions go stale
                time.sleep(float(rng.uniform(0.0, 0.002)))
            x = payload(me, size, n, epoch)
            stats = ex.exchange(x, epoch, average=False)
            log.check(epoch, x, n, stats)
        seconds = time.perf_counter() - t0
        ex.barrier()
    topo.free()
    return {"backend": used_backend, "group": topo.group_index, "group_size": size, "group_hosts": len(group_hosts),
            "floats": n, "seconds": round(seconds, 3), **log.summary()}


def _apply_env(items: list[str]) -> None:
    """--env KEY=VALUE: set in this process before the supervisor and MPI read them (launchers differ in how, and
    whether, they pass the driver's environment on: this way it does not matter)."""
    for item in items:
        key, _, value = item.partition("=")
        os.environ[key] = value


def ranks_main(args) -> int:
    """Under the launcher: the PMI check, then (optionally) the RMA stress; rank 0 writes args.out."""
    _apply_env(args.env)
    from sagips.supervise import supervise

    supervise()  # before numpy and MPI, exactly where sagips.run calls it (SAGIPS_SUPERVISOR=0: no fork)
    import sagips.comm  # noqa: F401  (first: the MPI thread level)

    # isort: split
    from mpi4py import MPI

    from sagips.comm.watchdog import gather_json

    world = MPI.COMM_WORLD
    t0 = time.time()
    result = {"step": args.step, "world_size": world.Get_size(),
              "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
              "ranks": gather_json(world, _pmi_record(world), timeout_s=args.timeout_s, what="validate: pmi")}
    if world.Get_rank() == 0:  # the PMI answer stands even if the RMA stress below hangs
        _write_json(args.out, result)
    if args.rma:
        inner = world.Get_size() if args.inner_size < 0 else args.inner_size
        mine = rma_stress(world, inner, args.backend, args.exchanges, args.floats, args.max_staleness, args.timeout_s)
        result["rma"] = gather_json(world, mine, timeout_s=args.timeout_s, what="validate: rma")
    result["seconds"] = round(time.time() - t0, 3)
    if world.Get_rank() == 0:  # (singletons, when the rank did not reach PMI: each is rank 0 of a world of 1)
        _write_json(args.out, result)
    return 0


def _placement(world, requested_threads: int = 0) -> dict:
    """This rank's CPUs, torch threads (as sagips.run computes them for train.threads=requested_threads) and GPU."""
    import torch
    from mpi4py import MPI

    from sagips.trainer import affinity, select_device, threads_per_rank

    # the same inputs as sagips.run's _place: the node's ranks and every rank's CPU affinity there
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    own = affinity()
    node_cpus = [set(c) for c in node.allgather(sorted(own))]
    local_rank = node.Get_rank()
    node.Free()
    rec = {"rank": world.Get_rank(), "host": socket.gethostname(), "local_rank": local_rank, "cpus": sorted(own),
           "threads": threads_per_rank(requested_threads, own, node_cpus), "ranks_on_node": len(node_cpus),
           "async_progress": os.environ.get("MPICH_ASYNC_PROGRESS") == "1",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda": torch.cuda.is_available(),
           "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    device = select_device("auto", local_rank)
    rec["device"] = str(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        rec["gpu"] = {"name": props.name, "uuid": str(getattr(props, "uuid", "")),
                      "pci_bus_id": getattr(props, "pci_bus_id", None),
                      "memory_gib": round(props.total_memory / 2 ** 30, 1)}
    return rec


def _set_value(argv: list[str], key: str, default=None):
    """The value of the last `--set key=value` in a sagips.run argv (as a string), or default."""
    found = default
    for a, b in zip(argv, argv[1:]):
        if a == "--set" and b.startswith(key + "="):
            found = b.partition("=")[2]
    return found


def _loader_check(batches: int = 3, workers: int = 2) -> dict:
    """optiGAN's own DataLoader path (environment.loader=dataloader, loader_start=forkserver) on this rank after
    MPI_Init, on a small table: the forkserver binds an AF_UNIX socket under TMPDIR (ALCF's known issue "AF_UNIX path
    too long" under mpiexec), and its workers must deliver exactly the batches BootstrapBatches defines."""
    import tempfile

    tmp = tempfile.gettempdir()
    rec = {"tmpdir": tmp, "socket_path_bytes": len(tmp) + 33, "workers": workers}
    t0 = time.time()
    env = None
    try:
        import torch

        from sagips_environments.optigan.env import BootstrapBatches, OptiGAN, OptiGANConfig

        env = OptiGAN(OptiGANConfig(batch_size=64, loader="dataloader", loader_workers=workers), "cpu", seed=7)
        env.loader, env.data = "dataloader", torch.arange(9 * 500, dtype=torch.float32).reshape(500, 9)
        rec["start"] = env.cfg.loader_start
        got = [env.real_batch() for _ in range(batches)]
        want = [BootstrapBatches(env.data, 64, 7)[i] for i in range(batches)]
        rec["ok"] = all(torch.equal(a, b) for a, b in zip(got, want))
        if not rec["ok"]:
            rec["error"] = "the workers' batches differ from BootstrapBatches'"
    except Exception as e:  # noqa: BLE001 (the verdict reports it; the drill goes on)
        rec["ok"], rec["error"] = False, f"{type(e).__name__}: {e}"[:300]
    finally:
        if env is not None:
            env._loader_iter = None  # its workers exit
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def _kill_when(out_dir: str, epoch: int, marker: str, world_size: int) -> None:
    """Watch the run's states; once every rank has saved a state of `epoch` or later, SIGKILL this process. Every
    rank's own directory is listed (sagips.io.state.state_epochs), not state/latest.json: that marker follows the
    ranks' stop agreement, which may complete its reductions up to max_ahead epochs late."""
    from sagips.io.state import state_epochs

    while True:
        done = min(max(state_epochs(out_dir, r), default=0) for r in range(world_size))
        if done >= epoch:
            _write_json(marker, {"rank_pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                                 "state_epoch": done})
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.1)


def train_main(args, run_argv: list[str]) -> int:
    """Under the launcher: record the placement, arm the kill on one rank, then run sagips.run.main(run_argv)."""
    _apply_env(args.env)
    from sagips.supervise import launcher_rank, supervise

    supervise()  # as `python -m sagips.run` does; its own call then sees an already supervised rank
    import sagips.comm  # noqa: F401  (first: the MPI thread level)

    # isort: split
    from mpi4py import MPI

    from sagips.comm.watchdog import gather_json

    world = MPI.COMM_WORLD
    mine = _placement(world, int(_set_value(run_argv, "train.threads", 0)))
    mine["loader"] = _loader_check()
    placed = gather_json(world, mine, timeout_s=300, what="validate: placement")
    if world.Get_rank() == 0:
        _write_json(args.placement, placed)
    rank = launcher_rank()
    if args.kill_rank >= 0 and (rank if rank is not None else world.Get_rank()) == args.kill_rank:
        threading.Thread(target=_kill_when, args=(args.watch_dir, args.kill_after_epoch, args.marker,
                                                  world.Get_size()), daemon=True).start()
    from sagips.run import main

    return main(run_argv)


# ================================================================================================ the driver side
@dataclass
class Step:
    """One launched step: its output lines with their arrival times, exit status and duration."""

    name: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    rc: int | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    t_start: float = 0.0
    t_end: float = 0.0
    lines: list = field(default_factory=list)  # (time, stream, text)
    proc: subprocess.Popen | None = field(default=None, repr=False)  # while it runs (stopped on SIGTERM)

    def text(self, stream: str | None = None) -> str:
        return "\n".join(t for _, s, t in self.lines if stream is None or s == stream)

    def first(self, pattern: str):
        """(time, match) of the first output line matching `pattern`, or (None, None)."""
        rx = re.compile(pattern)
        for t, _, line in self.lines:
            m = rx.search(line)
            if m:
                return t, m
        return None, None

    def record(self, log_dir: Path | None) -> dict:
        d = {"cmd": shlex.join(self.cmd), "env": self.env, "rc": self.rc, "wall_s": round(self.wall_s, 2),
             "timed_out": self.timed_out}
        if log_dir is not None:
            d["log"] = str(log_dir / f"{self.name}.log")
        return d


def run_step(step: Step, timeout_s: float, log_dir: Path) -> Step:
    """Run the step in its own session; on timeout, SIGTERM then SIGKILL its whole process group."""
    env = {**os.environ, **step.env}
    step.t_start = time.time()
    p = step.proc = subprocess.Popen(step.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace", start_new_session=True)
    lock = threading.Lock()

    def pump(stream, name):
        for line in stream:
            with lock:
                step.lines.append((time.time(), name, line.rstrip("\n")))

    pumps = [threading.Thread(target=pump, args=(p.stdout, "out"), daemon=True),
             threading.Thread(target=pump, args=(p.stderr, "err"), daemon=True)]
    for t in pumps:
        t.start()
    try:
        try:
            step.rc = p.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            step.timed_out = True
            stop_step(step)
    finally:  # also when PBS's SIGTERM cuts the step off: its log is the one a user needs
        step.t_end = time.time()
        step.wall_s = step.t_end - step.t_start
        for t in pumps:
            t.join(timeout=5)
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{step.name}.log", "w") as fh:
            fh.write(f"# {shlex.join(step.cmd)}\n# env {step.env}\n# rc {step.rc}, {step.wall_s:.1f} s"
                     f"{', timed out' if step.timed_out else ''}\n")
            for t, s, line in step.lines:
                fh.write(f"{t - step.t_start:9.3f} {s} {line}\n")
    return step


def stop_step(step: Step, graces=(5.0, 10.0)) -> None:
    """SIGTERM, then SIGKILL, the step's whole process group."""
    for sig, grace in zip((signal.SIGTERM, signal.SIGKILL), graces):
        try:
            os.killpg(step.proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            step.rc = step.proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue


def verdict(qid: str, status: str, detail: str, **data) -> dict:
    assert status in STATUSES, status
    return {"id": qid, "question": QUESTIONS[qid], "status": status, "detail": detail, "data": data}


def _read_json(path) -> object | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _tail(step: Step, n: int = 3) -> str:
    lines = [t for _, s, t in step.lines if t.strip()][-n:]
    return " | ".join(lines)[-400:] if lines else "no output"


def _crashed(step: Step) -> str:
    if step.timed_out:
        return f"did not finish within its {step.wall_s:.0f} s (stopped by validate); last output: {_tail(step)}"
    return f"exited with {step.rc} after {step.wall_s:.1f} s; last output: {_tail(step)}"


def _no_answer(qid: str, step: Step, what: str, **data) -> dict:
    """The step gave no answer: `timed out` when validate stopped it at its limit, else `fail`."""
    return verdict(qid, "timed out" if step.timed_out else "fail", f"{what}: {_crashed(step)}", rc=step.rc, **data)


def pmi_verdict(qid: str, step: Step, result: dict | None, nranks: int, supervised: bool) -> dict:
    if result is None:
        return _no_answer(qid, step, "the step wrote no result")
    ranks = result.get("ranks") or []
    launcher = sorted({r.get("launcher") for r in ranks} or {"unknown"})
    data = {"world_size": result.get("world_size"), "launcher": launcher, "mpi_library": result.get("mpi_library"),
            "hosts": sorted({r["host"] for r in ranks}), "seconds": result.get("seconds"), "rc": step.rc}
    where = f"launcher {'/'.join(launcher)}" + ("" if "pals" in launcher else " (not PALS: this answers it for this "
                                                                               "launcher only)")
    if result.get("world_size") != nranks:
        return verdict(qid, "fail", f"a world of {result.get('world_size')} rank(s), not {nranks}: the ranks did not "
                                    f"find each other through PMI (each started as a singleton); {where}", **data)
    wrong = [r["mpi_rank"] for r in ranks if r.get("launcher_rank") not in (None, r["mpi_rank"])]
    if wrong:
        return verdict(qid, "fail", f"MPI rank differs from the launcher's rank on ranks {wrong}; {where}", **data)
    forked = sum(1 for r in ranks if r.get("supervised"))
    if supervised and forked != nranks:
        return verdict(qid, "fail", f"only {forked} of {nranks} ranks ran under the supervisor's fork (no launcher "
                                    f"rank variable?); {where}", **data)
    if not supervised and forked:
        return verdict(qid, "fail", f"{forked} ranks forked although SAGIPS_SUPERVISOR=0; {where}", **data)
    # (the step's exit status belongs to the RMA stress that follows in the same step: its own verdict)
    how = "forked before MPI_Init" if supervised else "not forked"
    return verdict(qid, "pass", f"{nranks} ranks on {len(data['hosts'])} host(s), {how}, one world, MPI rank = "
                                f"launcher rank; {where}", **data)


def rma_verdict(qid: str, step: Step, result: dict | None, want_backend: str, need_hosts: int) -> dict:
    if result is None or "rma" not in result:
        # (a hang inside the exchange is named by the ranks' watchdog, --rma-timeout-s, before the step's limit)
        return _no_answer(qid, step, "no result")
    per_rank = result["rma"]
    total = {k: sum(r[k] for r in per_rank) for k in ("exchanges", "used", "torn_skipped", "stale_dropped", "bad")}
    backends = sorted({r["backend"] for r in per_rank})
    spans = max(r["group_hosts"] for r in per_rank)
    sizes = sorted({r["group_size"] for r in per_rank})
    rate = max(r["seconds"] for r in per_rank)
    data = {**total, "backends": backends, "group_sizes": sizes, "group_hosts": spans, "slowest_rank_s": rate,
            "floats": per_rank[0]["floats"], "per_rank": per_rank, "rc": step.rc}
    counts = (f"{total['exchanges']} exchanges in groups of {'/'.join(map(str, sizes))} on {spans} host(s) per group: "
              f"{total['used']} contributions used, {total['torn_skipped']} torn reads skipped, "
              f"{total['stale_dropped']} stale dropped, {total['bad']} bad; slowest rank {rate:.2f} s")
    if total["bad"]:
        first = next(r["first_bad"] for r in per_rank if r["bad"])
        return verdict(qid, "fail", f"{counts}; first: {first}", **data)
    if backends != [want_backend]:
        return verdict(qid, "fail", f"backend {backends}, expected {want_backend}; {counts}", **data)
    if max(sizes) > 1 and total["used"] == 0:
        return verdict(qid, "fail", f"nothing was exchanged; {counts}", **data)
    if step.rc != 0:
        return verdict(qid, "fail", f"{counts}; but the step {_crashed(step)}", **data)
    if spans < need_hosts:
        return verdict(qid, "skipped", f"the group is on {spans} host(s), not {need_hosts}: no cross-node window "
                                       f"here (needs a 2-node job); on this host: {counts}", **data)
    return verdict(qid, "pass", counts, **data)


_KILLED = r"sagips: rank (\d+) \(pid (\d+) on (\S+)\) was killed by signal 9\b"
_FAILED = r"sagips: rank (\d+) failed"
_WATCHDOG = r"sagips: rank (\d+) waited [\d.]+ s in .* aborting the job"


def drill_verdict(qid: str, step: Step, victim: int, timeout_s: float, named_by: str, started: bool) -> dict:
    """The job must end on its own within timeout_s of the line that names `victim` (pattern `named_by`)."""
    t_named, m = step.first(named_by)
    named = sorted({int(x.group(1)) for x in (re.search(named_by, t) for _, _, t in step.lines) if x})
    t_dog, dog = step.first(_WATCHDOG)
    data = {"victim": victim, "named": named, "rc": step.rc, "timeout_s": timeout_s, "wall_s": round(step.wall_s, 2)}
    if not started:
        return verdict(qid, "timed out" if step.timed_out else "fail", f"the drill never happened (the run did not "
                                                                       f"reach the drill's epoch): {_crashed(step)}",
                       **data)
    if t_named is None:
        return verdict(qid, "fail", f"no line names the lost rank {victim}; {_crashed(step)}", **data)
    teardown = step.t_end - t_named
    data["teardown_s"] = round(teardown, 2)
    ended_by = (f"the watchdog (rank {dog.group(1)} gave up waiting)" if dog else
                "validate (the job did not end by itself)" if step.timed_out else "the launcher's teardown")
    data["ended_by"] = ended_by
    if victim not in named:
        return verdict(qid, "fail", f"ranks {named} were named, not the lost rank {victim}", **data)
    if step.timed_out or teardown > timeout_s:
        return verdict(qid, "fail", f"rank {victim} named, but the job ran on {teardown:.1f} s after it "
                                    f"(comm.timeout_s={timeout_s:g}); ended by {ended_by}", **data)
    if step.rc == 0:
        return verdict(qid, "fail", "the job exited 0 although a rank was lost", **data)
    return verdict(qid, "pass", f"rank {victim} named; the job ended {teardown:.1f} s later (comm.timeout_s="
                                f"{timeout_s:g}), by {ended_by}, exit status {step.rc}", **data)


def placement_verdicts(placed: list | None, run_json: dict | None, expect_cpus: int,
                       step: Step | None = None) -> list[dict]:
    if not placed:
        status = "timed out" if step is not None and step.timed_out else "fail"
        why = "the training step recorded no placement" + (f": {_crashed(step)}" if step is not None else "")
        return [verdict(q, status, why) for q in ("threads", "gpus", "loader")]
    hosts = {}
    for r in placed:
        hosts.setdefault(r["host"], []).append(r)
    # threads: a rank pinned to its own cores uses all of them; ranks sharing a set divide it (item 5 of issue 27)
    problems = []
    for host, rs in sorted(hosts.items()):
        sets = [frozenset(r["cpus"]) for r in rs]
        for r in rs:
            own = frozenset(r["cpus"])
            sharing = sum(1 for s in sets if s == own)
            overlap = any(s != own and s & own for s in sets)
            if overlap:
                problems.append(f"rank {r['rank']}'s cores overlap another rank's partly")
            # MPICH_ASYNC_PROGRESS=1: MPICH's progress thread takes one of the rank's cores (train.threads=7)
            want = len(own) - 1 if r.get("async_progress") and len(own) > 1 else len(own)
            if sharing == 1 and r["threads"] != want:
                problems.append(f"rank {r['rank']} is pinned to {len(own)} cores but uses {r['threads']} threads"
                                + (" beside MPICH's progress thread (set train.threads=" + str(want) + ")"
                                   if want < len(own) else ""))
            if sharing > 1 and r["threads"] * sharing > max(len(own), sharing):
                problems.append(f"rank {r['rank']}: {r['threads']} threads x {sharing} ranks on {len(own)} cores")
            if expect_cpus and len(own) != expect_cpus:
                problems.append(f"rank {r['rank']} may run on {len(own)} cores, not the {expect_cpus} of --depth "
                                f"(did --cpu-bind depth pin it?)")
    if run_json is not None and placed and run_json.get("threads_per_rank") != placed[0]["threads"]:
        problems.append(f"run.json says {run_json.get('threads_per_rank')} threads on rank 0, validate computed "
                        f"{placed[0]['threads']}")
    per_rank = [{"rank": r["rank"], "host": r["host"], "cores": len(r["cpus"]), "threads": r["threads"]}
                for r in placed]
    summary = ", ".join(sorted({f"{r['threads']} thread(s) on {len(r['cpus'])} core(s)" for r in placed}))
    pinned = all(len({frozenset(r["cpus"]) for r in rs}) == len(rs) for rs in hosts.values())
    how = "each rank pinned to its own cores" if pinned else "ranks share their host's cores"
    threads = (verdict("threads", "fail", "; ".join(problems[:4]), per_rank=per_rank) if problems else
               verdict("threads", "pass", f"{summary} ({how}); equals sagips.run's own count", per_rank=per_rank))
    # gpus
    gpu_rows = [{"rank": r["rank"], "host": r["host"], "local_rank": r["local_rank"],
                 "CUDA_VISIBLE_DEVICES": r["CUDA_VISIBLE_DEVICES"], "visible": r["gpus_visible"],
                 "device": r["device"], "gpu": r.get("gpu")} for r in placed]
    if not any(r["cuda"] for r in placed):
        gpus = verdict("gpus", "skipped", "no rank sees a GPU (a CPU-only host, or CUDA_VISIBLE_DEVICES empty)",
                       per_rank=gpu_rows)
    else:
        bad = [f"rank {r['rank']} sees {r['gpus_visible']} GPUs" for r in placed if r["gpus_visible"] != 1]
        for host, rs in sorted(hosts.items()):
            ids = [(r.get("gpu") or {}).get("uuid") or (r.get("gpu") or {}).get("pci_bus_id") for r in rs]
            if len(set(ids)) != len(ids):
                bad.append(f"ranks on {host} share a GPU ({ids})")
        if run_json is not None and not str(run_json.get("device", "")).startswith("cuda"):
            bad.append(f"sagips.run chose {run_json.get('device')}")
        names = sorted({(r.get("gpu") or {}).get("name", "?") for r in placed})
        gpus = (verdict("gpus", "fail", "; ".join(bad[:4]), per_rank=gpu_rows) if bad else
                verdict("gpus", "pass", f"each rank sees one GPU of its own ({', '.join(names)}): local rank -> "
                                        f"CUDA_VISIBLE_DEVICES " + ", ".join(
                                            f"{r['local_rank']}->{r['CUDA_VISIBLE_DEVICES']}"
                                            for r in sorted(hosts[min(hosts)], key=lambda r: r['local_rank'])),
                        per_rank=gpu_rows))
    return [threads, gpus, loader_verdict(placed)]


def loader_verdict(placed: list) -> dict:
    recs = [{"rank": r["rank"], "host": r["host"], **(r.get("loader") or {"ok": False, "error": "not run"})}
            for r in placed]
    bad = [r for r in recs if not r.get("ok")]
    tmp = sorted({r.get("tmpdir") for r in recs if r.get("tmpdir")})
    if bad:
        return verdict("loader", "fail", f"{len(bad)} of {len(recs)} ranks: rank {bad[0]['rank']}: "
                                         f"{bad[0].get('error')} (TMPDIR {', '.join(tmp)})", per_rank=recs)
    slowest = max(r.get("seconds", 0) for r in recs)
    return verdict("loader", "pass", f"every rank got its batches from {recs[0].get('workers')} "
                                     f"{recs[0].get('start')} workers (TMPDIR {', '.join(tmp)}, socket paths of "
                                     f"{max(r['socket_path_bytes'] for r in recs)} bytes; slowest {slowest:.1f} s)",
                   per_rank=recs)


def epoch_time_verdict(metrics_path: Path, run_json: dict | None, config: str, tolerance: float) -> dict:
    recs = []
    try:
        for line in Path(metrics_path).read_text().splitlines():
            rec = json.loads(line)
            recs.append((rec["epoch"], rec["time_s"]))
    except (OSError, ValueError, KeyError):
        pass
    if len(recs) < 3:
        return verdict("epoch_time", "fail", f"fewer than 3 metrics records in {metrics_path} (raise the drill's "
                                             f"epoch, or lower train.log_every)", records=len(recs))
    (e0, t0), (e1, t1) = recs[1], recs[-1]  # from the second record: the first epoch holds warm-up
    epoch_s = (t1 - t0) / (e1 - e0)
    device = (run_json or {}).get("device", "?")
    data = {"epoch_s": round(epoch_s, 6), "epochs": [e0, e1], "device": device, "paper_epoch_s": PAPER_EPOCH_S,
            "config": config, "ratio": round(epoch_s / PAPER_EPOCH_S, 3)}
    measured = f"{epoch_s * 1e3:.1f} ms per epoch (epochs {e0}-{e1}, rank 0, {device}, {config})"
    if not str(device).startswith("cuda"):
        return verdict("epoch_time", "skipped", f"no GPU: {measured}, not comparable with the paper's A100 "
                                                f"{PAPER_EPOCH_S * 1e3:.0f} ms", **data)
    if Path(config).as_posix() != PAPER_CONFIG:
        return verdict("epoch_time", "skipped", f"{measured}: not the paper's settings ({PAPER_CONFIG})", **data)
    status = "pass" if epoch_s <= tolerance * PAPER_EPOCH_S else "fail"
    return verdict("epoch_time", status, f"{measured} = {epoch_s / PAPER_EPOCH_S:.2f} x the paper's "
                                         f"{PAPER_EPOCH_S * 1e3:.0f} ms (limit {tolerance:g} x)", **data)


def _nranks_from(launch: list[str]) -> int | None:
    for i, a in enumerate(launch[:-1]):
        if a in ("-n", "-np", "--np", "--n"):
            return int(launch[i + 1])
    for a in launch:
        m = re.fullmatch(r"--?np?=(\d+)", a)
        if m:
            return int(m.group(1))
    return None


class Driver:
    def __init__(self, args, launch: list[str]):
        self.args, self.launch = args, launch
        self.out = Path(args.out).resolve()
        self.logs = self.out / "logs"
        self.steps: dict[str, Step] = {}
        self.verdicts: list[dict] = []
        self.journal = self.out / "verdicts.jsonl"
        self.deadline = time.time() + args.budget_s
        self.py = [sys.executable]
        self.current: Step | None = None

    # -- commands
    def ranks_cmd(self, step: str, rma: bool, inner_size: int = 0, backend: str = "auto") -> list[str]:
        a = self.args
        cmd = [*self.launch, *self.py, str(HERE), "ranks", "--step", step, "--out", str(self.out / f"{step}.json"),
               "--timeout-s", str(a.rma_timeout_s)]
        if rma:
            cmd += ["--rma", "--inner-size", str(inner_size), "--backend", backend, "--exchanges", str(a.exchanges),
                    "--floats", str(a.floats)]
        return cmd

    def run_argv(self, out_dir: Path, extra: list[str]) -> list[str]:
        a = self.args
        argv = ["--config", a.drill_config, "--mode", a.drill_mode, "--epochs", "1000000", "--output-dir",
                str(out_dir), "--overwrite", "--no-progress"]
        for item in a.drill_set:
            argv += ["--set", item]
        # last, so that no preset changes them: what the verdicts rest on (epoch_time: 3 records by the kill epoch)
        argv += ["--set", f"comm.timeout_s={a.drill_timeout_s:g}", "--set", f"train.log_every={a.log_every}",
                 "--set", f"train.state_every={a.state_every}"]
        return argv + extra

    def kill_cmd(self) -> list[str]:
        a, d = self.args, self.out / "kill"
        return [*self.launch, *self.py, str(HERE), "train", "--placement", str(self.out / "placement.json"),
                "--kill-rank", str(self.victim), "--kill-after-epoch", str(a.kill_after_epoch), "--watch-dir",
                str(d), "--marker", str(self.out / "killed.json"), "--", *self.run_argv(d, [])]

    def error_cmd(self) -> list[str]:
        a = self.args
        return [*self.launch, *self.py, "-m", "sagips.run",
                *self.run_argv(self.out / "error", ["--set", f"pipeline.fail_epoch={a.fail_epoch}", "--set",
                                                    f"pipeline.fail_ranks=[{self.victim}]"])]

    @property
    def victim(self) -> int:
        return self.args.nranks - 1 if self.args.victim < 0 else self.args.victim

    def plan(self) -> list[tuple[str, list[str], dict]]:
        """(name, command, environment) of every step; validate.py's own steps also get the environment as --env."""
        return [(name, _with_env(cmd, env), env) for name, cmd, env in self._plan()]

    def _plan(self) -> list[tuple[str, list[str], dict]]:
        drills = set(self.args.drills.split(",")) - {""}
        steps = [("pmi_rma_shared", self.ranks_cmd("pmi_rma_shared", True, 0, "shared"), {"SAGIPS_SUPERVISOR": "1"})]
        if "kill" in drills:
            steps.append(("kill", self.kill_cmd(), {"SAGIPS_SUPERVISOR": "1"}))
        steps.append(("pmi0_rma_allocate", self.ranks_cmd("pmi0_rma_allocate", True, -1, "allocate"),
                      {"SAGIPS_SUPERVISOR": "0"}))
        if "error" in drills:
            steps.append(("error", self.error_cmd(), {}))
        return steps

    # -- running
    def step(self, name: str, cmd: list[str], env: dict, limit: float) -> Step | None:
        left = self.deadline - time.time()
        if left < 20:
            return None
        print(f"# validate: {time.strftime('%H:%M:%S')} step {name}: {shlex.join(cmd)}", flush=True)
        s = self.current = Step(name, cmd, env)
        self.steps[name] = s
        run_step(s, min(limit, left - 10), self.logs)
        self.current = None
        return s

    def add(self, v: dict) -> None:
        """A verdict, as soon as it is known: printed, and appended to verdicts.jsonl in one write() of an O_APPEND
        file (a line is never torn or interleaved, and a walltime kill loses no verdict already known)."""
        self.verdicts.append(v)
        _append_line(self.journal, v)  # first: the file outlives a closed stdout
        print(f"validate: {v['id']}: {v['status']}: {v['detail']}", flush=True)

    def no_time(self, *qids: str) -> None:
        for q in qids:
            self.add(verdict(q, "timed out", f"not run: validate's budget (--budget-s {self.args.budget_s:g}) was "
                                             f"spent by the steps before it"))

    def run(self) -> int:
        if self.out.is_dir() and any(self.out.iterdir()):
            # an earlier validation's files (its placement, PMI reports, kill marker, drill states) would answer this
            # one's questions: a pass from old data, or a kill drill that fires at once
            print(f"validate: error: --out {self.out} is not empty (an earlier validation?); give an empty or new "
                  f"directory (validate.pbs makes one per job)", file=sys.stderr, flush=True)
            return 2
        self.out.mkdir(parents=True, exist_ok=True)
        previous = signal.signal(signal.SIGTERM, _raise_terminated)  # PBS at the walltime: report what is known
        try:
            self._run()
        except _Terminated:
            if self.current is not None and self.current.proc is not None:
                self.current.timed_out = True
                stop_step(self.current, graces=(2.0, 2.0))
            answered = {v["id"] for v in self.verdicts}
            for q in QUESTIONS:
                if q not in answered:
                    self.add(verdict(q, "timed out", "the job's walltime ended (SIGTERM) before this check answered"))
        finally:
            signal.signal(signal.SIGTERM, previous)
        return self.report()

    def _run(self) -> None:
        a = self.args
        plan = {name: (cmd, env) for name, cmd, env in self.plan()}
        # 1. PMI with the supervisor's fork + RMA, shared backend
        s = self.step("pmi_rma_shared", *plan["pmi_rma_shared"], limit=a.step_timeout_s)
        if s is None:
            self.no_time("pmi_supervised", "rma_shared")
        else:
            res = _read_json(self.out / "pmi_rma_shared.json")
            self.add(pmi_verdict("pmi_supervised", s, res, a.nranks, supervised=True))
            self.add(rma_verdict("rma_shared", s, res, "shared", need_hosts=1))
        # 2. a rank killed mid-run; placement and epoch time from the same run
        if "kill" in plan:
            s = self.step("kill", *plan["kill"], limit=a.train_timeout_s + a.drill_timeout_s)
            if s is None:
                self.no_time("kill_drill", "threads", "gpus", "loader", "epoch_time")
            else:
                started = (self.out / "killed.json").exists()
                self.add(drill_verdict("kill_drill", s, self.victim, a.drill_timeout_s, _KILLED, started))
                run_json = _read_json(self.out / "kill" / "run.json")
                for v in placement_verdicts(_read_json(self.out / "placement.json"), run_json,
                                            a.expect_cpus_per_rank, s):
                    self.add(v)
                self.add(epoch_time_verdict(self.out / "kill" / "metrics.jsonl", run_json, a.drill_config,
                                            a.epoch_tolerance))
        else:
            for q in ("kill_drill", "threads", "gpus", "loader", "epoch_time"):
                self.add(verdict(q, "skipped", "the kill drill was not requested (--drills)"))
        # 3. PMI without the fork; RMA, allocate backend, one group over all ranks (across the nodes); if that
        # fails, once more with the workaround that some centres document
        s = self.step("pmi0_rma_allocate", *plan["pmi0_rma_allocate"], limit=a.step_timeout_s)
        if s is None:
            self.no_time("pmi_unsupervised", "rma_allocate")
        else:
            res = _read_json(self.out / "pmi0_rma_allocate.json")
            self.add(pmi_verdict("pmi_unsupervised", s, res, a.nranks, supervised=False))
            v = rma_verdict("rma_allocate", s, res, "allocate", need_hosts=min(2, a.expect_hosts))
            if v["status"] in ("fail", "timed out") and "FI_MR_CACHE_MONITOR" not in os.environ:
                cmd, env = plan["pmi0_rma_allocate"]
                cmd = [c.replace("pmi0_rma_allocate.json", "rma_allocate_mrcache.json") for c in cmd]
                env = {**env, "FI_MR_CACHE_MONITOR": "disabled"}
                retry = self.step("rma_allocate_mrcache", _with_env(cmd, env), env, limit=a.step_timeout_s)
                if retry is not None:
                    r = rma_verdict("rma_allocate", retry, _read_json(self.out / "rma_allocate_mrcache.json"),
                                    "allocate", need_hosts=1)
                    v["detail"] += (f"; again with FI_MR_CACHE_MONITOR=disabled: {r['status']} "
                                    f"({r['detail'][:200]})")
                    v["data"]["with_FI_MR_CACHE_MONITOR_disabled"] = {"status": r["status"], "detail": r["detail"]}
            self.add(v)
        # 4. an error on one rank (the fault drill)
        if "error" in plan:
            s = self.step("error", *plan["error"], limit=a.train_timeout_s + a.drill_timeout_s)
            if s is None:
                self.no_time("error_drill")
            else:
                # stopped at its limit before any line named the rank: the run was too slow to reach fail_epoch
                started = not (s.timed_out and s.first(_FAILED)[0] is None)
                self.add(drill_verdict("error_drill", s, self.victim, a.drill_timeout_s, _FAILED, started))
        else:
            self.add(verdict("error_drill", "skipped", "the error drill was not requested (--drills)"))

    def report(self) -> int:
        """The final summary: validate.json (every verdict, in QUESTIONS' order, with its data) and one line."""
        order = list(QUESTIONS)
        self.verdicts.sort(key=lambda v: order.index(v["id"]))
        counts = {k: sum(1 for v in self.verdicts if v["status"] == k) for k in STATUSES}
        first = _read_json(self.out / "pmi_rma_shared.json") or {}
        doc = {"sagips_validate": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "job_id": os.environ.get("PBS_JOBID"), "nranks": self.args.nranks, "launch": shlex.join(self.launch),
               "launcher": sorted({r.get("launcher") for r in first.get("ranks") or []}),
               "hosts": sorted({r.get("host") for r in first.get("ranks") or []}),
               "mpi_library": first.get("mpi_library"), "versions": _versions(),
               "env": {k: v for k, v in sorted(os.environ.items())
                       if k.startswith(("MPICH_", "FI_", "SAGIPS_", "PALS_", "CRAY_MPICH", "OMP_"))
                       or k in ("CUDA_VISIBLE_DEVICES", "LOADEDMODULES", "PE_ENV")},
               "summary": counts, "verdicts": self.verdicts,
               "steps": {k: s.record(self.logs) for k, s in self.steps.items()}}
        _write_json(self.out / "validate.json", doc)
        _append_line(self.journal, {"summary": counts, "validate_json": str(self.out / "validate.json")})
        print(f"# validate: {counts['pass']} pass, {counts['fail']} fail, {counts['skipped']} skipped, "
              f"{counts['timed out']} timed out; {self.out / 'validate.json'}", flush=True)
        return 1 if counts["fail"] or counts["timed out"] else 0


class _Terminated(BaseException):
    """SIGTERM (PBS at the walltime) while a step runs."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def _append_line(path: Path, obj: dict) -> None:
    """One JSON line appended with a single write() to an O_APPEND file, then fsync: lines are never interleaved."""
    data = (json.dumps(obj, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _with_env(cmd: list[str], env: dict) -> list[str]:
    """Add --env KEY=VALUE to a `validate.py ranks|train` command (before its `--`), replacing earlier ones."""
    k = next((i for i, c in enumerate(cmd) if c == str(HERE)), None)
    if k is None or not env:
        return cmd
    end = cmd.index("--", k) if "--" in cmd[k:] else len(cmd)
    head, tail = cmd[:end], cmd[end:]
    out, i = [], 0
    while i < len(head):
        if head[i] == "--env" and i > k:
            i += 2
            continue
        out.append(head[i])
        i += 1
    for key, value in env.items():
        out += ["--env", f"{key}={value}"]
    return out + tail


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("sagips", "mpi4py", "numpy", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 (a missing module is recorded, not fatal)
            out[mod] = None
    return out


def parse(argv: list[str]):
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="validate.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    r = sub.add_parser("run", help="the driver: python validate.py run --out DIR [options] -- LAUNCH PREFIX...")
    r.add_argument("--out", required=True, help="directory for validate.json, the steps' results and logs")
    r.add_argument("--nranks", type=int, help="ranks of the launch prefix (default: its -n)")
    r.add_argument("--exchanges", type=int, default=3000, help="RMA exchanges per rank and backend")
    r.add_argument("--floats", type=int, default=51200, help="RMA buffer length (the paper's generator: ~51k)")
    r.add_argument("--drills", default="kill,error", help="comma list of kill, error")
    r.add_argument("--drill-config", default=PAPER_CONFIG, help="the drills' preset (the paper's: epoch time)")
    r.add_argument("--drill-mode", default="rma-arar-arar")
    r.add_argument("--drill-set", action="append", default=[], metavar="KEY=VALUE", help="more sagips.run --set")
    r.add_argument("--drill-timeout-s", type=float, default=60.0, help="the drills' comm.timeout_s")
    r.add_argument("--log-every", type=int, default=10, help="the drills' train.log_every (epoch_time's records)")
    r.add_argument("--state-every", type=int, default=10, help="the drills' train.state_every (the kill's trigger)")
    r.add_argument("--kill-after-epoch", type=int, default=30, help="the kill drill's epoch (>= 3 x --log-every)")
    r.add_argument("--fail-epoch", type=int, default=10, help="the error drill's pipeline.fail_epoch")
    r.add_argument("--victim", type=int, default=-1, help="the drills' rank (default: the last)")
    r.add_argument("--expect-cpus-per-rank", type=int, default=0, help="fail unless each rank may run on exactly "
                   "this many cores (Polaris: --depth 8); 0 = no expectation")
    r.add_argument("--expect-hosts", type=int, default=2, help="hosts a cross-node check needs")
    r.add_argument("--epoch-tolerance", type=float, default=2.0, help="epoch time limit, x the paper's")
    r.add_argument("--step-timeout-s", type=float, default=120.0, help="limit of one PMI + RMA step")
    r.add_argument("--rma-timeout-s", type=float, default=60.0, help="the RMA ranks' watchdog (below the step's "
                   "limit, so that a hang in the exchange is named by a rank)")
    r.add_argument("--train-timeout-s", type=float, default=240.0, help="limit of a drill's start-up and training")
    r.add_argument("--budget-s", type=float, default=480.0, help="all steps together (validate.pbs: 8 of its 10 "
                   "minutes of compute)")
    r.add_argument("--dry-run", action="store_true", help="print the steps' commands, run nothing (or DRY_RUN=1)")
    k = sub.add_parser("ranks", help="(under the launcher) PMI check and RMA stress")
    k.add_argument("--step", required=True)
    k.add_argument("--out", required=True)
    k.add_argument("--rma", action="store_true")
    k.add_argument("--inner-size", type=int, default=0, help="0: one group per node; -1: one group of all ranks")
    k.add_argument("--backend", default="auto", choices=("auto", "shared", "allocate"))
    k.add_argument("--exchanges", type=int, default=3000)
    k.add_argument("--floats", type=int, default=51200)
    k.add_argument("--max-staleness", type=int, default=10)
    k.add_argument("--timeout-s", type=float, default=240.0)
    k.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set before MPI_Init")
    t = sub.add_parser("train", help="(under the launcher) sagips.run with placement record and a kill: "
                                     "validate.py train [options] -- SAGIPS.RUN ARGS")
    t.add_argument("--placement", required=True)
    t.add_argument("--kill-rank", type=int, default=-1)
    t.add_argument("--kill-after-epoch", type=int, default=0)
    t.add_argument("--watch-dir", default="")
    t.add_argument("--marker", default="")
    t.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set before MPI_Init")
    return p.parse_args(argv), rest


def check_drill_settings(a) -> str | None:
    """A combination of settings under which a check could never pass, or None."""
    for item in a.drill_set:
        key = item.partition("=")[0]
        if key in DRILL_KEYS:
            return f"--drill-set {item}: the drills set {key} themselves; use {DRILL_KEYS[key]}"
    if min(a.log_every, a.state_every, a.kill_after_epoch, a.fail_epoch) < 1:
        return "--log-every, --state-every, --kill-after-epoch and --fail-epoch must be >= 1"
    if a.kill_after_epoch < 3 * a.log_every:
        return (f"--kill-after-epoch {a.kill_after_epoch} < 3 x --log-every {a.log_every}: the kill drill's "
                f"metrics.jsonl would hold fewer than the 3 records that epoch_time needs")
    if a.rma_timeout_s >= a.step_timeout_s:
        return f"--rma-timeout-s {a.rma_timeout_s:g} must be below --step-timeout-s {a.step_timeout_s:g}"
    return None


def main(argv: list[str] | None = None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    if args.role == "ranks":
        return ranks_main(args)
    if args.role == "train":
        return train_main(args, rest)
    if not rest:
        print("validate.py run: give the launch prefix after --, e.g. -- mpiexec -n 4", file=sys.stderr)
        return 2
    args.nranks = args.nranks or _nranks_from(rest)
    if not args.nranks:
        print("validate.py run: no -n in the launch prefix: give --nranks", file=sys.stderr)
        return 2
    problem = check_drill_settings(args)
    if problem:
        print(f"validate.py run: {problem}", file=sys.stderr)
        return 2
    driver = Driver(args, rest)
    if args.dry_run or os.environ.get("DRY_RUN") == "1":
        for name, cmd, env in driver.plan():
            print(f"# validate step {name}" + "".join(f" {k}={v}" for k, v in env.items()))
            print(shlex.join(cmd))
        return 0
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
