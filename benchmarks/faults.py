"""Fault injection: SIGKILL one random rank of a running 4-rank job, K times; is the run directory still usable?

Issue #7: no hang when a rank dies; atomic checkpoints; resume with nothing lost.

    python benchmarks/faults.py [--kills 20] [--resume-every 5] [--seed 0] [--out docs/benchmarks]

Each kill: start `mpiexec -n 4 python -m sagips.run --mode rma-arar-arar --set comm.inner_size=2 ...` (2 groups of
2, a state every 2 epochs so that kills often land during a write), wait until the first complete state exists
(state/latest.json), wait a further random time in [0, --max-delay] s, SIGKILL one random rank, then record
- teardown_s: kill -> mpiexec exit (hydra should tear the job down within seconds; --teardown-timeout caps it);
- orphans: processes of the job (its session) still alive 1 s after mpiexec exited (target: none);
- pid_maps_to_rank: whether the PID named in mpiexec's message maps to the killed rank through run.json "processes"
  (hydra names the lowest rank with a non-zero status after its cleanup, so mostly it does not), and, with hydra's
  -print-all-exitcodes, whether the killed rank is the only one with a non-zero exit code;
- unreadable: checkpoint and state files that `torch.load(weights_only=True)` cannot read (target: 0), plus
  leftover temporary files of interrupted atomic writes, an unreadable run.json / latest.json, torn metrics lines;
- resumable: whether a complete state exists for every rank (what --resume needs), and for every --resume-every-th
  kill whether `--resume` (a few more epochs) then completes.
Writes faults.json and faults.md into --out. Every mpiexec runs under `timeout`; run directories go to --workdir
and are removed unless --keep.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sagips.io.state import read_latest, resume_epoch, state_epochs  # noqa: E402

RANKS = 4
RUN = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--mode", "rma-arar-arar", "--no-progress",
       "--set", "comm.inner_size=2", "--set", "comm.timeout_s=30",
       "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
       "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
       "--set", "train.state_every=2", "--set", "train.checkpoint_every=5", "--set", "train.log_every=10"]


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def is_hydra() -> bool:
    try:
        return "HYDRA" in subprocess.run([mpiexec(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False


def proc_table() -> list[dict]:
    """Every process we can read: pid, session id, cmdline, PMI_RANK."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        if fields[0] == "Z":
            continue  # a zombie is dead; its parent just has not reaped it yet
        rank = next((int(e[9:]) for e in env if e.startswith(b"PMI_RANK=")), None)
        out.append({"pid": int(d.name), "ppid": int(fields[1]), "sid": int(fields[3]),
                    "cmd": cmd.replace(b"\0", b" ").decode(errors="replace"), "rank": rank})
    return out


def rank_pids(out_dir: Path) -> dict[int, int]:
    """{MPI rank: pid of its worker} of the sagips.run processes writing into out_dir.

    Each rank is the launched process (the supervisor, sagips.supervise) and its forked child, the worker.
    """
    procs = [p for p in proc_table() if p["rank"] is not None and "sagips.run" in p["cmd"] and str(out_dir) in p["cmd"]]
    launched = {p["pid"] for p in procs}
    return {p["rank"]: p["pid"] for p in procs if p["ppid"] in launched}


