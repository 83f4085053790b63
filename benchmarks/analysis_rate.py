"""Analysis rate (eq. 9) of every exchange mode at N = 1, 2, 4 (8) ranks, beside torch DDP (gloo) and MPI Allreduce.

    python benchmarks/analysis_rate.py                 # N = 1 2 4, 3 interleaved repeats  -> docs/benchmarks/
    python benchmarks/analysis_rate.py --quick         # N = 1 2, one repeat (a smoke run, ~2 min)
    python benchmarks/analysis_rate.py --ranks 1 2 4 8 # 8 is oversubscribed on a 2-core machine and flagged so
    python benchmarks/analysis_rate.py --sweep 4 16 64 256 --repeats 3   # N = 2 only: the ratio to DDP against the
                                                       # batch (parameter sets x 100 events per epoch)

Every point is one `python -m sagips.run` (or `python -m sagips.ddp`) under `mpiexec -n N`, with the same preset,
networks, batch and pipeline (configs/proxy1d-quick.yaml; `--paper-batch` for the paper's 1024 x 100 events), one
torch thread per rank, and all ranks on one host: the grouped modes then have ONE inner group (comm.inner_size=0, the
ranks of one node), as on one Polaris node of 4 GPUs. Eq. 9 is R = N * N_disc * N_epochs / T with T the slowest
rank's training seconds (run.json `train_seconds`; start-up and data are excluded, as in the paper). The per-epoch
time is T / N_epochs. Runs of the different modes are interleaved (repeat r of every mode before repeat r+1 of any),
and the median over repeats is reported, because the machine is shared.

Target (issue #6): the per-epoch time of `arar-arar` and `rma-arar-arar` <= 0.8 x that of DDP-gloo at N = 2.
The ratio depends on how much of an epoch the exchange is, so `--sweep` measures it at N = 2 against the batch
(analysis_rate_sweep.{json,png,md}): the same peers, the same preset, only `environment.param_samples` changes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from sagips.perf import cpu_name  # noqa: E402

OUT = REPO / "docs" / "benchmarks"
PEERS = ["ensemble", "allreduce", "arar", "arar-arar", "rma-arar-arar", "ddp-gloo"]
SWEEP_PEERS = ["ensemble", "arar", "arar-arar", "rma-arar-arar", "ddp-gloo"]
TARGET = 0.8


def mpiexec() -> str:
    exe = Path(sys.executable).with_name("mpiexec")
    return str(exe) if exe.exists() else (shutil.which("mpiexec") or "mpiexec")


def one_run(work: Path, peer: str, n: int, epochs: int, sets: list[str], timeout: int) -> dict:
    out = work / f"{peer}-n{n}-{time.monotonic_ns()}"
    module = "sagips.ddp" if peer.startswith("ddp") else "sagips.run"
    cmd = [sys.executable, "-m", module, "--config", "configs/proxy1d-quick.yaml", "--epochs", str(epochs),
           "--output-dir", str(out), "--no-progress", "--set", "train.threads=1", "--set", "comm.inner_size=0",
           "--set", "train.checkpoint_every=1000000", "--set", "train.state_every=1000000",
           "--set", f"train.log_every={epochs}", "--set", "environment.reference_events=200000",
           "--set", "ensemble.analyze=false"]  # (timed runs: no p^ +- sigma at their end)
    if not peer.startswith("ddp"):
        cmd += ["--mode", peer]
    for s in sets:
        cmd += ["--set", s]
    cmd = ["timeout", str(timeout), mpiexec(), "-n", str(n), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{peer} N={n} failed ({r.returncode}): {r.stderr[-1500:]}")
    info = json.loads((out / "run.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    t = max(info["train_seconds"])
    return {"peer": peer, "n": n, "epochs": info["epochs"], "events_per_epoch": info["events_per_epoch"],
            "train_s": t, "epoch_s": t / info["epochs"],
            "rate": n * info["events_per_epoch"] * info["epochs"] / t, "mode_in_run_json": info["mode"]}


def summarize(records: list[dict], cores: int) -> list[dict]:
    rows = []
    for n in sorted({r["n"] for r in records}):
        for peer in PEERS:
            rs = [r for r in records if r["n"] == n and r["peer"] == peer]
            if not rs:
                continue
            ep = statistics.median(r["epoch_s"] for r in rs)
            rate = statistics.median(r["rate"] for r in rs)
            rows.append({"n": n, "peer": peer, "repeats": len(rs), "epoch_s": ep, "rate": rate,
                         "epoch_s_all": [r["epoch_s"] for r in rs], "oversubscribed": n > cores})
    for row in rows:
        ddp = next((r for r in rows if r["n"] == row["n"] and r["peer"] == "ddp-gloo"), None)
        one = next((r for r in rows if r["n"] == 1 and r["peer"] == row["peer"]), None)
        ens = next((r for r in rows if r["n"] == row["n"] and r["peer"] == "ensemble"), None)
        row["epoch_vs_ddp"] = row["epoch_s"] / ddp["epoch_s"] if ddp else None
        # what the exchange adds to an epoch: the time over the ensemble's (same compute, no exchange)
        row["exchange_s"] = row["epoch_s"] - ens["epoch_s"] if ens else None
        row["speedup_vs_1"] = row["rate"] / one["rate"] if one else None
    return rows


def _two_panels(rows: list[dict], x: str, left, peers: list[str]):
    """A figure of two panels, one line per peer: left(row) on the left, the epoch time [ms] on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for peer in peers:
        pts = [r for r in rows if r["peer"] == peer]
        if pts:
            style = "k--" if peer == "ddp-gloo" else "-"
            a1.plot([r[x] for r in pts], [left(r) for r in pts], style, marker="o", label=peer)
            a2.plot([r[x] for r in pts], [r["epoch_s"] * 1e3 for r in pts], style, marker="o", label=peer)
    return plt, fig, a1, a2


