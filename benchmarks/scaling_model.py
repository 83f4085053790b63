"""Scaling model of SAGIPS: calibrate on this machine, validate on tiny runs, project to Polaris (paper Figs. 11-12).

    .venv/bin/python benchmarks/scaling_model.py measure         # small mpiexec timings (N = 2, 4) + local timings
    .venv/bin/python benchmarks/scaling_model.py validate --schedule  # the real exchanges between sleeping
                                                                      # pipelines at N = 1, 2, 4 (the validation)
    .venv/bin/python benchmarks/scaling_model.py validate --paired  # tiny sagips.run runs at N = 1, 2, 4, each
                                                                    # after its own single-rank reference
    .venv/bin/python benchmarks/scaling_model.py project          # Polaris projection: figures, JSON, Markdown
    .venv/bin/python benchmarks/scaling_model.py all              # the three in order

The model itself is benchmarks/sim.py (a discrete-event simulation of every mode's schedule; read its docstring).
This script supplies its inputs and checks it:

1. measure -> docs/benchmarks/scaling_measurements.json
   - mpiexec -n 2 and -n 4 (timeout 120 s each) of a small worker that times the real sagips.comm code:
     Ring whole/chunked at 3 buffer sizes (16, 12,672 and 50,688 floats: the sizes separate the per-hop cost alpha
     from the per-byte cost beta), the allreduce path of mode `allreduce` (Iallreduce + watchdog) and
     RmaExchange.exchange. A rep: barrier, then 10 calls back to back (so that the barrier's exit skew is spread
     over 10 calls), the slowest rank's time / 10; quantiles over reps (the order of the techniques is shuffled
     every rep, the same on every rank, so that no technique always follows another).
   - in one process: numpy add / copy / divide per float, memcpy and zlib.crc32 per byte (the local work inside
     a ring, an allreduce and an RMA exchange);
   - one single-rank epoch timing: `sagips.run` (ensemble, 1 rank, 1 thread) of the validation settings, per-epoch
     times from metrics.jsonl (mean and coefficient of variation).
2. calibrate(measurements_json) fits alpha and beta (least squares over the ring times at N <= cores, after
   removing the measured local work), the per-call overhead of a collective, and the RMA costs. It also reads the
   comm author's docs/benchmarks/exchange.json (one buffer size, N = 2, 4, 8) where it exists, as a cross-check.
3. validate(run_jsons, cal, epoch) predicts finished runs (their mode, N, epochs, inner size, h, ring read from
   run.json) with the profile of this machine and reports (predicted - measured) / measured of the training time
   (max over ranks of train_seconds). `validate --schedule` replays the schedule with the real exchange code
   between pipelines that sleep a known time (immune to the CPU load of other jobs on this machine); two
   parameters of the watchdog's wait loop (wake_s, collective_rounds) are fitted on one of its cases
   (fit_polling), the others validate. `validate --paired` runs the tiny runs (N = 1, 2, 4, every mode), each right
   after a single-rank reference run whose epoch time it is predicted from (validate_pairs): this machine's
   cores are shared with other jobs, and only a reference taken under the same load makes the comparison fair.
4. project: the Polaris profile (every input with its source in scaling_model.json) -> training time and eq.-9
   analysis rate for 4..400 ranks, every mode; gains from 4 to 400 ranks; sensitivity and straggler scenarios;
   docs/benchmarks/scaling_time.png (Fig. 11 style), scaling_rate.png (Fig. 12 style), scaling_model.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # sim.py, the model

from sim import MODES, Link, Profile, project, simulate  # noqa: E402  (benchmarks/sim.py; MODES: those it models)

from sagips.comm import waitpolicy  # noqa: E402

DOCS = REPO / "docs" / "benchmarks"
MEASUREMENTS = DOCS / "scaling_measurements.json"
EXCHANGE_JSON = DOCS / "exchange.json"  # written by benchmarks/exchange.py (the comm layer's benchmark)
OUT_JSON = DOCS / "scaling_model.json"
OUT_MD = DOCS / "scaling_model.md"
FIG_TIME = DOCS / "scaling_time.png"
FIG_RATE = DOCS / "scaling_rate.png"

N_WEIGHTS = 50_688          # exchanged floats: the generator's weight gradients (4x128x128 + 128x6 + 6x128)
SIZES = (16, 12_672, N_WEIGHTS)
MPI_NS = (2, 4)
BATCH = 10                  # calls timed back to back per rep
LOCAL_MPI_LATENCY_S = 1e-6  # assumed MPICH shared-memory latency; the rest of a measured hop is Python + mpi4py

# The tiny validation runs (the quick preset, shrunk): same settings for the epoch timing and every run.
VALIDATION_EPOCHS = 60
VALIDATION_SETS = [
    "train.threads=1", "environment.reference_events=100000", "environment.param_samples=16",
    "train.log_every=1000", "train.checkpoint_every=100000", "comm.outer_every=20", "comm.timeout_s=120",
]
VALIDATION_INNER = 2  # comm.inner_size (min(2, N)): N=4 poses as 2 nodes x 2 ranks


def cpu_name() -> str:
    from sagips.perf import cpu_name as name  # torch is imported only here

    return name()


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ================================================================================================ 1. measure
def mpi_worker(reps: int, out: str) -> None:
    """Under mpiexec: time the real exchange code at every size, interleaved rep by rep."""
    from mpi4py import MPI

    import sagips.comm  # noqa: F401  (thread level before MPI init)
    from sagips.comm import watchdog
    from sagips.comm.ring import Ring
    from sagips.comm.rma import RmaExchange

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    ops, objs = {}, []
    for i, n in enumerate(SIZES):
        whole = Ring(comm, n, "whole", timeout_s=120, tag=200 + 2 * i)
        chunked = Ring(comm, n, "chunked", timeout_s=120, tag=201 + 2 * i)
        ops[("ring-whole", n)] = whole.allreduce
        ops[("ring-chunked", n)] = chunked.allreduce

        def iallreduce(x):
            watchdog.allreduce_sum(comm, x, timeout_s=120, what="allreduce")
            x /= np.float32(size)

        ops[("allreduce", n)] = iallreduce
    rma = RmaExchange(comm, N_WEIGHTS, max_staleness=10, timeout_s=120)
    objs.append(rma)
    epoch = [0]

    def run_rma(x):
        epoch[0] += 1
        rma.exchange(x, epoch[0])

    ops[("rma", N_WEIGHTS)] = run_rma
    bufs = {n: np.random.default_rng(rank).standard_normal(n).astype(np.float32) for n in SIZES}
    work = {n: b.copy() for n, b in bufs.items()}
    keys = list(ops)
    times = {k: np.zeros(reps) for k in keys}
    warmup = 5
    for rep in range(warmup + reps):
        order = np.random.default_rng(rep).permutation(len(keys))  # same order on every rank, new every rep
        for key in (keys[i] for i in order):
            n = key[1]
            work[n][:] = bufs[n]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(BATCH):  # back to back: the barrier's exit skew is spread over BATCH calls
                ops[key](work[n])
            dt = (time.perf_counter() - t0) / BATCH
            if rep >= warmup:
                times[key][rep - warmup] = dt
    for o in objs:
        o.free()
    records = []
    for key in keys:
        slowest = np.empty(reps)
        comm.Allreduce(times[key], slowest, op=MPI.MAX)  # a rep lasts until its slowest rank is done
        records.append({"technique": key[0], "n_ranks": size, "n_floats": key[1], "reps": reps,
                        "seconds": float(np.median(slowest)), "p10_s": float(np.percentile(slowest, 10)),
                        "p25_s": float(np.percentile(slowest, 25)), "p90_s": float(np.percentile(slowest, 90))})
    if rank == 0:
        Path(out).write_text(json.dumps(records))


# The schedule replay: the real exchange code (sagips.comm.modes.build_exchange) between "pipelines" that SLEEP
# for a known time. A sleeping rank does not compete for the CPU, so this machine's background load (which makes
# CPU-bound training runs scatter by +-50% here) barely touches the result: it tests the model's schedule and
# synchronisation semantics against the real comm layer, straggler included.
SCHED_EPOCHS = 100
SCHED_EPOCH_S = 0.03
SCHED_CASES = {  # name: (jitter cv, straggler extra seconds per epoch on the last rank)
    "jitter 10%": (0.10, 0.0),
    "straggler +15 ms on the last rank": (0.0, 0.015),
}


def sched_compute(n_ranks: int, cv: float, seed: int = 7) -> np.ndarray:
    """(epochs, n_ranks) sleep seconds, the same in the worker and in the model."""
    rng = np.random.default_rng(seed)
    return SCHED_EPOCH_S * np.maximum(0.0, 1.0 + cv * rng.standard_normal((SCHED_EPOCHS, n_ranks)))


def sched_worker(case: str, out: str) -> None:
    """Under mpiexec: every mode in turn, SCHED_EPOCHS epochs of sleep + exchange; finishing time of every rank."""
    from mpi4py import MPI

    import sagips.comm  # noqa: F401  (thread level before MPI init)
    from sagips.comm.modes import build_exchange
    from sagips.comm.topology import build_topology

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    cv, straggle = SCHED_CASES[case]
    sleeps = sched_compute(size, cv)
    sleeps[:, size - 1] += straggle if size > 1 else 0.0
    results = {}
    for mode in MODES:
        topo = build_topology(comm, min(VALIDATION_INNER, size))
        ex = build_exchange(mode, topo, N_WEIGHTS, ring="whole", outer_every=20, max_staleness=10, timeout_s=60)
        buf = np.zeros(N_WEIGHTS, np.float32)
        comm.Barrier()
        t0 = time.perf_counter()
        for epoch in range(1, SCHED_EPOCHS + 1):
            time.sleep(sleeps[epoch - 1, rank])
            ex(buf, epoch)
        finish = time.perf_counter() - t0
        ex.free()
        topo.free()
        results[mode] = comm.gather(finish, root=0)
        comm.Barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"case": case, "n_ranks": size, "finish": results}))


def run_schedule_replay() -> list[dict]:
    out = []
    for n in (1, 2, 4):
        for case in SCHED_CASES:
            if n == 1 and "straggler" in case:
                continue
            tmp = DOCS / f".scaling-sched-{n}.json"
            cmd = ["timeout", "120", mpiexec(), "-n", str(n), sys.executable, __file__, "_sched-worker",
                   "--case", case, "--out", str(tmp)]
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, cwd=REPO)
            out.append(json.loads(tmp.read_text()))
            tmp.unlink()
    return out


def replay_profile(cal: dict, n: int, wake_s: float, rounds: float) -> Profile:
    prof = local_profile(cal, {"mean_s": SCHED_EPOCH_S, "robust_cv": 0.0, "cv": 0.0, "events_per_epoch": 1}, n)
    prof.cpu_cores = None  # sleeping ranks do not share the cores
    prof.polling, prof.wake_s, prof.collective_rounds = True, wake_s, rounds
    return prof


def _replay_sim(rep: dict, mode: str, prof: Profile):
    n = rep["n_ranks"]
    cv, straggle = SCHED_CASES[rep["case"]]
    compute = sched_compute(n, cv)
    if n > 1:
        compute[:, n - 1] += straggle
    return simulate(mode, n, SCHED_EPOCHS, prof, inner_size=min(VALIDATION_INNER, n), outer_every=20,
                    compute=compute)


def _bisect(f, lo: float, hi: float, target: float, steps: int = 30) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (clipped to the interval)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


FIT_CASE = ("jitter 10%", 2)  # the replay the two polling parameters are fitted on; the others validate them


def fit_polling(replays: list[dict], cal: dict) -> dict:
    """wake_s from the arar ring and collective_rounds from allreduce, both in the jitter replay at N=2."""
    rep = next((r for r in replays if (r["case"], r["n_ranks"]) == FIT_CASE), None)
    if rep is None:
        return {"wake_s": 0.0, "collective_rounds": 1.0, "fitted_on": None}
    n = rep["n_ranks"]
    wake = _bisect(lambda w: _replay_sim(rep, "arar", replay_profile(cal, n, w, 1.0)).train_s, 0.0, 0.02,
                   max(rep["finish"]["arar"]))
    rounds = _bisect(lambda x: _replay_sim(rep, "allreduce", replay_profile(cal, n, wake, x)).train_s, 0.0, 200.0,
                     max(rep["finish"]["allreduce"]))
    return {"wake_s": wake, "collective_rounds": rounds, "fitted_on": f"{FIT_CASE[0]}, N={FIT_CASE[1]} "
            "(arar -> wake_s, allreduce -> collective_rounds)"}


def validate_schedule(replays: list[dict], cal: dict, poll: dict | None = None) -> list[dict]:
    """Model vs measured finishing times of the schedule replay (same sleeps, the measured hop costs, the polling
    parameters fitted on FIT_CASE). Rows of FIT_CASE are marked: they are calibration, not validation."""
    poll = poll or fit_polling(replays, cal)
    rows = []
    for rep in replays:
        n = rep["n_ranks"]
        prof = replay_profile(cal, n, poll["wake_s"], poll["collective_rounds"])
        for mode, finish in rep["finish"].items():
            res = _replay_sim(rep, mode, prof)
            measured = max(finish)
            fitted = (rep["case"], n) == FIT_CASE and mode in ("arar", "allreduce")
            rows.append({"case": rep["case"], "mode": mode, "n_ranks": n, "measured_s": measured,
                         "predicted_s": res.train_s, "rel_error": (res.train_s - measured) / measured,
                         "fitted": fitted, "measured_by_rank": finish, "predicted_by_rank": res.finish.tolist()})
    return rows


def measure_mpi(ns=MPI_NS, reps: int = 60) -> list[dict]:
    records = []
    for n in ns:
        tmp = DOCS / f".scaling-mpi-{n}.json"
        n_reps = reps if n <= cores() else max(10, reps // 6)  # oversubscribed: fewer reps
        cmd = ["timeout", "120", mpiexec(), "-n", str(n), sys.executable, __file__, "_mpi-worker",
               "--reps", str(n_reps), "--out", str(tmp)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)
        records += json.loads(tmp.read_text())
        tmp.unlink()
    return records


def _median_time(fn, reps: int = 300) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def measure_local() -> dict:
    """Per-element costs of the local work inside the exchanges (numpy and zlib on this CPU)."""
    n = N_WEIGHTS
    a = np.random.default_rng(0).standard_normal(n + 1).astype(np.float32)
    b = a.copy()
    raw = np.zeros(4 * n + 48, np.uint8)
    dst = np.zeros_like(raw)
    add = _median_time(lambda: b.__iadd__(a))
    copy = _median_time(lambda: np.copyto(b, a))
    div = _median_time(lambda: np.divide(a[:-1], a[-1], out=b[:-1]))
    memcpy = _median_time(lambda: np.copyto(dst, raw))
    crc = _median_time(lambda: zlib.crc32(raw), reps=100)
    return {"n_floats": n, "add_s_per_float": add / (n + 1), "copy_s_per_float": copy / (n + 1),
            "divide_s_per_float": div / n, "memcpy_s_per_byte": memcpy / raw.size,
            "crc32_s_per_byte": crc / raw.size, "add_s": add, "copy_s": copy, "divide_s": div,
            "memcpy_s": memcpy, "crc32_s": crc}


def sagips_run(out_dir: Path, n_ranks: int, mode: str, epochs: int, extra_sets=(), seed: int = 1234,
               timeout: int = 300) -> dict:
    """One tiny sagips.run (mpiexec for n_ranks > 1); returns the parsed run.json."""
    cmd = [sys.executable, "-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--mode", mode,
           "--epochs", str(epochs), "--output-dir", str(out_dir), "--overwrite", "--no-progress", "--seed", str(seed)]
    for s in [*VALIDATION_SETS, f"comm.inner_size={min(VALIDATION_INNER, n_ranks)}", *extra_sets]:
        cmd += ["--set", s]
    if n_ranks > 1:
        cmd = [mpiexec(), "-n", str(n_ranks), *cmd]
    cmd = ["timeout", str(timeout), *cmd]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return json.loads((out_dir / "run.json").read_text())


def measure_epoch(work: Path, epochs: int = VALIDATION_EPOCHS, repeats: int = 3) -> dict:
    """Single-rank epoch timing with the validation settings, `repeats` times.

    This machine's 2 cores are shared with other jobs, whose bursts slow a run by up to several times. The least
    disturbed of the repeats estimates the undisturbed epoch time: epoch_s = min over repeats of train_s / epochs
    (first epoch included, as in every run). Per-epoch times come from metrics.jsonl (train.log_every=1); the
    jitter is the robust (IQR) coefficient of variation of the least disturbed repeat.
    """
    timings = []
    for rep in range(repeats):
        out = work / f"epoch-timing-{rep}"
        run = sagips_run(out, 1, "ensemble", epochs, extra_sets=["train.log_every=1", "train.quality_samples=16"],
                         seed=99 + rep)
        t = [json.loads(line)["time_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        dt = np.diff(t)[2:]  # skip the first epochs (allocation, warm-up)
        q25, q75 = np.percentile(dt, [25, 75])
        timings.append({"train_s": max(run["train_seconds"]), "epochs": run["epochs"],
                        "per_epoch_mean_s": float(dt.mean()), "per_epoch_median_s": float(np.median(dt)),
                        "cv": float(dt.std() / dt.mean()), "robust_cv": float((q75 - q25) / 1.349 / np.median(dt)),
                        "loadavg": list(os.getloadavg())})
        print(f"  epoch timing {rep}: {timings[-1]['train_s'] / epochs * 1e3:.1f} ms/epoch", flush=True)
    best = min(timings, key=lambda x: x["train_s"] / x["epochs"])
    # co-running: the same ensemble with one rank per core (no exchange); how much slower each rank computes when
    # the other cores are busy too (shared caches, memory bandwidth, clocks)
    corun = []
    n_co = cores()
    for rep in range(repeats if n_co > 1 else 0):
        r = sagips_run(work / f"epoch-corun-{rep}", n_co, "ensemble", epochs, seed=199 + rep)
        corun.append(max(r["train_seconds"]) / r["epochs"])
        print(f"  co-run timing {rep} (N={n_co}, ensemble): {corun[-1] * 1e3:.1f} ms/epoch", flush=True)
    single = best["train_s"] / best["epochs"]
    return {"epochs": epochs, "repeats": timings, "mean_s": single,
            "median_s": best["per_epoch_median_s"], "cv": best["cv"], "robust_cv": best["robust_cv"],
            "events_per_epoch": run["events_per_epoch"], "statistic": "min over repeats of train_s / epochs",
            "corun_s": corun, "corun_factor": max(1.0, min(corun) / single) if corun else 1.0}


def cmd_measure(args) -> None:
    DOCS.mkdir(parents=True, exist_ok=True)
    data = json.loads(MEASUREMENTS.read_text()) if MEASUREMENTS.exists() else {}
    data["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cores": cores(), "machine": platform.machine(),
                    "cpu": cpu_name(), "python": platform.python_version(), "numpy": np.__version__,
                    "loadavg_before": list(os.getloadavg())}
    data["local"] = measure_local()
    data["exchange"] = measure_mpi(reps=args.reps)
    data["meta"]["loadavg_after"] = list(os.getloadavg())
    MEASUREMENTS.write_text(json.dumps(data, indent=1))
    data["epoch"] = measure_epoch(Path(args.work))
    MEASUREMENTS.write_text(json.dumps(data, indent=1))
    print(f"wrote {MEASUREMENTS.relative_to(REPO)}")


# ================================================================================================ 2. calibrate
def exchange_records(data: dict) -> list[dict]:
    """Exchange timings as records {technique, n_ranks, n_floats, seconds, source}, from either format:
    ours (scaling_measurements.json: "exchange" list) or benchmarks/exchange.py's (meta + runs[].techniques)."""
    if "exchange" in data:
        return [{**r, "source": "scaling_measurements.json"} for r in data["exchange"]]
    if "runs" in data and "meta" in data:
        names = {"ring-whole": "ring-whole", "ring-chunked": "ring-chunked", "rma": "rma",
                 "iallreduce-watchdog": "allreduce", "allreduce": "allreduce-blocking",
                 "ring-whole-waitall": "ring-whole-waitall"}
        out = []
        for run in data["runs"]:
            for tech, st in run["techniques"].items():
                out.append({"technique": names.get(tech, tech), "n_ranks": run["n_ranks"],
                            "n_floats": data["meta"]["n_floats"], "seconds": st["median_ms"] / 1e3,
                            "p10_s": st["p10_ms"] / 1e3, "p90_s": st["p90_ms"] / 1e3, "source": "exchange.json"})
        return out
    raise ValueError("unknown measurement format: expected 'exchange' records or exchange.py's 'meta' + 'runs'")