def check_files(out_dir: Path) -> dict:
    """Can every file of the run directory still be read?"""
    import torch

    bad, n_pt = [], 0
    for sub in ("checkpoints", "state"):
        for f in sorted((out_dir / sub).rglob("*.pt")):
            n_pt += 1
            try:
                obj = torch.load(f, map_location="cpu", weights_only=True)
                if not (isinstance(obj, dict) and "generator" in obj and "epoch" in obj):
                    raise ValueError("not a SAGIPS checkpoint/state (no generator/epoch)")
            except Exception as e:  # noqa: BLE001 - every failure counts
                bad.append(f"{f.relative_to(out_dir)}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    tmp = sorted(str(f.relative_to(out_dir)) for f in out_dir.rglob(".*.tmp"))
    json_bad = []
    for f in (out_dir / "run.json", out_dir / "state" / "latest.json"):
        if f.exists():
            try:
                json.loads(f.read_text())
            except (OSError, ValueError) as e:
                json_bad.append(f"{f.relative_to(out_dir)}: {e}")
    torn = 0
    metrics = out_dir / "metrics.jsonl"
    if metrics.exists():
        lines = metrics.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            try:
                json.loads(line)
            except ValueError:
                torn += 1
                if i != len(lines) - 1:
                    json_bad.append(f"metrics.jsonl line {i + 1} is torn and not the last line")
    return {"pt_files": n_pt, "unreadable": bad, "leftover_tmp": tmp, "json_unreadable": json_bad,
            "metrics_torn_lines": torn}


def one_kill(i: int, rng: random.Random, args, workdir: Path) -> dict:
    out = workdir / f"kill{i:03d}"
    shutil.rmtree(out, ignore_errors=True)
    # hydra's -print-all-exitcodes: every rank's exit code, to see whether the killed one stands out
    cmd = ["timeout", "--kill-after=10", str(args.run_timeout), mpiexec(),
           *(["-print-all-exitcodes"] if args.hydra else []), "-n", str(RANKS), sys.executable, *RUN,
           "--epochs", "1000000", "--output-dir", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rec: dict = {"kill": i}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        t0 = time.time()
        while read_latest(out) is None:
            if p.poll() is not None:
                raise RuntimeError(f"the run ended before the kill (exit {p.returncode}): {p.stderr.read()[-1500:]}")
            if time.time() - t0 > args.start_timeout:
                raise RuntimeError(f"no state within {args.start_timeout} s")
            time.sleep(0.05)
        rec["first_state_after_s"] = round(time.time() - t0, 2)
        delay = rng.uniform(0.0, args.max_delay)
        time.sleep(delay)
        pids = rank_pids(out)
        if sorted(pids) != list(range(RANKS)):
            raise RuntimeError(f"expected {RANKS} ranks, found {pids}")
        victim = rng.randrange(RANKS)
        latest_before = (read_latest(out) or {}).get("epoch")
        os.kill(pids[victim], signal.SIGKILL)
        t_kill = time.perf_counter()
        try:
            so, se = p.communicate(timeout=args.teardown_timeout)
            teardown, hung = time.perf_counter() - t_kill, False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, se = p.communicate(timeout=30)
            teardown, hung = None, True
        time.sleep(1.0)
        survivors = [q for q in proc_table() if q["sid"] == p.pid]
        rec.update(killed_rank=victim, killed_pid=pids[victim], delay_s=round(delay, 3), latest_at_kill=latest_before,
                   teardown_s=None if teardown is None else round(teardown, 3), hung=hung, mpiexec_exit=p.returncode,
                   orphans=[{"pid": q["pid"], "rank": q["rank"], "cmd": q["cmd"][:120]} for q in survivors])
        log = so + se
        info = json.loads((out / "run.json").read_text())
        pid_to_rank = {proc["pid"]: proc["rank"] for proc in info["processes"]}
        named = [int(m) for m in re.findall(r"PID (\d+)", log)]
        codes = [int(c) for m in re.findall(r"Exit codes: \[[^\]]*\] ([\d,]+)", log) for c in m.split(",")]
        by_sagips = [(int(r), int(q)) for r, q in re.findall(r"sagips: rank (\d+) \(pid (\d+) on ", log)]
        rec.update(sagips_named=by_sagips, sagips_named_the_victim=by_sagips == [(victim, pids[victim])],
                   named_pids=named, named_ranks=[pid_to_rank.get(n) for n in named],
                   pid_maps_to_rank=victim in [pid_to_rank.get(n) for n in named],
                   exit_codes=codes,  # by rank (one host); hydra's cleanup SIGKILLs the others: some show 9 too
                   identifiable_by_exit_codes=len(codes) == RANKS and [i for i, c in enumerate(codes) if c] == [victim],
                   mpiexec_message=[ln for ln in log.splitlines() if "PID" in ln or "EXIT CODE" in ln][:4])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for q in proc_table():  # never leave anything of this job behind
            if q["sid"] == p.pid:
                try:
                    os.kill(q["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
    rec["files"] = check_files(out)
    rec["state_epochs"] = {r: state_epochs(out, r) for r in range(RANKS)}
    start = resume_epoch(out, RANKS)
    rec["resume_epoch"] = start
    rec["resumable"] = start is not None
    if args.resume_every and i % args.resume_every == 0:
        rec["resume"] = resume(out, start, args)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return rec


def resume(out: Path, start: int | None, args) -> dict:
    """`--resume` for a few more epochs; completes = exit 0, run.json complete, every rank's final checkpoint loads."""
    from sagips.io.checkpoint import checkpoint_path, load_checkpoint

    target = (start or 0) + args.resume_epochs
    cmd = ["timeout", "--kill-after=10", str(args.run_timeout), mpiexec(), "-n", str(RANKS), sys.executable, "-m",
           "sagips.run", "--resume", "--output-dir", str(out), "--no-progress", "--epochs", str(target)]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       start_new_session=True)
    res = {"from_epoch": start, "to_epoch": target, "exit": r.returncode, "seconds": round(time.time() - t0, 1)}
    ok = r.returncode == 0
    if ok:
        info = json.loads((out / "run.json").read_text())
        ok = info.get("status") == "complete" and info.get("epochs") == target
        try:
            ok = ok and all(load_checkpoint(checkpoint_path(out, rk, target))["epoch"] == target
                            for rk in range(RANKS))
        except Exception as e:  # noqa: BLE001
            res["error"] = f"{type(e).__name__}: {e}"
            ok = False
    else:
        res["stderr_tail"] = r.stderr[-800:]
    res["completed"] = ok
    return res


def summarize(kills: list[dict]) -> dict:
    done = [k for k in kills if "teardown_s" in k]
    tear = [k["teardown_s"] for k in done if k["teardown_s"] is not None]
    resumed = [k["resume"] for k in done if "resume" in k]
    return {
        "kills": len(kills), "kills_completed": len(done), "errors": [k["error"] for k in kills if "error" in k],
        "teardown_s": {"median": round(statistics.median(tear), 2) if tear else None,
                       "max": round(max(tear), 2) if tear else None, "hung": sum(k["hung"] for k in done)},
        "runs_with_orphans": sum(bool(k["orphans"]) for k in done),
        "sagips_named_the_victim": sum(k["sagips_named_the_victim"] for k in done),
        "pid_maps_to_killed_rank": sum(k["pid_maps_to_rank"] for k in done),
        "identifiable_by_exit_codes": sum(k["identifiable_by_exit_codes"] for k in done),
        "pt_files_checked": sum(k["files"]["pt_files"] for k in done),
        "unreadable_pt_files": sum(len(k["files"]["unreadable"]) for k in done),
        "unreadable_json": sum(len(k["files"]["json_unreadable"]) for k in done),
        "leftover_tmp_files": sum(len(k["files"]["leftover_tmp"]) for k in done),
        "torn_metrics_lines": sum(k["files"]["metrics_torn_lines"] for k in done),
        "resumable": sum(k["resumable"] for k in done),
        "resumes": len(resumed), "resumes_completed": sum(r["completed"] for r in resumed),
    }


def write_report(out: Path, command: str, args, kills: list[dict], summary: dict, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "faults.json").write_text(json.dumps({"command": command, "args": vars(args), "meta": meta,
                                                 "summary": summary, "kills": kills}, indent=1) + "\n")
    s = summary
    n = s["kills_completed"]
    rows = []
    for k in kills:
        if "teardown_s" not in k:
            rows.append(f"| {k['kill']} | error: {k.get('error', '?')[:80]} | | | | | | | |")
            continue
        res = k.get("resume")
        rows.append(f"| {k['kill']} | {k['killed_rank']} | {k['latest_at_kill']} | "
                    f"{'HUNG' if k['hung'] else k['teardown_s']} | {len(k['orphans'])} | "
                    f"{'yes' if k['sagips_named_the_victim'] else 'NO'} | "
                    f"{'yes' if k['pid_maps_to_rank'] else 'no'} | {len(k['files']['unreadable'])} / "
                    f"{k['files']['pt_files']} | {k['resume_epoch']} | "
                    f"{'-' if res is None else ('completed' if res['completed'] else 'FAILED')} |")
    measures = [
        ("kills", f"{n} of {s['kills']}", ""),
        ("teardown (kill -> mpiexec exit), median / max", f"{s['teardown_s']['median']} s / {s['teardown_s']['max']} s",
         "seconds"),
        (f"jobs still running after {args.teardown_timeout} s (hung)", s["teardown_s"]["hung"], 0),
        ("runs with orphan processes 1 s after mpiexec exit", s["runs_with_orphans"], 0),
        ("the one `sagips: rank R (pid P ...) was killed by signal 9` line names the killed rank",
         f"{s['sagips_named_the_victim']} of {n}", "all"),
        ('the PID in mpiexec\'s own banner maps to the killed rank (run.json "processes")',
         f"{s['pid_maps_to_killed_rank']} of {n}", "see note"),
        ("only the killed rank has a non-zero exit code (hydra `-print-all-exitcodes`)",
         f"{s['identifiable_by_exit_codes']} of {n}", "see note"),
        ("unreadable checkpoint/state files (`torch.load(weights_only=True)`)",
         f"{s['unreadable_pt_files']} of {s['pt_files_checked']}", 0),
        ("unreadable run.json / latest.json, torn metrics lines not at the end", s["unreadable_json"], 0),
        ("torn lines in metrics.jsonl (every record is an atomic rewrite)", s["torn_metrics_lines"], 0),
        ("leftover temporary files of interrupted atomic writes", s["leftover_tmp_files"],
         "any (hidden `.*.tmp`; `--resume` removes them)"),
        ("a complete state exists for every rank (resumable)", f"{s['resumable']} of {n}", "all"),
        (f"`--resume` completed (kills 0, {args.resume_every}, {2 * args.resume_every}, ...)",
         f"{s['resumes_completed']} of {s['resumes']}", "all"),
    ]
    table = "| measure | result | target |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in measures)
    (out / "faults.md").write_text(f"""# Faults: SIGKILL one random rank of a running 4-rank job

Command: `{command}`

Machine: {meta['machine']}; {meta['mpiexec']}; run {meta['date']}.

Each kill: a fresh 4-rank run (`rma-arar-arar`, comm.inner_size=2:
2 groups of 2; a state every 2 epochs, a checkpoint every 5), then one random rank gets SIGKILL at a random instant
(0 to {args.max_delay} s) after the first complete state exists. See the docstring of `benchmarks/faults.py` and
docs/reliability.md.

{table}

Note: hydra's "BAD TERMINATION" banner names the lowest rank whose exit status is non-zero once its cleanup has
SIGKILLed the others, and the cleanup's victims often show status 9 as well; so neither the banner nor the exit codes
reliably name a rank that died of SIGKILL (e.g. the OOM killer). That is why each rank runs under a supervisor
(`sagips/supervise.py`): the launched process forks the worker, waits for it, and when the worker dies by a signal
prints the one line that names its rank, pid and host before the launcher's teardown. See docs/reliability.md.

| kill | rank | latest state at kill | teardown [s] | orphans | sagips names it | hydra PID -> rank \
| unreadable / .pt files | resume epoch | resume |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="how many runs to start and kill")
    ap.add_argument("--resume-every", type=int, default=5, help="resume after every N-th kill (kill 0, N, 2N, ...); "
                    "0 = never")
    ap.add_argument("--resume-epochs", type=int, default=6, help="epochs a resume runs past its resume epoch")
    ap.add_argument("--max-delay", type=float, default=3.0, help="kill at a random instant up to this many seconds "
                    "after the first complete state")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill schedule (rank and instant)")
    ap.add_argument("--teardown-timeout", type=float, default=60.0, help="a job still up this long after the kill "
                    "counts as hung")
    ap.add_argument("--start-timeout", type=float, default=240.0, help="seconds to wait for the first state")
    ap.add_argument("--run-timeout", type=int, default=600, help="`timeout` around every mpiexec, seconds")
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "faults"), help="run directories go here")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    args = ap.parse_args()
    args.hydra = is_hydra()
    command = "python benchmarks/faults.py " + " ".join(sys.argv[1:])
    rng = random.Random(args.seed)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    from benchmarks.loop_closure import describe_machine, machine

    meta = {"machine": f"{describe_machine(machine())}; load average at start "
                       f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, {platform.platform()}",
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "mpiexec": " ".join(" ".join(subprocess.run([mpiexec(), "--version"], capture_output=True, text=True,
                                                         timeout=30).stdout.splitlines()[:2]).split())}
    kills = []
    for i in range(args.kills):
        try:
            rec = one_kill(i, rng, args, workdir)
        except Exception as e:  # noqa: BLE001 - one broken run must not lose the others' results
            rec = {"kill": i, "error": f"{type(e).__name__}: {e}"}
        kills.append(rec)
        res = rec.get("resume")
        print(f"kill {i}: " + (rec["error"] if "error" in rec else
                               f"rank {rec['killed_rank']} at state {rec['latest_at_kill']}, teardown "
                               f"{rec['teardown_s']} s, orphans {len(rec['orphans'])}, pid->rank "
                               f"{rec['pid_maps_to_rank']}, unreadable {len(rec['files']['unreadable'])}/"
                               f"{rec['files']['pt_files']}, resumable {rec['resumable']}"
                               + ("" if res is None else f", resume {'ok' if res['completed'] else 'FAILED'}")),
              flush=True)
        write_report(Path(args.out), command, args, kills, summarize(kills), meta)  # after each kill: partial results
    s = summarize(kills)
    print(json.dumps(s, indent=1))
    ok = (s["kills_completed"] == s["kills"] and not s["teardown_s"]["hung"] and not s["runs_with_orphans"]
          and s["unreadable_pt_files"] == 0 and s["unreadable_json"] == 0 and s["resumes_completed"] == s["resumes"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
