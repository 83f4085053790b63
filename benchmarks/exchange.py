"""Time per exchange of one 51,206-float buffer: ring (whole, chunked), RMA and MPI_Allreduce, at N = 2, 4, 8.

    .venv/bin/python benchmarks/exchange.py                 # driver: runs the workers under mpiexec, writes
                                                            # docs/benchmarks/exchange.{json,png,md}
    .venv/bin/python benchmarks/exchange.py --sizes 2 4 --reps 100 --no-progress

It also measures passive-target progress (see PROGRESS_CONFIGS): how long rank 0's RmaExchange.exchange takes
while rank 1 sleeps outside MPI, per window backend and MPICH setting.

The driver launches `mpiexec -n N python benchmarks/exchange.py --worker` for every N (mpiexec next to
sys.executable). In a worker, all techniques are timed in the same run, interleaved rep by rep (so background load
hits them alike): before each timed call a barrier, then the call; the time of a rep is the slowest rank's; the
figure is the median over reps.

What is timed:
  ring-whole         Ring("whole") with the watchdog (timeout_s=300, as in training): Testall + back-off sleep
  ring-chunked       Ring("chunked"), same waits
  ring-whole-waitall Ring("whole") with timeout_s=None: MPI's own busy-polling Waitall (no watchdog)
  rma                RmaExchange.exchange (publish + combine; never waits, so this is its local cost)
  allreduce          comm.Allreduce(IN_PLACE, buf, SUM) + divide (the synchronous baseline)
  iallreduce-watchdog  Iallreduce + the watchdog's wait + divide (what mode "allreduce" runs in training)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N_FLOATS = 51206
TECHNIQUES = ("ring-whole", "ring-chunked", "ring-whole-waitall", "rma", "allreduce", "iallreduce-watchdog")


def cpu_name() -> str:
    from sagips.perf import cpu_name as name  # torch is imported only here

    return name()


def worker(reps: int, out: str) -> None:
    sys.path.insert(0, str(REPO))
    import sagips.comm  # noqa: F401  (FIRST: the thread level, before MPI is initialised)

    # isort: split
    import numpy as np
    from mpi4py import MPI

    from sagips.comm import watchdog
    from sagips.comm.ring import Ring
    from sagips.comm.rma import RmaExchange

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    buf = np.random.default_rng(rank).standard_normal(N_FLOATS).astype(np.float32)
    work = buf.copy()
    whole = Ring(comm, N_FLOATS, "whole", timeout_s=300)
    chunked = Ring(comm, N_FLOATS, "chunked", timeout_s=300, tag=101)
    whole_waitall = Ring(comm, N_FLOATS, "whole", timeout_s=None, tag=102)
    rma = RmaExchange(comm, N_FLOATS, max_staleness=10, timeout_s=300)
    epoch = [0]

    def run_allreduce(x):
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        x /= np.float32(size)

    def run_rma(x):
        epoch[0] += 1
        rma.exchange(x, epoch[0])

    def run_iallreduce(x):
        watchdog.allreduce_sum(comm, x, timeout_s=300, what="allreduce")
        x /= np.float32(size)

    ops = {"iallreduce-watchdog": run_iallreduce, "ring-whole": lambda x: whole.allreduce(x), "ring-chunked": lambda x: chunked.allreduce(x),
           "ring-whole-waitall": lambda x: whole_waitall.allreduce(x), "rma": run_rma, "allreduce": run_allreduce}
    warmup = 10
    times = {name: np.zeros(reps) for name in TECHNIQUES}
    for rep in range(warmup + reps):
        for name in TECHNIQUES:
            work[:] = buf
            comm.Barrier()
            t0 = time.perf_counter()
            ops[name](work)
            dt = time.perf_counter() - t0
            if rep >= warmup:
                times[name][rep - warmup] = dt
    rma.free()
    result = {}
    for name in TECHNIQUES:
        slowest = np.empty_like(times[name])
        comm.Allreduce(times[name], slowest, op=MPI.MAX)  # a rep lasts until its slowest rank is done
        result[name] = {"median_ms": float(np.median(slowest) * 1e3),
                        "p10_ms": float(np.percentile(slowest, 10) * 1e3),
                        "p90_ms": float(np.percentile(slowest, 90) * 1e3)}
    if rank == 0:
        Path(out).write_text(json.dumps({"n_ranks": size, "reps": reps, "techniques": result}, indent=1))


# Passive-target progress: does a rank that publishes (Put + Flush) wait for a peer that is busy outside MPI?
# The sleeper stands for a rank deep in its pipeline; "NOLOCAL + ofi" makes MPICH move the bytes through its
# network module (software RMA over tcp), as between two nodes without RDMA.
PROGRESS_SLEEP_S = 1.0
PROGRESS_CONFIGS = [
    ("one node, backend auto (-> shared)", "auto", {}),
    ("one node, backend allocate", "allocate", {}),
    ("netmod (NOLOCAL=1, ofi/tcp), backend auto (-> allocate)", "auto",
     {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi"}),
    ("netmod (NOLOCAL=1, ofi/tcp) + MPICH_ASYNC_PROGRESS=1", "auto",
     {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "MPICH_ASYNC_PROGRESS": "1"}),
]


def progress_worker(backend: str, out: str) -> None:
    sys.path.insert(0, str(REPO))
    import sagips.comm  # noqa: F401  (FIRST: the thread level)

    # isort: split
    import numpy as np
    from mpi4py import MPI

    from sagips.comm.rma import RmaExchange

    comm = MPI.COMM_WORLD
    x = np.ones(N_FLOATS, np.float32)
    with RmaExchange(comm, N_FLOATS, max_staleness=10, backend=backend) as ex:
        ex.barrier()
        if comm.Get_rank() == 1:
            time.sleep(PROGRESS_SLEEP_S)  # busy outside MPI
        else:
            t0 = time.perf_counter()
            ex.exchange(x, 1)
            dt = time.perf_counter() - t0
            Path(out).write_text(json.dumps({"backend": ex.backend, "exchange_ms": dt * 1e3,
                                             "thread_level": MPI.Query_thread()}))
        ex.barrier()


def progress_driver(outdir: Path) -> list[dict]:
    rows = []
    for label, backend, env in PROGRESS_CONFIGS:
        tmp = outdir / ".progress.json"
        cmd = ["timeout", "120", mpiexec(), "-n", "2", sys.executable, __file__, "--progress-worker", backend,
               "--out", str(tmp)]
        subprocess.run(cmd, check=True, env={**os.environ, **env})
        rows.append({"config": label, "env": env, **json.loads(tmp.read_text())})
        tmp.unlink()
        print(f"  progress: {label}: {rows[-1]['exchange_ms']:.1f} ms", flush=True)
    return rows


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def driver(sizes: list[int], reps: int, outdir: Path, env_extra: dict, progress: bool = True) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    load_before = list(os.getloadavg())
    runs = []
    for n in sizes:
        tmp = outdir / f".exchange-{n}.json"
        # Oversubscribed runs are slow (MPI_Allreduce takes ~1 s per call at N=8 on 2 cores): fewer reps there.
        n_reps = reps if n <= (os.cpu_count() or 1) else max(20, reps // 4)
        cmd = ["timeout", "600", mpiexec(), "-n", str(n), sys.executable, __file__, "--worker", "--reps", str(n_reps),
               "--out", str(tmp)]
        print("+", " ".join(cmd), flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True, env={**os.environ, **env_extra})
        runs.append(json.loads(tmp.read_text()))
        tmp.unlink()
        print(f"  N={n}: {time.time() - t0:.0f} s", flush=True)
    import mpi4py
    import numpy
    from mpi4py import MPI

    meta = {"n_floats": N_FLOATS, "bytes": 4 * N_FLOATS, "cores": os.cpu_count(), "machine": platform.machine(),
            "cpu": cpu_name(), "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "mpi4py": mpi4py.__version__, "numpy": numpy.__version__, "python": platform.python_version(),
            "env": env_extra, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
            "oversubscribed": [r["n_ranks"] for r in runs if r["n_ranks"] > (os.cpu_count() or 1)]}
    data = {"meta": meta, "runs": runs, "rma_progress": progress_driver(outdir) if progress else []}
    (outdir / "exchange.json").write_text(json.dumps(data, indent=1))
    plot(data, outdir / "exchange.png")
    (outdir / "exchange.md").write_text(table(data))
    print(table(data))


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ns = [r["n_ranks"] for r in data["runs"]]
    for name in TECHNIQUES:
        med = [r["techniques"][name]["median_ms"] for r in data["runs"]]
        lo = [r["techniques"][name]["p10_ms"] for r in data["runs"]]
        hi = [r["techniques"][name]["p90_ms"] for r in data["runs"]]
        ax.errorbar(ns, med, yerr=[[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]],
                    marker="o", capsize=3, label=name)
    ax.set_xlabel(f"ranks N (cores: {data['meta']['cores']}; N > cores is oversubscribed)")
    ax.set_ylabel("time per exchange [ms] (median, p10-p90)")
    ax.set_yscale("log")
    ax.set_xticks(ns)
    ax.set_title(f"exchange of {data['meta']['n_floats']:,} float32 ({data['meta']['bytes'] / 1024:.0f} KiB)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(data: dict) -> str:
    m = data["meta"]
    load = "{} / {}".format(*(", ".join(f"{x:.1f}" for x in m.get(k, [])) for k in ("loadavg_before", "loadavg_after")))
    lines = [f"# Exchange benchmark ({m['n_floats']:,} float32 = {m['bytes'] / 1024:.0f} KiB per rank)", "",
             f"{m['cpu']}, {m['cores']} cores; {m['mpi']}; mpi4py {m['mpi4py']}; {m['date']}.",
             (f"Oversubscribed (more ranks than cores): N = {m['oversubscribed']}." if m["oversubscribed"] else ""),
             ("Median time per exchange in ms (the slowest rank of each rep), p10-p90 in brackets. "
              "`rma` never waits: it is the local cost of publish + combine."), "",
             f"Load average (1, 5, 15 min) before / after the run, other jobs shared the machine: {load}.", "",
             "| N | reps | " + " | ".join(TECHNIQUES) + " |", "|---|---|" + "---|" * len(TECHNIQUES)]
    for r in data["runs"]:
        t = r["techniques"]
        cells = [f"{t[k]['median_ms']:.3f} [{t[k]['p10_ms']:.2f}-{t[k]['p90_ms']:.2f}]" for k in TECHNIQUES]
        lines.append(f"| {r['n_ranks']} | {r['reps']} | " + " | ".join(cells) + " |")
    # Ratios by median, and by p10 (the undisturbed cost, less sensitive to other jobs on a shared machine).
    pairs = [("ring-whole", "allreduce"), ("ring-chunked", "allreduce"), ("ring-whole", "iallreduce-watchdog"),
             ("ring-chunked", "iallreduce-watchdog")]
    lines += ["", "Ratios, median (p10):", "", "| N | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |",
              "|---|" + "---|" * len(pairs)]
    for r in data["runs"]:
        t = r["techniques"]
        cells = [f"{t[a]['median_ms'] / t[b]['median_ms']:.2f} ({t[a]['p10_ms'] / t[b]['p10_ms']:.2f})" for a, b in pairs]
        lines.append(f"| {r['n_ranks']} | " + " | ".join(cells) + " |")
    if data.get("rma_progress"):
        lines += ["", f"## RMA progress: rank 0 exchanges while rank 1 sleeps {PROGRESS_SLEEP_S:g} s outside MPI", "",
                  "| configuration | backend | rank 0 exchange [ms] |", "|---|---|---|"]
        lines += [f"| {r['config']} | {r['backend']} | {r['exchange_ms']:.1f} |" for r in data["rma_progress"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="(internal) run one measurement under mpiexec")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--reps", type=int, default=200, help="timed reps per technique (a quarter when oversubscribed)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    ap.add_argument("--progress-worker", metavar="BACKEND", help="(internal) the RMA progress measurement")
    ap.add_argument("--no-progress", action="store_true", help="skip the RMA progress measurement")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the workers (e.g. MPIR_CVAR_...)")
    args = ap.parse_args()
    if args.worker:
        worker(args.reps, args.out)
    elif args.progress_worker:
        progress_worker(args.progress_worker, args.out)
    else:
        driver(args.sizes, args.reps, Path(args.out), dict(kv.split("=", 1) for kv in args.env),
               progress=not args.no_progress)


if __name__ == "__main__":
    main()