def _ring_parts(tech: str, n_ranks: int, n: int, local: dict) -> tuple[float, float, float]:
    """(hops, bytes per hop, seconds of local work) of one ring call, as sagips/comm/ring.py does it."""
    m = n + 1
    load_divide = m * local["copy_s_per_float"] + n * local["divide_s_per_float"]
    if tech in ("ring-whole", "ring-whole-waitall"):
        return n_ranks - 1, 4 * m, load_divide + (n_ranks - 1) * m * local["add_s_per_float"]
    chunk = math.ceil(m / n_ranks)
    return 2 * (n_ranks - 1), 4 * chunk, load_divide + (n_ranks - 1) * chunk * local["add_s_per_float"]


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best of the least-squares fits over every subset
    of free unknowns (the others at 0) whose solution is non-negative. Exact, and 2^k fits is nothing for k = 3."""
    import itertools

    k = A.shape[1]
    best, best_res = np.zeros(k), float(np.sum(y ** 2))
    for r in range(1, k + 1):
        for free in itertools.combinations(range(k), r):
            x_free, *_ = np.linalg.lstsq(A[:, free], y, rcond=None)
            if np.any(x_free < 0):
                continue
            x = np.zeros(k)
            x[list(free)] = x_free
            res = float(np.sum((A @ x - y) ** 2))
            if res < best_res - 1e-30:
                best, best_res = x, res
    return best


def calibrate(measurements_json, extra_json=None, stat: str = "p10_s") -> dict:
    """Fit the model's exchange inputs from measured exchange times on one machine.

    measurements_json: path or dict in the format of scaling_measurements.json (needs "local" and "exchange") or
    of benchmarks/exchange.py (then the local per-element costs must come from `extra_json`, ours).

    The link is fitted on the `stat` quantile (default the 10th percentile over reps: the cost when no process
    of the ring was preempted, which is what a dedicated node sees; this machine's 2 cores are shared with other
    jobs) of the ring times at N <= cores, after removing the measured local work (copy-in, row or chunk
    additions, divide): time = t0 + hops * (alpha + bytes * beta), non-negative least squares.
    Returns alpha/beta/t0 (all ranks on one node: the intra-node link), hop_overhead_s (alpha minus the MPI
    shared-memory latency: the Python/mpi4py part of a hop), call_overhead_s (Iallreduce + watchdog wait beyond the
    MPI rounds), rma_fixed_s / rma_per_peer_s, reduce_s_per_float, buffer_s (copy in + divide out per call), the
    fit residuals, and alpha_by_n: the per-hop cost at every N from the MEDIAN times with t0 and beta fixed (at
    N > cores it contains the OS time-slicing of an oversubscribed machine; only the local validation uses it).
    """
    data = _load(measurements_json)
    extra = _load(extra_json) if extra_json is not None else {}
    local = data.get("local") or extra.get("local")
    if local is None:
        raise ValueError("calibrate: no local per-element timings ('local'); run `scaling_model.py measure`")
    n_cores = data.get("meta", {}).get("cores") or extra.get("meta", {}).get("cores") or cores()
    recs = exchange_records(data)
    rings = [r for r in recs if r["technique"] in ("ring-whole", "ring-chunked")]
    fit_rows = [r for r in rings if r["n_ranks"] <= n_cores]
    if not fit_rows:
        raise ValueError("calibrate: no ring timings at N <= cores")

    def q(r):
        return r.get(stat, r["seconds"])

    A, y = [], []
    for r in fit_rows:
        hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
        A.append([1.0, hops, hops * nbytes])
        y.append(q(r) - loc)
    A, y = np.array(A, float), np.array(y, float)
    if len({r["n_floats"] for r in fit_rows}) > 1:
        t0, alpha, beta = (float(v) for v in _nnls(A, y))
    else:  # one size: alpha and beta are not separable; beta from the measured memcpy bandwidth, no t0
        t0, beta = 0.0, local["memcpy_s_per_byte"]
        alpha = float(np.mean((y - A[:, 2] * beta) / A[:, 1]))
    # a fit that lands on its bound measured nothing: say so (the page lists these, and no scenario scales them)
    at_bounds = [name for name, v, lo in (("t0_s", t0, 0.0), ("alpha_s", alpha, 1e-7), ("beta_s_per_byte", beta, 1e-13))
                 if v <= lo + 1e-12]
    if alpha - LOCAL_MPI_LATENCY_S <= 0.0:
        at_bounds.append("hop_overhead_s")
    alpha, beta = max(alpha, 1e-7), max(beta, 1e-13)
    residuals = []
    for r in rings:
        hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
        pred = loc + t0 + hops * (alpha + nbytes * beta)
        residuals.append({"technique": r["technique"], "n_ranks": r["n_ranks"], "n_floats": r["n_floats"],
                          "measured_s": q(r), "median_s": r["seconds"], "predicted_s": pred,
                          "rel_error": (pred - q(r)) / q(r), "in_fit": r["n_ranks"] <= n_cores,
                          "source": r["source"]})
    # per-N effective hop cost from the medians at the exchanged size (t0 and beta fixed)
    alpha_by_n = {}
    for n_ranks in sorted({r["n_ranks"] for r in rings}):
        big = max(r["n_floats"] for r in rings if r["n_ranks"] == n_ranks)
        vals = []
        for r in rings:
            if r["n_ranks"] == n_ranks and r["n_floats"] == big:
                hops, nbytes, loc = _ring_parts(r["technique"], n_ranks, r["n_floats"], local)
                vals.append((r["seconds"] - loc - t0) / hops - nbytes * beta)
        alpha_by_n[n_ranks] = max(float(np.mean(vals)), alpha)
    # the collective's own Python/mpi4py cost: Iallreduce + watchdog wait, minus the modelled MPI rounds
    from sim import allreduce_cost

    calls = []
    for r in recs:
        if r["technique"] == "allreduce" and r["n_ranks"] <= n_cores:
            p = Profile(name="fit", epoch_s=0.0, intra=Link(LOCAL_MPI_LATENCY_S, 1.0 / beta),
                        inter=Link(LOCAL_MPI_LATENCY_S, 1.0 / beta), ranks_per_node=10 ** 9,
                        reduce_s_per_float=local["add_s_per_float"], n_floats=r["n_floats"])
            calls.append(q(r) - allreduce_cost(r["n_ranks"], p) - r["n_floats"] * local["divide_s_per_float"])
    call_overhead = max(float(np.median(calls)), 0.0) if calls else alpha
    # RMA: bottom-up per peer (store into the peer's window + snapshot copy + crc32 + add), fixed from N=2
    slot = 4 * N_WEIGHTS + 40
    per_peer = 2 * slot * local["memcpy_s_per_byte"] + slot * local["crc32_s_per_byte"] + \
        N_WEIGHTS * local["add_s_per_float"]
    rma2 = [q(r) for r in recs if r["technique"] == "rma" and r["n_ranks"] == 2]
    rma_fixed = max(float(np.median(rma2)) - per_peer, 0.0) if rma2 else slot * local["crc32_s_per_byte"]
    rma2_med = [r["seconds"] for r in recs if r["technique"] == "rma" and r["n_ranks"] == 2]
    rma_fixed_median = max(float(np.median(rma2_med)) - per_peer, 0.0) if rma2_med else rma_fixed
    rma_check = [{"n_ranks": r["n_ranks"], "measured_s": q(r), "median_s": r["seconds"],
                  "predicted_s": rma_fixed + (r["n_ranks"] - 1) * per_peer, "source": r["source"]}
                 for r in recs if r["technique"] == "rma"]
    return {"statistic": stat, "t0_s": t0, "alpha_s": alpha, "beta_s_per_byte": beta,
            "intra_bandwidth_Bps": 1.0 / beta, "hop_overhead_s": max(alpha - LOCAL_MPI_LATENCY_S, 0.0),
            "call_overhead_s": call_overhead, "reduce_s_per_float": local["add_s_per_float"],
            "buffer_s": (N_WEIGHTS + 1) * local["copy_s_per_float"] + N_WEIGHTS * local["divide_s_per_float"],
            "rma_fixed_s": rma_fixed, "rma_fixed_median_s": rma_fixed_median, "rma_per_peer_s": per_peer,
            "rma_check": rma_check, "at_bounds": at_bounds,
            "alpha_by_n": alpha_by_n, "cores": n_cores, "fit_points": len(fit_rows), "residuals": residuals}


def calibrate_all(data: dict) -> dict:
    """calibrate() + the polling parameters fitted on the schedule replay (when it exists)."""
    cal = calibrate(data)
    if data.get("schedule_replay"):
        cal["polling"] = fit_polling(data["schedule_replay"], cal)
    return cal


def _load(x):
    if x is None:
        return {}
    if isinstance(x, dict):
        return x
    return json.loads(Path(x).read_text())


# ================================================================================================ profiles
def local_profile(cal: dict, epoch: dict, n_ranks: int, jitter: str = "robust") -> Profile:
    """This machine: all ranks on one node, compute shared by `cores` cores, hop costs as measured at this N."""
    alpha = cal["alpha_by_n"].get(str(n_ranks), cal["alpha_by_n"].get(n_ranks, cal["alpha_s"]))
    alpha = max(alpha, cal["alpha_s"])
    return Profile(
        name=f"local-{n_ranks}", epoch_s=epoch["mean_s"],
        intra=Link(LOCAL_MPI_LATENCY_S, cal["intra_bandwidth_Bps"]), inter=Link(LOCAL_MPI_LATENCY_S,
                                                                                 cal["intra_bandwidth_Bps"]),
        ranks_per_node=10 ** 6, jitter_cv=epoch["robust_cv"] if jitter == "robust" else epoch["cv"],
        hop_overhead_s=alpha - LOCAL_MPI_LATENCY_S, call_overhead_s=cal["call_overhead_s"] * alpha / cal["alpha_s"],
        reduce_s_per_float=cal["reduce_s_per_float"], offload_s=cal["buffer_s"] + cal["t0_s"],
        rma_fixed_s=cal.get("rma_fixed_median_s", cal["rma_fixed_s"]),
        rma_per_peer_s=cal["rma_per_peer_s"], cpu_cores=cal["cores"], corun_factor=epoch.get("corun_factor", 1.0),
        n_floats=N_WEIGHTS,
        events_per_epoch=epoch["events_per_epoch"], polling="polling" in cal,
        wake_s=cal.get("polling", {}).get("wake_s", 0.0),
        collective_rounds=cal.get("polling", {}).get("collective_rounds", 1.0))


# Polaris inputs that cannot be measured here, with their sources.
A100_EPOCH_S = 0.035
POLARIS_INTRA_BPS = 10e9
POLARIS_WAKE_S = 60e-6
POLARIS_SOURCES = {
    "epoch_s": "A100, paper settings (batch 102,400). Derived from the paper (VI-C3): cutting the discriminator batch "
               "from 102,400 to 5,100 saved ~48 min over 100k epochs = 28.8 ms/epoch for 97,300 events = "
               "0.296 us/event -> 30.3 ms at 102,400, plus ~5 ms per epoch of batch-independent Python/kernel-launch "
               "cost (assumption). Not measured: no GPU in this session.",
    "jitter_cv": "assumption: 2% epoch-to-epoch variation on a dedicated A100 (not measurable here; "
                 "the scenarios table varies it)",
    "ranks_per_node": "Polaris: 4 A100 per node, one rank per GPU (launch/polaris/*.pbs)",
    "inter.latency_s": "HPE Slingshot 11: ~2-3 us MPI small-message latency (vendor/ALCF figures); 2.5 us",
    "inter.bandwidth_Bps": "Slingshot 11 NIC (HPE Cassini): 200 Gb/s = 25 GB/s per NIC; one ring hop crosses one NIC",
    "intra.latency_s": "assumption: ~1 us Cray MPICH shared-memory latency",
    "intra.bandwidth_Bps": "assumption: 10 GB/s for a 200 kB host-to-host copy by Cray MPICH inside a node (single-"
                           "copy XPMEM/CMA path). The exchanged buffer is on the host (gradients offloaded, paper "
                           "IV-B6), so NVLink is not in the path. This machine's ring fit (a loaded 2-core VM) is "
                           "far lower; the scenarios table uses it too",
    "hop_overhead_s": "measured here: the fitted per-hop cost of sagips.comm.ring (Isend + Irecv + watchdog wait loop "
                      "in Python) minus 1 us MPI latency; taken as-is for a Milan core",
    "call_overhead_s": "measured here: Iallreduce + watchdog wait beyond the modelled MPI rounds",
    "reduce_s_per_float": "measured here: numpy float32 add per element",
    "offload_s": "D2H + H2D of the 202 kB buffer over PCIe Gen4 x16 (pinned, ~25 GB/s: 8 us each + ~10 us launch and "
                 "sync each, assumption) + the measured copy-in/divide of the ring buffer + the fitted fixed "
                 "Python cost per exchange call (t0)",
    "rma_fixed_s": "measured here (RmaExchange at N=2, shared-memory window) minus one peer's cost",
    "rma_per_peer_s": "measured here bottom-up: 2 memcpy + crc32 of a 202 kB slot + one numpy add",
    "rendezvous": "MPICH sends 200 kB messages with the rendezvous protocol: a send completes when the receiver posted",
    "polling": (f"sagips.comm.watchdog's wait loop, its own constants (sagips.comm.waitpolicy): spin "
                f"{waitpolicy.SPIN_S * 1e6:.0f} us, yield until {waitpolicy.YIELD_S * 1e3:g} ms, then sleeps of "
                f"{waitpolicy.MIN_SLEEP_S * 1e6:.0f} us doubling to {waitpolicy.MAX_SLEEP_S * 1e3:g} ms"),
    "wake_s": "assumption: 60 us extra per sleep on a dedicated core (Linux default timer slack 50 us + wake-up); "
              "this machine's, fitted on the schedule replay, is ~100x that (2 loaded cores)",
    "collective_rounds": "fitted on the schedule replay (allreduce, N=2): polled steps of MPICH's Iallreduce per "
                         "2 ceil(log2 N) modelled rounds",
    "n_floats": "the generator's weight gradients: 50,688 float32 (paper V-A: weights only are exchanged)",
    "events_per_epoch": "paper Table III: 1024 parameter sets x 100 events = 102,400 (N_disc of eq. 9)",
    "epochs": "paper: 100k epochs", "outer_every": "paper V-C: h = 1000",
}


def polaris_profile(cal: dict, **changes) -> Profile:
    pcie = 2 * (10e-6 + 4 * (N_WEIGHTS + 1) / 25e9)
    p = Profile(
        name="polaris", epoch_s=A100_EPOCH_S, jitter_cv=0.02, ranks_per_node=4,
        intra=Link(1e-6, POLARIS_INTRA_BPS), inter=Link(2.5e-6, 25e9),
        hop_overhead_s=cal["hop_overhead_s"], call_overhead_s=cal["call_overhead_s"],
        reduce_s_per_float=cal["reduce_s_per_float"], offload_s=pcie + cal["buffer_s"] + cal["t0_s"],
        rma_fixed_s=cal["rma_fixed_s"], rma_per_peer_s=cal["rma_per_peer_s"], rendezvous=True,
        n_floats=N_WEIGHTS, events_per_epoch=102_400, sources=POLARIS_SOURCES,
        polling=True, wake_s=POLARIS_WAKE_S, collective_rounds=cal.get("polling", {}).get("collective_rounds", 1.0))
    for k, v in changes.items():
        setattr(p, k, v)
    return p


def profile_dict(p: Profile) -> dict:
    d = {k: v for k, v in p.__dict__.items() if k not in ("intra", "inter", "sources")}
    d["intra"] = {"latency_s": p.intra.latency_s, "bandwidth_Bps": p.intra.bandwidth_Bps}
    d["inter"] = {"latency_s": p.inter.latency_s, "bandwidth_Bps": p.inter.bandwidth_Bps}
    return d


# ================================================================================================ 3. validate
def run_summary(run: dict) -> dict:
    cfg = run["config"]
    layout = run.get("layout") or {}
    return {"mode": run["mode"], "n_ranks": run["world_size"], "epochs": run["epochs"],
            "train_s": max(run["train_seconds"]), "train_seconds": run["train_seconds"],
            "inner_size": cfg["comm"].get("inner_size") or layout.get("inner_size") or run["world_size"],
            "outer_every": cfg["comm"]["outer_every"], "ring": cfg["comm"]["ring"],
            "events_per_epoch": run["events_per_epoch"], "delay_s": cfg.get("pipeline", {}).get("delay_s", 0.0),
            "delay_ranks": cfg.get("pipeline", {}).get("delay_ranks", [])}


def predict_run(s: dict, cal: dict, epoch: dict, seeds: int = 5) -> float:
    prof = local_profile(cal, epoch, s["n_ranks"])
    delays = {r: s["delay_s"] for r in s["delay_ranks"]} if s.get("delay_s") else None
    inner = min(s["inner_size"] or s["n_ranks"], s["n_ranks"])
    ts = [simulate(s["mode"], s["n_ranks"], s["epochs"], prof, inner_size=inner, outer_every=s["outer_every"],
                   ring=s["ring"], delays=delays, seed=seed).train_s for seed in range(seeds)]
    return float(np.mean(ts))


def validate(run_jsons, cal: dict, epoch: dict) -> list[dict]:
    """Predicted vs measured training time of finished runs (paths to run.json, or parsed run.json dicts).

    Runs with the same (mode, N, epochs, inner size, h, ring) are repeats. This machine's 2 cores are shared with
    other jobs whose bursts slow single runs by up to several times; the model predicts the undisturbed time (it
    is calibrated on the least disturbed epoch timing), so the measured time of a group is the MINIMUM over its
    repeats (the least disturbed run), reported with the median and the maximum.
    """
    groups: dict[tuple, list[dict]] = {}
    for rj in run_jsons:
        s = run_summary(_load(rj))
        key = (s["mode"], s["n_ranks"], s["epochs"], s["inner_size"], s["outer_every"], s["ring"])
        groups.setdefault(key, []).append(s)
    rows = []
    for key, runs in groups.items():
        s = runs[0]
        measured = [r["train_s"] for r in runs]
        best = min(measured)
        pred = predict_run(s, cal, epoch)
        rows.append({**{k: s[k] for k in ("mode", "n_ranks", "epochs", "inner_size", "outer_every", "ring")},
                     "repeats": len(runs), "measured_s": best, "measured_median_s": float(np.median(measured)),
                     "measured_max_s": max(measured), "predicted_s": pred, "rel_error": (pred - best) / best})
    return rows


def run_validation_set(work: Path, epochs: int = VALIDATION_EPOCHS, repeats: int = 3, first: int = 0) -> list[dict]:
    """The tiny runs: ensemble at N=1; every mode at N=2 and N=4 (inner groups of 2, h=20); `repeats` rounds,
    interleaved (round r runs every configuration once), so that a burst of background load hits one repeat."""
    configs = [(1, "ensemble")] + [(n, m) for n in (2, 4) for m in MODES]
    runs = []
    for rep in range(first, first + repeats):
        for n_ranks, mode in configs:
            try:
                run = sagips_run(work / f"{mode}-n{n_ranks}-r{rep}", n_ranks, mode, epochs, seed=1234 + rep)
            except subprocess.CalledProcessError as e:
                print(f"  {mode} N={n_ranks} repeat {rep}: FAILED ({e.returncode}); left out", flush=True)
                continue
            runs.append(run)
            print(f"  {mode} N={n_ranks} repeat {rep}: {max(run['train_seconds']):.2f} s", flush=True)
    return runs


def run_paired_set(work: Path, epochs: int = VALIDATION_EPOCHS, rounds: int = 2) -> list[dict]:
    """Paired runs: every configuration right after its own single-rank timing run (same settings, ensemble, 1 rank),
    so that both see the same background load (this machine's cores are shared with other jobs, whose load
    changes over minutes). The N=1 pair (timing run vs an N=1 run) measures the noise floor of the method."""
    configs = [(1, "ensemble")] + [(n, m) for n in (2, 4) for m in MODES]
    pairs = []
    for rnd in range(rounds):
        for n_ranks, mode in configs:
            try:
                ref = sagips_run(work / f"pair-ref-{mode}-n{n_ranks}-r{rnd}", 1, "ensemble", epochs, seed=4321 + rnd)
                run = sagips_run(work / f"pair-{mode}-n{n_ranks}-r{rnd}", n_ranks, mode, epochs, seed=1234 + rnd)
            except subprocess.CalledProcessError as e:
                print(f"  pair {mode} N={n_ranks} round {rnd}: FAILED ({e.returncode}); left out", flush=True)
                continue
            pairs.append({"round": rnd, "ref_epoch_s": max(ref["train_seconds"]) / ref["epochs"],
                          "run": run_summary(run), "loadavg": list(os.getloadavg())})
            print(f"  pair {mode} N={n_ranks} round {rnd}: reference {pairs[-1]['ref_epoch_s'] * 1e3:.1f} ms/epoch, "
                  f"run {pairs[-1]['run']['train_s']:.2f} s", flush=True)
    return pairs


def validate_pairs(pairs: list[dict], cal: dict, epoch: dict) -> list[dict]:
    """Per pair: the run predicted with epoch_s = its own reference run's; per configuration: the median error."""
    groups: dict[tuple, list[dict]] = {}
    for p in pairs:
        s = p["run"]
        pred = predict_run(s, cal, {**epoch, "mean_s": p["ref_epoch_s"]})
        groups.setdefault((s["mode"], s["n_ranks"]), []).append(
            {"measured_s": s["train_s"], "predicted_s": pred, "rel_error": (pred - s["train_s"]) / s["train_s"],
             "ref_epoch_s": p["ref_epoch_s"], "s": s})
    rows = []
    for (mode, n), items in groups.items():
        errs = [x["rel_error"] for x in items]
        s = items[0]["s"]
        rows.append({"mode": mode, "n_ranks": n, "epochs": s["epochs"], "inner_size": s["inner_size"],
                     "outer_every": s["outer_every"], "ring": s["ring"], "pairs": len(items),
                     "measured_s": [x["measured_s"] for x in items], "predicted_s": [x["predicted_s"] for x in items],
                     "ref_epoch_s": [x["ref_epoch_s"] for x in items], "rel_errors": errs,
                     "rel_error": float(np.median(errs))})
    return rows


