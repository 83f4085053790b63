"""An exception on one rank ends the job within seconds, in every mode, at N = 4 and N = 8 (issue 21, defect 1).

    python benchmarks/error_teardown.py [--ranks 4,8] [--modes ...] [--out docs/benchmarks]

Each run: `mpiexec -n N python -m sagips.run --mode M` on a tiny proxy1d problem (groups of 2 for the grouped modes),
the fault drill raising on the last rank at epoch 3 (`pipeline.fail_epoch=3`, `pipeline.fail_ranks=[N-1]`), the
watchdog far away (`comm.timeout_s=600`: only the abort can end the job in time). Recorded, with the parent's clock
on every stderr line as it arrives:
- failure_to_exit_s: from the failed rank's `sagips: rank R failed` line to mpiexec's exit (target: < 30 s);
- launch_to_exit_s: the whole job, start-up included;
- named: the line names the failed rank and the exception (FaultDrill).
Writes error_teardown.json and error_teardown.md into --out. Every mpiexec runs under a 120 s timeout.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sagips.config import MODES  # noqa: E402
from tests._mpirun import child_env, mpiexec  # noqa: E402

RUN = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", "100000",
       "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
       "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
       "--set", "train.state_every=2", "--set", "train.checkpoint_every=50", "--set", "comm.timeout_s=600",
       "--set", "pipeline.fail_epoch=3"]
TIMEOUT_S = 120


def cpu_line() -> str:
    """'<model name>, N cores, torch dispatches <capability>' (the CPU named beside every figure)."""
    import re

    from sagips.precision import cpu_capability

    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = m.group(1).strip() if m else platform.processor()
    except OSError:
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores, torch dispatches {cpu_capability()}"


def one(n: int, mode: str, out: Path) -> dict:
    cmd = ["timeout", "--kill-after=10", str(TIMEOUT_S), mpiexec(), "-n", str(n), sys.executable, *RUN,
           "--mode", mode, "--output-dir", str(out), "--overwrite", "--set", "comm.inner_size=2",
           "--set", f"pipeline.fail_ranks=[{n - 1}]"]
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env=child_env({"OMP_NUM_THREADS": "1"}), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read():
        for line in p.stderr:
            lines.append((time.time(), line))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    rc = p.wait()
    t_exit = time.time()
    t.join(timeout=5)
    failed = [(ts, s) for ts, s in lines if f"sagips: rank {n - 1} failed" in s]
    text = "".join(s for _, s in lines)
    return {"ranks": n, "mode": mode, "exit": rc, "launch_to_exit_s": round(t_exit - t0, 2),
            "failure_to_exit_s": round(t_exit - failed[0][0], 2) if failed else None,
            "named": bool(failed) and "FaultDrill" in text, "timed_out": rc in (124, 137)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    ap.add_argument("--workdir", default="/tmp/sagips_error_teardown")
    a = ap.parse_args(argv)
    rows = []
    for n in [int(x) for x in a.ranks.split(",")]:
        for mode in a.modes.split(","):
            r = one(n, mode, Path(a.workdir) / f"n{n}_{mode}")
            print(json.dumps(r), flush=True)
            rows.append(r)
    out = Path(a.out)
    info = {"command": "python benchmarks/error_teardown.py " + " ".join(argv or sys.argv[1:]),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": cpu_line(),
            "load_average": list(os.getloadavg()), "rows": rows}
    (out / "error_teardown.json").write_text(json.dumps(info, indent=1) + "\n")
    return 0 if write_page(info, out) else 1


def write_page(info: dict, out: Path) -> bool:
    rows = info["rows"]
    md = ["# An exception on one rank: how fast the job ends (issue 21, defect 1)", "",
          f"Written by `benchmarks/error_teardown.py` ({info['date']}; {info['machine']}; load average at the end "
          f"{' '.join(f'{x:.1f}' for x in info['load_average'])}). The last rank raises the fault drill at epoch 3; "
          "the watchdog is set to 600 s, so only the abort can end the job. Target: the job ends within 30 s of the "
          "failure, and the failed rank is named with its exception.", "",
          "| ranks | mode | failure -> exit [s] | launch -> exit [s] | rank and exception named | exit status |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['ranks']} | {r['mode']} | {r['failure_to_exit_s']} | {r['launch_to_exit_s']} | "
                  f"{'yes' if r['named'] else 'NO'} | {r['exit']} |")
    ok = all(r["named"] and r["failure_to_exit_s"] is not None and r["failure_to_exit_s"] < 30 for r in rows)
    md += ["", f"All within 30 s and named: **{'yes' if ok else 'no'}**.", ""]
    (out / "error_teardown.md").write_text("\n".join(md))
    return ok


if __name__ == "__main__":
    sys.exit(main())
