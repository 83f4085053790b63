"""Straggler study: does a slow rank hold up its neighbours? (paper IV-B3, the motivation of RMA mode)

    python benchmarks/straggler.py [--epochs 150] [--out docs/benchmarks]

4 ranks posing as 2 nodes x 2 (comm.inner_size=2). For arar-arar and rma-arar-arar, a run without delay gives each
rank's epoch time T0; then rank 1's pipeline is slowed by a sleep of T0 per epoch (its epoch takes ~2 T0) and the
epoch rate of every OTHER rank is reported relative to the run without delay. Rank 0 shares rank 1's inner group;
ranks 2 and 3 are the other group. The outer ring runs every --outer-every epochs (default: never inside the run,
so that the inner exchange is measured; pass e.g. 50 to see the outer step's synchronisation).

Writes straggler.json and straggler.md into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(mode: str, out: Path, epochs: int, outer_every: int, delay_s: float = 0.0) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", "4", sys.executable, "-m", "sagips.run",
           "--config", "configs/proxy1d-quick.yaml", "--mode", mode, "--epochs", str(epochs),
           "--output-dir", str(out), "--overwrite", "--no-progress",
           "--set", "comm.inner_size=2", "--set", f"comm.outer_every={outer_every}",
           "--set", "environment.reference_events=100000", "--set", "train.log_every=1000000",
           "--set", "train.checkpoint_every=1000000", "--set", "train.state_every=1000000",
           "--set", f"pipeline.delay_s={delay_s}", "--set", "pipeline.delay_ranks=[1]"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=3600, env=dict(os.environ, OMP_NUM_THREADS="1"),
                   stdout=subprocess.DEVNULL)
    info = json.loads((out / "run.json").read_text())
    per_epoch = [t / info["epochs"] for t in info["train_seconds"]]
    return {"mode": mode, "delay_s": delay_s, "epoch_s": per_epoch, "stats": info["exchange_stats"],
            "command": " ".join(cmd[3:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--outer-every", type=int, default=1000000)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.loop_closure import describe_machine, machine

    mach = machine()  # before the runs: an import error then costs nothing
    results = []
    for mode in ("arar-arar", "rma-arar-arar"):
        base = run(mode, ROOT / "runs" / f"straggler-{mode}-base", args.epochs, args.outer_every)
        t0 = base["epoch_s"][1]
        slow = run(mode, ROOT / "runs" / f"straggler-{mode}-slow", args.epochs, args.outer_every, delay_s=t0)
        rel = [b / s for b, s in zip(base["epoch_s"], slow["epoch_s"])]  # rate with delay / rate without
        results.append({"mode": mode, "base": base, "slow": slow, "relative_rate": rel,
                        "others_min_relative_rate": min(r for i, r in enumerate(rel) if i != 1)})
        print(f"{mode}: relative epoch rate per rank {['%.2f' % r for r in rel]} (rank 1 is slowed)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "straggler.json").write_text(json.dumps({"epochs": args.epochs, "outer_every": args.outer_every,
                                                    "machine": mach, "results": results}, indent=1))
    rows = "\n".join(
        f"| {r['mode']} | {r['base']['epoch_s'][1] * 1e3:.0f} | {r['slow']['epoch_s'][1] * 1e3:.0f} | "
        + " | ".join(f"{x:.2f}" for i, x in enumerate(r["relative_rate"]) if i != 1) + " |" for r in results)
    (out / "straggler.md").write_text(f"""# Straggler: rank 1's pipeline slowed to about twice the epoch time

Command: `python benchmarks/straggler.py --epochs {args.epochs}` (4 ranks as 2 groups of 2, {args.epochs} epochs of
the quick preset per run, outer ring every {args.outer_every} epochs). Epoch rate of each other rank with the delay,
relative to the same rank without it (1.00 = not slowed at all). Rank 0 shares rank 1's inner group.

Machine: {describe_machine(mach)}; load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}.

| mode | rank 1 epoch without delay [ms] | rank 1 epoch with delay [ms] | rank 0 | rank 2 | rank 3 |
|---|---|---|---|---|---|
{rows}

Target: rma-arar-arar keeps >= 90% of its rate on every other rank. Caveat: this machine has 2 cores for 4 ranks;
a sleeping rank frees CPU for the others, which can push relative rates above 1.
""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
