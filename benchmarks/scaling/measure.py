"""`scaling_model.py measure`: time the real exchange code and this machine's local work.

Writes docs/benchmarks/scaling_measurements.json ("meta", "local", "exchange", "epoch"):
- mpiexec -n 2 and -n 4 (timeout 120 s each) of a small worker that times the real sagips.comm code: Ring
  whole/chunked at 3 buffer sizes (16, 12,672 and 50,688 floats), one hop of the whole ring alone (Ring._hop) at
  the same sizes (the sizes separate the per-hop cost alpha from the per-byte cost beta; the hop alone separates
  both from the ring's per-call work t0), one Iallreduce + watchdog wait (watchdog.allreduce_sum, at the 3 sizes:
  the collective's call overhead), the whole exchange of mode `allreduce` as build_exchange makes it (the buffer's
  Iallreduce and the contributors' count) and RmaExchange.exchange.
  A rep: barrier, then 10 calls back to back (so that the barrier's exit skew is spread over 10 calls), the slowest
  rank's time / 10; quantiles over reps (the order of the techniques is shuffled every rep, the same on every
  rank, so that no technique always follows another);
- in one process: numpy add / copy / divide per float, memcpy and zlib.crc32 per byte (the local work inside a
  ring, an allreduce and an RMA exchange);
- single-rank epoch timing: `sagips.run` (ensemble, 1 rank, 1 thread) of the validation settings, and the same
  ensemble with one rank per core (the co-run factor).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from scaling.common import (
    BATCH,
    DOCS,
    MEASUREMENTS,
    MPI_NS,
    N_WEIGHTS,
    REPO,
    SCRIPT,
    SIZES,
    VALIDATION_EPOCHS,
    cores,
    cpu_capability,
    cpu_name,
    mpiexec,
    sagips_run,
)


def mpi_worker(reps: int, out: str) -> None:
    """Under mpiexec: time the real exchange code at every size, interleaved rep by rep."""
    from mpi4py import MPI

    import sagips.comm  # noqa: F401  (thread level before MPI init)
    from sagips.comm import watchdog
    from sagips.comm.modes import build_exchange
    from sagips.comm.ring import Ring
    from sagips.comm.rma import RmaExchange
    from sagips.comm.topology import build_topology

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    ops, objs = {}, []
    for i, n in enumerate(SIZES):
        whole = Ring(comm, n, "whole", timeout_s=120, tag=200 + 4 * i)
        chunked = Ring(comm, n, "chunked", timeout_s=120, tag=202 + 4 * i)
        ops[("ring-whole", n)] = whole.allreduce
        ops[("ring-chunked", n)] = chunked.allreduce
        # one hop of the whole ring, alone (the ring's own _hop: 2 Isend + 2 Irecv + the watchdog wait): the per-hop
        # cost without the per-call work around it, so that alpha and t0 are measured apart
        recv = np.zeros(n, np.float32)
        ops[("hop", n)] = lambda x, ring=whole, recv=recv: ring._hop(x, recv, ring._w[:1], -1)

        def iallreduce(x):
            watchdog.allreduce_sum(comm, x, timeout_s=120, what="allreduce")
            x /= np.float32(size)

        ops[("allreduce", n)] = iallreduce
    # the exchange of mode `allreduce` as sagips.run builds it (the buffer's Iallreduce + the contributors' count)
    topo = build_topology(comm, size)
    mode_allreduce = build_exchange("allreduce", topo, N_WEIGHTS, timeout_s=120)
    ops[("allreduce-mode", N_WEIGHTS)] = lambda x: mode_allreduce(x, 1)
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
    mode_allreduce.free()
    topo.free()
    records = []
    for key in keys:
        slowest = np.empty(reps)
        comm.Allreduce(times[key], slowest, op=MPI.MAX)  # a rep lasts until its slowest rank is done
        records.append({"technique": key[0], "n_ranks": size, "n_floats": key[1], "reps": reps,
                        "seconds": float(np.median(slowest)), "p10_s": float(np.percentile(slowest, 10)),
                        "p25_s": float(np.percentile(slowest, 25)), "p90_s": float(np.percentile(slowest, 90))})
    if rank == 0:
        Path(out).write_text(json.dumps(records))


def measure_mpi(ns=MPI_NS, reps: int = 60) -> list[dict]:
    records = []
    for n in ns:
        tmp = DOCS / f".scaling-mpi-{n}.json"
        n_reps = reps if n <= cores() else max(10, reps // 6)  # oversubscribed: fewer reps
        cmd = ["timeout", "120", mpiexec(), "-n", str(n), sys.executable, str(SCRIPT), "_mpi-worker",
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
                    "cpu": cpu_name(), "cpu_capability": cpu_capability(), "python": platform.python_version(), "numpy": np.__version__,
                    "loadavg_before": list(os.getloadavg())}
    data["local"] = measure_local()
    data["exchange"] = measure_mpi(reps=args.reps)
    data["meta"]["loadavg_after"] = list(os.getloadavg())
    MEASUREMENTS.write_text(json.dumps(data, indent=1))
    data["epoch"] = measure_epoch(Path(args.work))
    MEASUREMENTS.write_text(json.dumps(data, indent=1))
    print(f"wrote {MEASUREMENTS.relative_to(REPO)}")