def cmd_validate(args) -> None:
    data = json.loads(MEASUREMENTS.read_text())
    work = Path(args.work)
    if args.schedule:
        data["schedule_replay"] = run_schedule_replay()
        MEASUREMENTS.write_text(json.dumps(data, indent=1))
    if args.paired:
        old = data.get("validation_pairs", []) if args.append else []
        data["validation_pairs"] = old + run_paired_set(work, args.epochs, args.repeats)
        MEASUREMENTS.write_text(json.dumps(data, indent=1))
    if args.run:
        if args.recalibrate_epoch:
            data["epoch"] = measure_epoch(work)
        old = data.get("validation_runs", []) if args.append else []
        runs = run_validation_set(work, args.epochs, args.repeats, first=len(old) // 11)
        data["validation_runs"] = old + [run_summary(r) for r in runs]
        data["validation_loadavg"] = list(os.getloadavg())
        if args.note or not args.append:  # a fresh set drops the old set's remark
            data["validation_note"] = args.note
        MEASUREMENTS.write_text(json.dumps(data, indent=1))
    cal = calibrate_all(data)
    rows = validate([_as_run(s) for s in data.get("validation_runs", [])], cal, data["epoch"])
    for r in rows:
        print(f"  {r['mode']:14s} N={r['n_ranks']}: measured {r['measured_s']:7.2f} s (min of {r['repeats']}), "
              f"predicted {r['predicted_s']:7.2f} s, error {100 * r['rel_error']:+6.1f}%")
    poll = cal.get("polling") or fit_polling(data.get("schedule_replay", []), cal)
    print(f"  polling fit: wake_s = {poll['wake_s'] * 1e3:.2f} ms, collective_rounds = {poll['collective_rounds']:.2f}")
    for r in validate_schedule(data.get("schedule_replay", []), cal, poll):
        print(f"  replay {r['case']:34s} {r['mode']:14s} N={r['n_ranks']}: measured {r['measured_s']:.3f} s, "
              f"predicted {r['predicted_s']:.3f} s, error {100 * r['rel_error']:+.1f}%{' (fitted)' if r['fitted'] else ''}")
    for r in validate_pairs(data.get("validation_pairs", []), cal, data["epoch"]):
        print(f"  paired {r['mode']:14s} N={r['n_ranks']}: errors " +
              ", ".join(f"{100 * e:+.0f}%" for e in r["rel_errors"]) + f" (median {100 * r['rel_error']:+.0f}%)")


def _as_run(s: dict) -> dict:
    """A stored run summary in the shape of run.json (validate() takes either)."""
    return {"mode": s["mode"], "world_size": s["n_ranks"], "epochs": s["epochs"], "train_seconds": s["train_seconds"],
            "events_per_epoch": s["events_per_epoch"], "layout": {"inner_size": s["inner_size"]},
            "config": {"comm": {"inner_size": s["inner_size"], "outer_every": s["outer_every"], "ring": s["ring"]},
                       "pipeline": {"delay_s": s.get("delay_s", 0.0), "delay_ranks": s.get("delay_ranks", [])}}}


# ================================================================================================ 4. project
RANKS = (4, 8, 16, 32, 64, 128, 256, 400)
CURVES = [  # (label, mode, ring)
    ("allreduce (MPI_Allreduce)", "allreduce", "whole"),
    ("conventional ARAR (whole ring)", "arar", "whole"),
    ("conventional ARAR (chunked ring)", "arar", "chunked"),
    ("ARAR-ARAR (grouped)", "arar-arar", "whole"),
    ("RMA-ARAR-ARAR (grouped)", "rma-arar-arar", "whole"),
]
EPOCHS = 100_000
H = 1000


def projection(prof: Profile, ranks=RANKS, curves=CURVES, straggler_prob: float = 0.0, straggler_s: float = 0.0,
               seed: int = 0, quick: bool = False) -> dict:
    """Every curve at every N. quick: fewer simulated epochs for allreduce/arar (scenarios, bisection)."""
    out = {}
    for label, mode, ring in curves:
        rows = []
        for n in ranks:
            sim_epochs = 40 if quick and mode in ("allreduce", "arar") else None
            rows.append(project(mode, n, prof, EPOCHS, outer_every=H, ring=ring, straggler_prob=straggler_prob,
                                straggler_s=straggler_s, seed=seed, sim_epochs=sim_epochs))
        gain = rows[-1]["rate"] / rows[0]["rate"]
        out[label] = {"mode": mode, "ring": ring, "points": rows, "gain": gain}
    single = project("ensemble", 1, prof, EPOCHS, straggler_prob=straggler_prob, straggler_s=straggler_s, seed=seed)
    res = {"curves": out, "single_gpu": single, "ranks": list(ranks),
           "whole_ring_limit_no_overshoot": whole_ring_limit(prof)}
    res["whole_ring_limit"] = saturation_limit(res)
    return res


def saturation_limit(proj: dict) -> float | None:
    """N_disc / (per-epoch time added per rank by the whole ring, from its 4 -> 400 points): the rate it tends to."""
    c = proj["curves"].get("conventional ARAR (whole ring)")
    if not c or len(c["points"]) < 2:
        return None
    a, b = c["points"][0], c["points"][-1]
    slope = (b["epoch_s"] - a["epoch_s"]) / (b["n_ranks"] - a["n_ranks"])
    events = b["rate"] * b["train_s"] / (b["n_ranks"] * b["epochs"])
    return events / slope if slope > 0 else None


def whole_ring_limit(prof: Profile) -> float:
    """Asymptotic eq.-9 rate of the whole ring: per epoch ~ N x (slowest hop + one row addition), so the rate
    N * N_disc / time tends to N_disc / (hop + n * add) as N grows."""
    hop = prof.hop_overhead_s + max(prof.intra.time(prof.nbytes), prof.inter.time(prof.nbytes))
    return prof.events_per_epoch / (hop + prof.n_floats * prof.reduce_s_per_float)


def hop_scenarios(cal: dict) -> list[tuple[str, dict, dict]]:
    """The Python per-hop cost scaled by 1/3 and 3 where it was measured; where its fit sat at the bound 0 (nothing
    measured: scaling 0 changes nothing), assumed absolute costs instead, labelled as such."""
    hop = cal["hop_overhead_s"]
    if hop > 0 and "hop_overhead_s" not in cal.get("at_bounds", []):
        return [("Python hop overhead / 3", {"hop_overhead_s": hop / 3}, {}),
                ("Python hop overhead x 3", {"hop_overhead_s": 3 * hop}, {})]
    return [(f"Python hop overhead {v * 1e6:.0f} us (assumed: the fit sat at 0)", {"hop_overhead_s": v}, {})
            for v in (10e-6, 30e-6)]


def scenarios(cal: dict) -> list[dict]:
    """Gains from 4 to 400 ranks under changed inputs (one change at a time)."""
    base = dict()
    cases = [
        ("baseline", base, {}),
        ("A100 epoch 10 ms", {"epoch_s": 0.010}, {}),
        ("A100 epoch 100 ms", {"epoch_s": 0.100}, {}),
        ("no jitter", {"jitter_cv": 0.0}, {}),
        ("jitter 5%", {"jitter_cv": 0.05}, {}),
        *hop_scenarios(cal),
        ("eager sends (no rendezvous)", {"rendezvous": False}, {}),
        ("busy-wait exchanges (no sleep back-off)", {"polling": False}, {}),
        ("wake-up 1 ms per sleep (a loaded node)", {"wake_s": 1e-3}, {}),
        ("intra-node bandwidth as fitted on this machine", {"intra": Link(1e-6, cal["intra_bandwidth_Bps"])}, {}),
        ("random stragglers: 0.1% of rank-epochs +1 epoch", {}, {"straggler_prob": 1e-3, "straggler_s": A100_EPOCH_S}),
    ]
    rows = []
    for label, changes, kw in cases:
        prof = polaris_profile(cal, **changes)
        res = projection(prof, ranks=(4, 400), **kw)  # the projection's own epochs (quick=False)
        rows.append({"scenario": label, "changes": {k: (v.__dict__ if isinstance(v, Link) else v)
                                                    for k, v in changes.items()}, **kw,
                     "gains": {k: v["gain"] for k, v in res["curves"].items()},
                     "train_h_400": {k: v["points"][-1]["train_s"] / 3600 for k, v in res["curves"].items()}})
        print(f"  scenario {label}: " + ", ".join(f"{k.split(' (')[0]} {v:.0f}x" for k, v in rows[-1]["gains"].items()),
              flush=True)
    return rows


def paper_like_hop(cal: dict) -> dict:
    """The per-hop cost that would give the paper's ~40x for conventional ARAR (bisection on the model)."""
    lo, hi = 0.0, 2e-3
    for _ in range(12):
        mid = 0.5 * (lo + hi)
        prof = polaris_profile(cal, hop_overhead_s=mid)
        g = projection(prof, ranks=(4, 400), curves=[CURVES[1]], quick=True)["curves"][CURVES[1][0]]["gain"]
        lo, hi = (mid, hi) if g > 40 else (lo, mid)
    prof = polaris_profile(cal, hop_overhead_s=hi)
    res = projection(prof, ranks=(4, 400))  # the reported gains: the projection's own epochs
    return {"hop_overhead_s": hi, "gains": {k: v["gain"] for k, v in res["curves"].items()}}


def figures(proj: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"allreduce": ("tab:gray", "o", "-"), "arar": ("tab:red", "s", "-"),
              "arar-arar": ("tab:blue", "^", "-"), "rma-arar-arar": ("tab:green", "D", "-")}
    ranks = np.array(proj["ranks"])

    def add_node_axis(ax):
        top = ax.secondary_xaxis("top", functions=(lambda n: n / 4, lambda m: m * 4))
        nodes = [n // 4 for n in proj["ranks"]]
        top.set_xticks(nodes, [str(m) for m in nodes])
        top.minorticks_off()
        top.set_xlabel("nodes (4 A100 each)", color="tab:red")
        top.tick_params(axis="x", colors="tab:red")

    # Fig. 11 style: training time vs ranks (log x)
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    for label, c in proj["curves"].items():
        color, marker, ls = styles[c["mode"]]
        if c["ring"] == "chunked":
            ls, marker = "--", "x"
        ax.plot(ranks, [p["train_s"] / 3600 for p in c["points"]], ls, color=color, marker=marker, label=label)
    ax.axhline(proj["single_gpu"]["train_s"] / 3600, color="k", ls=":", lw=1, label="single GPU (no exchange)")
    ax.set_xscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("N(ranks)")
    ax.set_ylabel("total training time [h] (100k epochs)")
    ax.set_title("Projected training time on Polaris (model, h = 1000)", fontsize=10)
    add_node_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(FIG_TIME, dpi=130)
    plt.close(fig)

    # Fig. 12 style: analysis rate vs ranks (log-log), single-GPU rate dashed, rates at N=400 in the corner
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    lines = []
    for label, c in proj["curves"].items():
        color, marker, ls = styles[c["mode"]]
        if c["ring"] == "chunked":
            ls, marker = "--", "x"
        ax.plot(ranks, [p["rate"] for p in c["points"]], ls, color=color, marker=marker, label=label)
        lines.append(f"{label.split(' (')[0]}{' (chunked)' if c['ring'] == 'chunked' else ''}: "
                     f"{c['points'][-1]['rate']:.2e}/s ({c['gain']:.0f}x)")
    ax.axhline(proj["single_gpu"]["rate"], color="k", ls="--", lw=1,
               label=f"single GPU: {proj['single_gpu']['rate']:.2e} events/s")
    if proj.get("whole_ring_limit"):
        ax.axhline(proj["whole_ring_limit"], color="tab:red", ls=":", lw=1,
                   label=f"whole-ring saturation (N -> inf): {proj['whole_ring_limit']:.2e} events/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("N(ranks)")
    ax.set_ylabel("analysis rate [events/s] (eq. 9)")
    ax.set_title("Projected analysis rate on Polaris (model, h = 1000)", fontsize=10)
    add_node_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.text(0.98, 0.03, "N = 400 (gain vs N = 4):\n" + "\n".join(lines), transform=ax.transAxes, fontsize=6.5,
            ha="right", va="bottom", bbox=dict(boxstyle="round", fc="white", ec="0.7"))
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(FIG_RATE, dpi=130)
    plt.close(fig)


def cmd_project(args) -> None:
    data = json.loads(MEASUREMENTS.read_text())
    cal = calibrate_all(data)
    cross = None
    if EXCHANGE_JSON.exists():
        try:
            cross = calibrate(EXCHANGE_JSON, extra_json=data)
        except ValueError as e:
            cross = {"error": str(e)}
    prof = polaris_profile(cal)
    print("projection (Polaris profile)...", flush=True)
    proj = projection(prof)
    for label, c in proj["curves"].items():
        print(f"  {label}: gain 4->400 = {c['gain']:.1f}x, T(400) = {c['points'][-1]['train_s'] / 3600:.2f} h")
    scen = scenarios(cal)
    paper = paper_like_hop(cal)
    val_rows = validate([_as_run(s) for s in data.get("validation_runs", [])], cal, data["epoch"]) \
        if data.get("validation_runs") else []
    pair_rows = validate_pairs(data.get("validation_pairs", []), cal, data["epoch"])
    replay_rows = validate_schedule(data.get("schedule_replay", []), cal, cal.get("polling"))
    result = {
        "model": "benchmarks/sim.py (discrete-event schedule of every mode; see its docstring)",
        "calibration": {k: v for k, v in cal.items()},
        "calibration_from_exchange_json": cross,
        "local_measurements": {"meta": data.get("meta"), "local": data.get("local"), "epoch": data.get("epoch")},
        "validation": {"schedule_replay": replay_rows, "polling_fit": cal.get("polling"),
                       "max_abs_error_replay": max((abs(r["rel_error"]) for r in replay_rows if not r["fitted"]),
                                                   default=None),
                       "replay_settings": {"epochs": SCHED_EPOCHS, "epoch_s": SCHED_EPOCH_S, "cases": SCHED_CASES,
                                           "inner_size": VALIDATION_INNER, "outer_every": 20},
                       "pairs": pair_rows,
                       "max_abs_median_error_pairs": max((abs(r["rel_error"]) for r in pair_rows), default=None),
                       "runs": val_rows, "settings": {"epochs": VALIDATION_EPOCHS, "sets": VALIDATION_SETS},
                       "loadavg": data.get("validation_loadavg"), "note": data.get("validation_note"),
                       "max_abs_error": max((abs(r["rel_error"]) for r in val_rows), default=None)},
        "polaris_profile": {"inputs": profile_dict(prof), "sources": POLARIS_SOURCES,
                            "epochs": EPOCHS, "outer_every": H},
        "projection": proj,
        "gains_4_to_400": {k: v["gain"] for k, v in proj["curves"].items()},
        "scenarios": scen,
        "paper_like_hop": paper,
    }
    OUT_JSON.write_text(json.dumps(result, indent=1, default=float))
    figures(proj)
    OUT_MD.write_text(report(result))
    print(f"wrote {OUT_JSON.relative_to(REPO)}, {OUT_MD.relative_to(REPO)}, {FIG_TIME.name}, {FIG_RATE.name}")


# ================================================================================================ report
def _us(x):
    return f"{x * 1e6:.1f} µs"


def g_sc(r: dict, scenario: str, curve: str) -> float:
    """Gain 4 -> 400 of `curve` in `scenario` (nan if absent)."""
    for sc in r["scenarios"]:
        if sc["scenario"] == scenario:
            return sc["gains"].get(curve, float("nan"))
    return float("nan")


def startup_for_gain(r: dict, target: float) -> float:
    """Extra fixed seconds at N=400 (vs N=4) that would lower the grouped gain to `target`."""
    c = r["projection"]["curves"]["ARAR-ARAR (grouped)"]["points"]
    t4, t400 = c[0]["train_s"], c[-1]["train_s"]
    ratio = c[-1]["n_ranks"] / c[0]["n_ranks"]
    return max(ratio * t4 / target - t400, 0.0)


def report(r: dict) -> str:
    cal, prof = r["calibration"], r["polaris_profile"]["inputs"]
    proj = r["projection"]
    L = []
    w = L.append
    w("# Scaling model: training time and analysis rate vs ranks\n")
    w("Written by `benchmarks/scaling_model.py` (model: `benchmarks/sim.py`). A discrete-event simulation of every mode's "
      "schedule per epoch: compute time per rank (mean + jitter + stragglers), ring hops that wait for their "
      "neighbours (whole: N-1 hops of the full buffer; chunked: 2(N-1) hops of buffer/N), MPI_Allreduce "
      "(Rabenseifner: 2 log2 N rounds, a barrier-like collective), the RMA inner step (local cost only, never "
      "waits), and the leaders' ring every h epochs followed by a broadcast inside each group. "
      "Times are the slowest rank's; rate = eq. 9 = N · N_disc · E / time.\n")
    w("![training time](scaling_time.png) ![analysis rate](scaling_rate.png)\n")

    w("## Projection for Polaris (4 → 400 ranks, 100k epochs, h = 1000)\n")
    w("| curve | " + " | ".join(f"N={n}" for n in proj["ranks"]) + " | gain 4→400 |")
    w("|---|" + "---|" * len(proj["ranks"]) + "---|")
    for label, c in proj["curves"].items():
        w(f"| {label}: time [h] | " + " | ".join(f"{p['train_s'] / 3600:.3f}" for p in c["points"]) + " | |")
        w(f"| {label}: rate [events/s] | " + " | ".join(f"{p['rate']:.3g}" for p in c["points"]) +
          f" | **{c['gain']:.1f}x** |")
    s = proj["single_gpu"]
    w(f"\nSingle GPU (ensemble of one, no exchange): {s['train_s'] / 3600:.3f} h, {s['rate']:.3g} events/s "
      "(the dashed line of the rate figure).\n")
    g = r["gains_4_to_400"]
    grouped = min(g["ARAR-ARAR (grouped)"], g["RMA-ARAR-ARAR (grouped)"])
    w("**Target** (gain from 4 to 400 ranks >= 90x for the grouped modes; conventional ARAR saturates): "
      f"grouped modes {g['ARAR-ARAR (grouped)']:.1f}x (ARAR-ARAR) and {g['RMA-ARAR-ARAR (grouped)']:.1f}x "
      f"(RMA-ARAR-ARAR) -> {'reached' if grouped >= 90 else 'NOT reached'}; conventional ARAR "
      f"{g['conventional ARAR (whole ring)']:.1f}x (whole ring, the paper's), "
      f"{g['conventional ARAR (chunked ring)']:.1f}x (chunked ring); MPI_Allreduce "
      f"{g['allreduce (MPI_Allreduce)']:.1f}x. The paper measured ~40x (conventional) and ~80x (grouped).\n")
    w("Why: a whole ring over N ranks costs N-1 sequential hops every epoch, each a Python-level Isend/Irecv/wait "
      f"(fitted here: {_us(prof['hop_overhead_s'])} per hop beyond the MPI latency, beside a fixed "
      f"{_us(r['calibration'].get('t0_s', 0.0))} per call) plus the 202 kB transfer, plus the addition of N rows, and "
      "every hop whose data is late makes the waiting rank fall into the watchdog's sleep back-off, from which it "
      "wakes late (each sleep costs at least the timer slack, modelled as 60 µs); the lateness passes on to its "
      "neighbour in the next hop. At 400 ranks this is comparable to the A100 epoch itself and grows linearly "
      "with N: the rate saturates. The chunked ring moves 1/N of the bytes per hop but makes twice as many "
      "hops, so while per-hop costs dominate (they do: 200 kB cross Slingshot in ~8 µs) it is *slower*. "
      "MPI_Allreduce needs only 2 log2 N rounds, but as a nonblocking collective polled by the same sleeping loop "
      "each round waits for the early ranks' next test. The grouped modes pay 3 intra-node hops per epoch (or an "
      "RMA step that never waits) and 99 inter-node hops only every 1000 epochs: their per-epoch time is nearly "
      "that of 4 ranks. Their remaining losses are the synchronisation of all ranks at every outer step (the "
      "slowest group of 100 after 1000 jittered epochs), and inside a group the slowest of 4 ranks each epoch "
      "(ARAR-ARAR, also at N = 4).\n")
    sat = proj["curves"]["conventional ARAR (whole ring)"]["points"]
    slope = (sat[-1]["epoch_s"] - sat[0]["epoch_s"]) / (sat[-1]["n_ranks"] - sat[0]["n_ranks"])
    limit = prof["events_per_epoch"] / slope if slope > 0 else float("inf")
    w(f"Saturation: the whole ring adds {_us(slope)} per epoch per rank (4 -> 400), so its rate N · N_disc / "
      f"time tends to N_disc / {_us(slope)} = {limit:.3g} events/s; at 400 ranks it is at "
      f"{100 * sat[-1]['rate'] / limit:.0f}% of that (red dotted line), while the grouped modes still grow "
      "linearly. Without the wait-loop overshoot (one slowest hop plus one row addition per rank) the limit would "
      f"be {proj.get('whole_ring_limit_no_overshoot', float('nan')):.3g} events/s.\n")
    w("Design changes that lift conventional ARAR (and the allreduce baseline), from the scenarios: "
      f"(1) wait without sleeping during an exchange (busy-wait on Test/Waitall, or a back-off capped near the hop "
      f"time instead of 1 ms): whole ring {g_sc(r, 'busy-wait exchanges (no sleep back-off)', 'conventional ARAR (whole ring)'):.0f}x, "
      f"MPI_Allreduce {g_sc(r, 'busy-wait exchanges (no sleep back-off)', 'allreduce (MPI_Allreduce)'):.0f}x; "
      "(2) a tree / recursive-doubling allreduce (MPI_Allreduce with a blocking or busy wait, or NCCL's double "
      "binary tree): log2 N rounds instead of N-1 hops; (3) overlapping the exchange with the next epoch's critic "
      "step (one-step-stale gradients, as Stochastic Gradient Push), which hides it while it is shorter than the "
      "epoch; (4) the chunked ring only once the transfer, not the per-hop cost, dominates (bigger generators, or "
      "a C-level ring such as MPI's own). The grouped modes need none of these to pass 90x.\n")

    w("## Scenarios (gain 4 → 400, one input changed at a time)\n")
    labels = list(r["gains_4_to_400"])
    w("| scenario | " + " | ".join(labels) + " |")
    w("|---|" + "---|" * len(labels))
    for sc in r["scenarios"]:
        w(f"| {sc['scenario']} | " + " | ".join(f"{sc['gains'][k]:.1f}x" for k in labels) + " |")
    p = r["paper_like_hop"]
    conv = g["conventional ARAR (whole ring)"]
    w(f"\nThe paper's ~40x for conventional ARAR: the baseline gives {conv:.0f}x. (For reference, the per-hop "
      f"Python cost that would give exactly 40x is {_us(p['hop_overhead_s'])} instead of the "
      f"{_us(prof['hop_overhead_s'])} measured here.) The model does not reproduce the paper's ~80x for the "
      "grouped modes from the exchange: they stay near 100x in every scenario. The paper's 'total training time' "
      "may include start-up (imports on 400 ranks, the broadcast of the reference data), which sagips.run keeps "
      "out of train_seconds and this model does not contain: 80x instead of "
      f"{g['ARAR-ARAR (grouped)']:.0f}x would take ~{startup_for_gain(r, 80) / 60:.0f} min more start-up at 400 "
      "ranks than at 4.\n")
    w("## Inputs of the Polaris profile\n")
    w("| input | value | source |")
    w("|---|---|---|")
    src = r["polaris_profile"]["sources"]
    rows = [("epoch_s", f"{prof['epoch_s'] * 1e3:.1f} ms"), ("jitter_cv", f"{prof['jitter_cv']:.2f}"),
            ("ranks_per_node", prof["ranks_per_node"]),
            ("inter.latency_s", _us(prof["inter"]["latency_s"])),
            ("inter.bandwidth_Bps", f"{prof['inter']['bandwidth_Bps'] / 1e9:.1f} GB/s"),
            ("intra.latency_s", _us(prof["intra"]["latency_s"])),
            ("intra.bandwidth_Bps", f"{prof['intra']['bandwidth_Bps'] / 1e9:.2f} GB/s"),
            ("hop_overhead_s", _us(prof["hop_overhead_s"])), ("call_overhead_s", _us(prof["call_overhead_s"])),
            ("reduce_s_per_float", f"{prof['reduce_s_per_float'] * 1e12:.0f} ps"),
            ("offload_s", _us(prof["offload_s"])), ("rma_fixed_s", _us(prof["rma_fixed_s"])),
            ("rma_per_peer_s", _us(prof["rma_per_peer_s"])), ("rendezvous", prof["rendezvous"]),
            ("polling", prof["polling"]), ("wake_s", _us(prof["wake_s"])),
            ("collective_rounds", f"{prof['collective_rounds']:.2f}"),
            ("n_floats", f"{prof['n_floats']:,}"), ("events_per_epoch", f"{prof['events_per_epoch']:,}"),
            ("epochs", f"{r['polaris_profile']['epochs']:,}"), ("outer_every", r["polaris_profile"]["outer_every"])]
    for k, v in rows:
        w(f"| {k} | {v} | {src.get(k, '')} |")
    bounds = r["calibration"].get("at_bounds")
    if bounds:
        w(f"\n**Fits at a bound (these inputs were not measured, only clamped):** {', '.join(bounds)}. A scenario "
          "that scales such an input by a factor would equal the baseline; the hop-overhead scenarios then use "
          "assumed absolute values, labelled so.")
    elif bounds is None:
        w("\n(This calibration predates the bound check: rerun `scaling_model.py all` to know whether a fit sat at "
          "its bound.)")

    w("\n## Calibration on this machine\n")
    m = r["local_measurements"]
    meta = m.get("meta") or {}
    la = [meta.get("loadavg_before", [float("nan")])[0], meta.get("loadavg_after", [float("nan")])[0]]
    w(f"{meta.get('cpu', '?')}, {meta.get('cores', '?')} cores shared with other jobs (load average "
      f"{la[0]:.1f} before, {la[1]:.1f} after the measurements). Ring times (10th percentile over reps: the "
      "cost when no rank was preempted) at N <= cores were fitted with time = t0 + hops · (alpha + bytes · beta) "
      f"after removing the measured local work (row additions, copy-in, divide); t0 = {_us(cal['t0_s'])}:\n")
    w(f"- alpha = {_us(cal['alpha_s'])} per hop, beta = {cal['beta_s_per_byte'] * 1e12:.1f} ps/byte "
      f"({cal['intra_bandwidth_Bps'] / 1e9:.2f} GB/s), {cal['fit_points']} points;")
    w(f"- Iallreduce + watchdog call overhead {_us(cal['call_overhead_s'])}; numpy add "
      f"{cal['reduce_s_per_float'] * 1e12:.0f} ps/float; RMA {_us(cal['rma_fixed_s'])} + "
      f"{_us(cal['rma_per_peer_s'])} per peer;")
    w("- per-hop cost by N (at N > cores it contains the OS time-slicing of an oversubscribed machine): " +
      ", ".join(f"N={k}: {_us(v)}" for k, v in cal["alpha_by_n"].items()) + ".\n")
    w("| technique | N | floats | measured p10 (median) | model | error | in fit |")
    w("|---|---|---|---|---|---|---|")
    for x in cal["residuals"]:
        w(f"| {x['technique']} | {x['n_ranks']} | {x['n_floats']:,} | {x['measured_s'] * 1e3:.3f} ms "
          f"({x['median_s'] * 1e3:.3f}) | {x['predicted_s'] * 1e3:.3f} ms | {100 * x['rel_error']:+.0f}% | "
          f"{'yes' if x['in_fit'] else 'no (oversubscribed)'} |")
    cross = r.get("calibration_from_exchange_json")
    if cross and "alpha_s" in cross:
        w(f"\nCross-check with the comm layer's `exchange.json` (benchmarks/exchange.py: one buffer size, N = 2, 4, "
          f"8, another time of day): with one size alpha and beta cannot be separated; with beta fixed to the "
          f"memcpy bandwidth the whole transfer lands in alpha = {_us(cross['alpha_s'])} (vs alpha + 202 kB · beta "
          f"= {_us(cal['alpha_s'] + 4 * (N_WEIGHTS + 1) * cal['beta_s_per_byte'])} here). Per-hop cost by N from "
          "its medians: " + ", ".join(f"N={k}: {_us(v)}" for k, v in cross["alpha_by_n"].items()) + ".")
    ep = m.get("epoch") or {}
    if ep:
        reps = ep.get("repeats", [])
        w(f"\nSingle-rank epoch timing (validation settings: batch {ep.get('events_per_epoch')}, 1 thread), "
          f"{len(reps)} repeats: " + ", ".join(f"{x['train_s'] / x['epochs'] * 1e3:.1f}" for x in reps) +
          f" ms/epoch; the least disturbed, {ep['mean_s'] * 1e3:.1f} ms/epoch, is the local epoch_s (its "
          f"per-epoch CV {ep['cv']:.2f}, robust {ep['robust_cv']:.2f}, is the local jitter).\n")
        if ep.get("corun_s"):
            w("Co-run timing (the same ensemble with one rank per core, no exchange): " +
              ", ".join(f"{t * 1e3:.1f}" for t in ep["corun_s"]) + f" ms/epoch; the least disturbed over the "
              f"single-rank epoch_s is the co-run factor {ep['corun_factor']:.2f}: how much slower a rank computes "
              "while the other core computes too (shared caches, memory bandwidth, clocks). The local profile "
              "multiplies compute by it from N = 2 on (1 on Polaris: one GPU per rank).\n")

    w("## Validation: predicted vs measured time (this machine)\n")
    v = r["validation"]
    if v.get("schedule_replay"):
        st = v["replay_settings"]
        pf = v["polling_fit"] or {}
        w("### 1. Schedule replay: the real exchanges between sleeping pipelines (N = 1, 2, 4)\n")
        w(f"`validate --schedule`: under mpiexec, every mode built by `sagips.comm.modes.build_exchange` (the code "
          f"sagips.run uses) exchanges the 50,688-float buffer for {st['epochs']} epochs; between exchanges each "
          f"rank sleeps a known time ({st['epoch_s'] * 1e3:.0f} ms x (1 + 10% N(0,1)), or +15 ms every epoch on the "
          f"last rank), inner groups of {st['inner_size']}, h = {st['outer_every']}. A sleeping pipeline does not "
          "compete for the 2 shared cores, so this isolates what the model is about: the schedule and its waits. "
          "The model replays the same sleeps. Two parameters of the watchdog's wait loop are fitted on one case "
          f"({pf.get('fitted_on')}): wake_s = {pf.get('wake_s', 0) * 1e3:.2f} ms (how late a sleeping rank wakes "
          f"on this machine) and collective_rounds = {pf.get('collective_rounds', 1):.2f}; every other row "
          "is a prediction.\n")
        w("| case | mode | N | measured [s] | predicted [s] | error |")
        w("|---|---|---|---|---|---|")
        for x in v["schedule_replay"]:
            w(f"| {x['case']} | {x['mode']} | {x['n_ranks']} | {x['measured_s']:.3f} | {x['predicted_s']:.3f} | "
              f"{100 * x['rel_error']:+.1f}%{' (fitted)' if x['fitted'] else ''} |")
        pred_rows = [x for x in v["schedule_replay"] if not x["fitted"]]
        ok = sum(abs(x["rel_error"]) <= 0.2 for x in pred_rows)
        worst = max(pred_rows, key=lambda x: abs(x["rel_error"]))
        w(f"\n{ok} of {len(pred_rows)} predicted rows are within 20%; the largest error is "
          f"{100 * v['max_abs_error_replay']:.1f}% ({worst['mode']}, N={worst['n_ranks']}, {worst['case']}): the "
          "polled rounds of MPI's nonblocking allreduce are the crudest part of the model (fitted at N=2 as "
          "collective_rounds x 2 ceil(log2 N); the measured cost grows more slowly with N). "
          "The straggler rows show the semantics: with +15 ms on the last rank, arar and allreduce run at the "
          "straggler's pace plus their waits; rma-arar-arar stays near the straggler's own time (nobody waits "
          "for it between outer epochs). Before the wait loop was modelled (polling off) the synchronous modes were "
          "under-predicted by 10-39%: on this machine a rank that sleeps in the back-off wakes milliseconds late.\n")
    if v.get("pairs"):
        w("### 2. Tiny training runs (sagips.run), paired\n")
        w(f"Runs (`validate --paired`): configs/proxy1d-quick.yaml, {v['settings']['epochs']} epochs, " +
          ", ".join(f"`{s}`" for s in v["settings"]["sets"]) + f", `comm.inner_size=min({VALIDATION_INNER}, N)`. "
          "This machine's 2 cores are shared with other jobs whose load changes the speed of a run by up to "
          "several times within minutes. So every run is paired with a single-rank reference run of the same "
          "settings started right before it, and is predicted from that reference's epoch time (compute slowed by "
          "the co-run factor from N = 2 on and by N / cores beyond the cores; all ranks on one node; the per-hop cost measured at that "
          "N; the jitter of the epoch timing). The N=1 row compares two consecutive single-rank runs: it is the "
          "noise floor of the method.\n")
        w("| mode | N | reference [ms/epoch] | measured [s] | predicted [s] | error per pair | median error |")
        w("|---|---|---|---|---|---|---|")
        for x in v["pairs"]:
            w(f"| {x['mode']} | {x['n_ranks']} | " + ", ".join(f"{t * 1e3:.0f}" for t in x["ref_epoch_s"]) + " | " +
              ", ".join(f"{t:.2f}" for t in x["measured_s"]) + " | " +
              ", ".join(f"{t:.2f}" for t in x["predicted_s"]) + " | " +
              ", ".join(f"{100 * e:+.0f}%" for e in x["rel_errors"]) + f" | **{100 * x['rel_error']:+.0f}%** |")
        w(f"\nLargest median error: {100 * v['max_abs_median_error_pairs']:.0f}%. The N=1 row, two consecutive "
          "identical single-rank runs, already differs by up to tens of percent: the noise floor of CPU-bound "
          "runs on this shared machine is above the 20% target, so these rows cannot confirm or refute the model "
          "to 20%; the schedule replay above is the validation that can.\n")
    if v["runs"]:
        w("### 3. Tiny training runs, unpaired repeats (calibrated on separate epoch timings)\n")
        w(f"Runs (`validate --run`): configs/proxy1d-quick.yaml, {v['settings']['epochs']} epochs, " +
          ", ".join(f"`{s}`" for s in v["settings"]["sets"]) + f", `comm.inner_size=min({VALIDATION_INNER}, N)`"
          ". The local profile: the single-rank epoch time above, compute slowed by the co-run factor from N = 2 "
          "on and by N / cores beyond the 2 cores, all ranks on one node, the per-hop cost measured at that N.\n")
        w("Runs of one configuration scatter with the background load (the median and maximum columns). The model "
          "is calibrated on the least disturbed single-rank timing, so it is compared with the least disturbed "
          "(minimum) run of each configuration.\n")
        w("| mode | N | epochs | measured [s]: min (median, max) of repeats | predicted [s] | error vs min |")
        w("|---|---|---|---|---|---|")
        for x in v["runs"]:
            w(f"| {x['mode']} | {x['n_ranks']} | {x['epochs']} | {x['measured_s']:.2f} ({x['measured_median_s']:.2f}, "
              f"{x['measured_max_s']:.2f}; {x['repeats']} runs) | {x['predicted_s']:.2f} | "
              f"{100 * x['rel_error']:+.1f}% |")
        ok = sum(abs(x["rel_error"]) <= 0.2 for x in v["runs"])
        worst = max(v["runs"], key=lambda x: abs(x["rel_error"]))
        load = v.get("loadavg")
        w(f"\n{ok} of {len(v['runs'])} configurations are within 20%; the largest error is "
          f"{100 * v['max_abs_error']:.1f}% ({worst['mode']}, N={worst['n_ranks']}), whose own repeats span "
          f"{100 * (worst['measured_max_s'] / worst['measured_s'] - 1):.0f}% (max over min)." +
          (f" Load average (1, 5, 15 min) after the runs: {', '.join(f'{x:.1f}' for x in load)}." if load else "") +
          "\n")
        if v.get("note"):
            w(v["note"] + "\n")
    if not v["runs"] and not v.get("pairs"):
        w("Not run yet: `benchmarks/scaling_model.py validate --paired`.\n")
    w("## Limits\n")
    w("- No GPU and no Polaris in this session: the A100 epoch time is derived from the paper, Slingshot numbers "
      "are vendor figures, and the Python/mpi4py overheads are measured on this (shared, 2-core) machine.\n"
      "- The broadcast after an outer ring is a group barrier + a binomial tree's depth of hops (rendezvous); "
      "MPI_Allreduce a barrier + Rabenseifner rounds; no network contention between simultaneous hops "
      "(one inter-node hop per node pair per ring step, so none is expected for block placement); no OS noise "
      "beyond the Gaussian jitter and the straggler scenarios.\n"
      "- The Python per-hop overhead was measured on this machine's Xeon and is used as-is for Milan; the A100 "
      "epoch time is the input the projection is most sensitive to for conventional ARAR (scenarios).\n"
      "- Start-up (imports, data broadcast) and checkpoint/log time are not modelled (sagips.run keeps them out "
      "of train_seconds too).\n")
    return "\n".join(L) + "\n"


# ================================================================================================ CLI
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="mpiexec timings at N=2,4 + local timings + single-rank epoch timing")
    m.add_argument("--reps", type=int, default=60)
    m.add_argument("--work", default="/tmp/sagips-scaling-model")
    v = sub.add_parser("validate", help="predicted vs measured training time of tiny runs")
    v.add_argument("--run", action="store_true", help="run the tiny runs first (N=1,2,4; ~5 min on 2 cores)")
    v.add_argument("--recalibrate-epoch", action="store_true", help="repeat the single-rank epoch timing first")
    v.add_argument("--epochs", type=int, default=VALIDATION_EPOCHS)
    v.add_argument("--repeats", type=int, default=3)
    v.add_argument("--append", action="store_true", help="add the new runs to the stored ones (more repeats)")
    v.add_argument("--schedule", action="store_true", help="schedule replay: the real exchanges between sleeping "
                   "pipelines at N = 1, 2, 4 (~2 min, little CPU)")
    v.add_argument("--paired", action="store_true", help="paired runs: each configuration right after its own "
                   "single-rank reference run (--repeats rounds)")
    v.add_argument("--note", default="", help="a remark stored with the runs and printed in the report")
    v.add_argument("--work", default="/tmp/sagips-scaling-model")
    sub.add_parser("project", help="the Polaris projection: figures, JSON, Markdown")
    sub.add_parser("report", help="only the page and figures, again, from the stored JSON (no simulation)")
    a = sub.add_parser("all", help="measure, validate --paired, project")
    a.add_argument("--reps", type=int, default=60)
    a.add_argument("--work", default="/tmp/sagips-scaling-model")
    a.add_argument("--epochs", type=int, default=VALIDATION_EPOCHS)
    a.add_argument("--repeats", type=int, default=3)
    sw = sub.add_parser("_sched-worker")
    sw.add_argument("--case", required=True)
    sw.add_argument("--out", required=True)
    w = sub.add_parser("_mpi-worker")
    w.add_argument("--reps", type=int, required=True)
    w.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "_mpi-worker":
        mpi_worker(args.reps, args.out)
    elif args.cmd == "_sched-worker":
        sched_worker(args.case, args.out)
    elif args.cmd == "measure":
        cmd_measure(args)
    elif args.cmd == "validate":
        cmd_validate(args)
    elif args.cmd == "project":
        cmd_project(args)
    elif args.cmd == "report":
        result = json.loads(OUT_JSON.read_text())
        figures(result["projection"])
        OUT_MD.write_text(report(result))
        print(f"wrote {OUT_MD.relative_to(REPO)}, {FIG_TIME.name}, {FIG_RATE.name} from {OUT_JSON.relative_to(REPO)}")
    else:
        cmd_measure(args)
        args.run, args.recalibrate_epoch, args.append, args.note, args.paired = False, False, False, "", True
        args.schedule = True
        cmd_validate(args)
        cmd_project(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