def _noise(rows: list[dict]) -> str:
    spreads = [(max(r["epoch_s_all"]) - min(r["epoch_s_all"])) / r["epoch_s"] for r in rows if len(r["epoch_s_all"]) > 1]
    if not spreads:
        return "One repeat only: the noise of a configuration is not measured. "
    return (f"The repeats of one configuration differ by {100 * statistics.median(spreads):.0f}% of its epoch time "
            f"(median over the rows; up to {100 * max(spreads):.0f}%): differences below that are noise. ")


def figure(rows: list[dict], path: Path) -> None:
    plt, fig, a1, a2 = _two_panels(rows, "n", lambda r: r["rate"], PEERS)
    ns = sorted({r["n"] for r in rows})
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) + ("*" if any(r["oversubscribed"] for r in rows if r["n"] == n) else "")
                           for n in ns])
        ax.set_xlabel("N (ranks; * = more ranks than cores)")
        ax.grid(alpha=0.3)
    a1.set_ylabel("analysis rate, eq. 9 [events/s]")
    a2.set_ylabel("time per epoch [ms] (slowest rank)")
    a1.legend(fontsize=8)
    a1.set_title("eq. 9: N * N_disc * N_epochs / T", fontsize=9)
    a2.set_title("per-epoch time (median over repeats)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(rows: list[dict], meta: dict, path: Path) -> None:
    lines = ["| N | peer | epoch [ms] | vs DDP-gloo | rate [events/s] | rate vs N=1 | repeats (epoch ms) |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        flag = " (oversubscribed)" if r["oversubscribed"] else ""
        vs_ddp = "" if r["epoch_vs_ddp"] is None else f"{r['epoch_vs_ddp']:.2f}"
        vs_1 = "" if r["speedup_vs_1"] is None else f"{r['speedup_vs_1']:.2f}"
        lines.append(f"| {r['n']}{flag} | {r['peer']} | {r['epoch_s'] * 1e3:.2f} | {vs_ddp} | {r['rate']:,.0f} | {vs_1} | "
                     f"{', '.join(f'{x * 1e3:.1f}' for x in r['epoch_s_all'])} |")
    n2 = {r["peer"]: r for r in rows if r["n"] == 2}
    verdict = []
    for peer in ("arar-arar", "rma-arar-arar"):
        if peer in n2 and n2[peer]["epoch_vs_ddp"] is not None:
            ratio = n2[peer]["epoch_vs_ddp"]
            verdict.append(f"- N = 2, `{peer}`: {ratio:.2f} x DDP-gloo's per-epoch time "
                           f"({'meets' if ratio <= TARGET else 'misses'} the <= {TARGET} target).")
    over = ["| N | peer | exchange cost per epoch [ms] (epoch − ensemble's) | vs DDP-gloo's |", "|---:|---|---:|---:|"]
    for r in rows:
        ddp = next((d for d in rows if d["n"] == r["n"] and d["peer"] == "ddp-gloo"), None)
        if r["n"] > 1 and r["peer"] != "ensemble" and r["exchange_s"] is not None:
            rel = f"{r['exchange_s'] / ddp['exchange_s']:.2f}" if ddp and ddp["exchange_s"] and ddp["exchange_s"] > 0 \
                else ""
            over.append(f"| {r['n']} | {r['peer']} | {r['exchange_s'] * 1e3:.1f} | {rel} |")
    noise = _noise(rows)
    if "ensemble" in n2 and n2["ensemble"]["epoch_vs_ddp"] is not None:
        verdict.append(f"- The floor: `ensemble` (the same compute, no exchange at all) runs at "
                       f"{n2['ensemble']['epoch_vs_ddp']:.2f} x DDP-gloo's per-epoch time at N = 2; no exchange "
                       f"scheme can do better than that here.")
    path.write_text(f"""# Analysis rate (eq. 9): SAGIPS modes beside torch DDP (gloo) and MPI Allreduce

Command: `{meta['command']}`

Machine: {meta['machine']}; run {meta['date']}; load average before/after {meta['load_before']} / {meta['load_after']}.
Preset: configs/proxy1d-quick.yaml ({meta['events_per_epoch']:,} events per epoch, the paper's networks),
{meta['epochs']} epochs per run, one torch thread per rank, all ranks on one host (one inner group, as on one node).
Each peer trains the same pipeline: `python -m sagips.run --mode M`, or `python -m sagips.ddp` (the generator in
`DistributedDataParallel`, gloo; every generator gradient, weights and biases, averaged synchronously and overlapped
with the backward pass; see sagips/ddp.py and tests/test_ddp_peer.py, which checks that DDP and the `allreduce` mode
give bit-identical generators when both exchange the same gradients). `allreduce` is the Horovod-like synchronous
baseline with MPI's own Allreduce. T = the slowest rank's training seconds (start-up excluded); the medians over
{meta['repeats']} interleaved repeat(s) are shown.

{chr(10).join(lines)}

![analysis rate]({meta['figure']})

## Target: per-epoch time of the grouped modes <= {TARGET} x DDP-gloo at N = 2

{chr(10).join(verdict) or '- N = 2 was not measured.'}

{chr(10).join(over)}

How to read it: with all ranks on one host, `arar-arar` and `rma-arar-arar` have one inner group, so at N = 2 and 4
their inner step is the ring (or the RMA exchange) over all ranks, and their outer ring never runs. What separates
them from DDP here is the cost of one gradient exchange per epoch: MPICH moves the 50,688 weight gradients through
shared memory in one nonblocking ring (or, for RMA, one put into a shared window that nobody waits for), while gloo
allreduces 51,206 gradients over TCP loopback in buckets, from its own threads that compete with the compute for the
same cores. The compute per epoch is the same for every peer, so the ratio shrinks toward 1 as the batch grows
(`--paper-batch`). Rates at N > cores are oversubscribed and say little about a real node.

The table above isolates the exchange: each peer's epoch minus the ensemble's (same compute, no exchange) at the
same N. {noise}When the compute dominates the epoch, as here, the per-epoch ratio to DDP cannot fall below the
ensemble's, whatever the exchange costs. Where the exchange is a larger part of the epoch (smaller batches), see
[analysis_rate_sweep.md](analysis_rate_sweep.md): the same comparison at N = 2 against the batch
(`--sweep P ...`).
""")


# ------------------------------------------------------------------------------------------------ batch sweep
def sweep_rows(records: list[dict]) -> list[dict]:
    """Median epoch per (events per epoch, peer) at N = 2, its ratio to DDP-gloo's and its excess over the
    ensemble's (the exchange's cost)."""
    rows = []
    for ev in sorted({r["events_per_epoch"] for r in records}):
        med = {}
        for peer in SWEEP_PEERS:
            rs = [r["epoch_s"] for r in records if r["events_per_epoch"] == ev and r["peer"] == peer]
            if rs:
                med[peer] = (statistics.median(rs), rs)
        for peer, (ep, rs) in med.items():
            ddp, ens = med.get("ddp-gloo", (None,))[0], med.get("ensemble", (None,))[0]
            rows.append({"events_per_epoch": ev, "peer": peer, "epoch_s": ep, "epoch_s_all": rs,
                         "epoch_vs_ddp": ep / ddp if ddp else None,
                         "exchange_s": ep - ens if ens is not None else None})
    return rows


def sweep_figure(rows: list[dict], path: Path) -> None:
    plt, fig, a1, a2 = _two_panels(rows, "events_per_epoch", lambda r: r["epoch_vs_ddp"], SWEEP_PEERS)
    a1.axhline(TARGET, color="r", lw=1, ls=":", label=f"target {TARGET}")
    a1.set_ylabel("per-epoch time / DDP-gloo's (N = 2)")
    a2.set_ylabel("time per epoch [ms] (slowest rank, N = 2)")
    a2.set_yscale("log")
    for ax in (a1, a2):
        ax.set_xscale("log")
        ax.set_xlabel("events per epoch (parameter sets x 100)")
        ax.grid(alpha=0.3)
    a1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep_report(rows: list[dict], meta: dict, path: Path) -> None:
    lines = ["| events / epoch | peer | epoch [ms] | vs DDP-gloo | exchange cost [ms] (− ensemble's) | repeats (ms) |",
             "|---:|---|---:|---:|---:|---|"]
    for r in rows:
        vs = "" if r["epoch_vs_ddp"] is None else f"{r['epoch_vs_ddp']:.2f}"
        ex = "" if r["exchange_s"] is None or r["peer"] == "ensemble" else f"{r['exchange_s'] * 1e3:.2f}"
        lines.append(f"| {r['events_per_epoch']:,} | {r['peer']} | {r['epoch_s'] * 1e3:.2f} | {vs} | {ex} | "
                     f"{', '.join(f'{x * 1e3:.1f}' for x in r['epoch_s_all'])} |")
    verdict = []
    for peer in ("arar-arar", "rma-arar-arar"):
        met = [r["events_per_epoch"] for r in rows if r["peer"] == peer and r["epoch_vs_ddp"] is not None
               and r["epoch_vs_ddp"] <= TARGET]
        verdict.append(f"- `{peer}`: <= {TARGET} x DDP-gloo at "
                       + (", ".join(f"{e:,}" for e in met) + " events per epoch" if met else "no batch measured"))
    floors = [r for r in rows if r["peer"] == "ensemble" and r["epoch_vs_ddp"] is not None]
    closed = [f"{r['events_per_epoch']:,} ({r['epoch_vs_ddp']:.2f})" for r in floors if r["epoch_vs_ddp"] > TARGET]
    if closed:
        verdict.append(f"- Out of reach of any exchange scheme at {', '.join(closed)} events per epoch: there even "
                       f"`ensemble` (the same compute, no exchange) is above {TARGET} x DDP-gloo (its ratio in "
                       f"brackets), because DDP's exchange costs less than {100 * (1 - TARGET):.0f}% of the epoch.")
    verdict.append(f"- {_noise(rows)}With one inner group, `arar-arar` is `arar` plus one broadcast every "
                   f"`comm.outer_every` epochs, so the differences between those two rows are this noise.")
    path.write_text(f"""# Analysis rate at N = 2 against the batch: SAGIPS modes beside torch DDP (gloo)

Command: `{meta['command']}`

Machine: {meta['machine']}; run {meta['date']}; load average before/after {meta['load_before']} /
{meta['load_after']}. Preset: configs/proxy1d-quick.yaml with `environment.param_samples` = P (P x 100 events per
epoch), {meta['epochs']} epochs per run, 2 ranks on one host, one torch thread each; {meta['repeats']} interleaved
repeat(s), medians shown. Everything else as in [analysis_rate.md](analysis_rate.md).

{chr(10).join(lines)}

![ratio to DDP against the batch]({meta['figure']})

Where the per-epoch target (<= {TARGET} x DDP-gloo at N = 2) holds:

{chr(10).join(verdict)}
""")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _meta(stem: str, args, load_before: list[float], **extra) -> dict:
    """What every page states about its run: command, machine, date, load, epochs, repeats."""
    return {"command": "python " + " ".join([os.path.relpath(__file__, REPO), *sys.argv[1:]]),
            "machine": f"{_cores()} cores, {cpu_name()}, CPU only", "figure": f"{stem}.png",
            "date": time.strftime("%Y-%m-%d %H:%M"), "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()], "epochs": args.epochs, "repeats": args.repeats,
            **extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--peers", nargs="+", default=PEERS, choices=PEERS)
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paper-batch", action="store_true", help="1024 x 100 events per epoch (the paper's)")
    ap.add_argument("--quick", action="store_true", help="N = 1 2, 150 epochs, one repeat")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report", type=Path, metavar="JSON", help="only rewrite the .md and .png from a saved .json")
    ap.add_argument("--sweep", type=int, nargs="+", metavar="P",
                    help="instead of the N table: N = 2, parameter sets per epoch P (x 100 events) for each P")
    args = ap.parse_args()
    if args.sweep:
        return run_sweep(args)
    if args.report:
        saved = json.loads(args.report.read_text())
        if saved["meta"].get("sweep"):
            rows, stem = sweep_rows(saved["records"]), args.report.with_suffix("")
            sweep_figure(rows, stem.with_suffix(".png"))
            sweep_report(rows, saved["meta"], stem.with_suffix(".md"))
            print(f"wrote {stem}.{{png,md}}")
            return 0
        cores = _cores()
        rows, meta = summarize(saved["records"], cores), saved["meta"]
        stem = args.report.with_suffix("")
        figure(rows, stem.with_suffix(".png"))
        report(rows, meta, stem.with_suffix(".md"))
        print(f"wrote {stem}.{{png,md}}")
        return 0
    if args.quick:
        args.ranks, args.epochs, args.repeats = [1, 2], 150, 1
    sets = ["environment.param_samples=1024", "environment.events_per_sample=100"] if args.paper_batch else []
    cores = _cores()
    load_before = [round(x, 2) for x in os.getloadavg()]
    records = []
    with tempfile.TemporaryDirectory(prefix="sagips-rate-") as tmp:
        for rep in range(args.repeats):
            for n in args.ranks:
                for peer in args.peers:
                    rec = one_run(Path(tmp), peer, n, args.epochs, sets, args.timeout)
                    rec["repeat"] = rep
                    records.append(rec)
                    print(f"repeat {rep} N={n} {peer:14s} epoch {rec['epoch_s'] * 1e3:7.2f} ms  "
                          f"rate {rec['rate']:12,.0f} events/s", flush=True)
    rows = summarize(records, cores)
    stem = "analysis_rate_paper_batch" if args.paper_batch else "analysis_rate"
    meta = _meta(stem, args, load_before, events_per_epoch=records[0]["events_per_epoch"],
                 paper_batch=args.paper_batch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "records": records}, indent=1) + "\n")
    figure(rows, args.out / f"{stem}.png")
    report(rows, meta, args.out / f"{stem}.md")
    print(f"wrote {args.out / stem}.{{json,png,md}}")
    return 0


def run_sweep(args) -> int:
    load_before = [round(x, 2) for x in os.getloadavg()]
    records = []
    with tempfile.TemporaryDirectory(prefix="sagips-rate-") as tmp:
        for rep in range(args.repeats):
            for ps in args.sweep:
                for peer in SWEEP_PEERS:
                    rec = one_run(Path(tmp), peer, 2, args.epochs, [f"environment.param_samples={ps}"], args.timeout)
                    rec["repeat"] = rep
                    records.append(rec)
                    print(f"repeat {rep} P={ps:5d} {peer:14s} epoch {rec['epoch_s'] * 1e3:7.2f} ms", flush=True)
    stem = "analysis_rate_sweep"
    meta = _meta(stem, args, load_before, sweep=args.sweep)
    rows = sweep_rows(records)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "records": records}, indent=1) + "\n")
    sweep_figure(rows, args.out / f"{stem}.png")
    sweep_report(rows, meta, args.out / f"{stem}.md")
    print(f"wrote {args.out / stem}.{{json,png,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
