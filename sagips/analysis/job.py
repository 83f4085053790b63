"""The job's own result: at the end of a job of several independent members (`sagips.run --ensemble-size M`), the
member that ends last runs `sagips.analyze` on the job's directory and prints p̂ ± σ per parameter (issue 36); a
`--mode ensemble` run of several ranks, whose ranks are independent members, analyses itself (`run_result`).

Without it, each member printed its own table and convergence lines (M of them, interleaved), and the number to
quote needed a second command. No collective is added: the members end on their own, so a member that fails or is
stopped never leaves the others waiting. Each member's rank 0, once its run.json says complete, reads its siblings'
run.json; the one that finds every member of this job complete (the same `job` token, drawn at the job's start)
claims the analysis with an exclusive create, so that of two members that end at once exactly one analyses.
`ensemble.analyze=false` skips it; `python -m sagips.analyze OUTPUT_DIR` gives the same numbers at any time.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

ANALYSIS_DIR = "analysis"  # OUTPUT_DIR/analysis: summary.md, summary.json, summary.csv and the figures
_CLAIM = ".claimed-"


def new_token() -> str:
    """The job's token, drawn once by world rank 0 and written into every member's run.json (`job`)."""
    return uuid.uuid4().hex


def members_complete(job_dir: str | os.PathLike, members: int, token: str) -> bool:
    """Whether every member of this job (token) has a complete run.json; a member of an earlier job in the same
    directory, or one still running, makes it False."""
    for m in range(members):
        try:
            info = json.loads((Path(job_dir) / f"member{m:03d}" / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):  # not written yet, or being replaced
            return False
        if info.get("status") != "complete" or info.get("job") != token:
            return False
    return True


def claim(job_dir: str | os.PathLike, token: str) -> bool:
    """True for exactly one caller per token (an exclusive create); claims of earlier jobs are removed."""
    out = Path(job_dir) / ANALYSIS_DIR
    out.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(out / f"{_CLAIM}{token}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    for old in out.glob(f"{_CLAIM}*"):
        if old.name != f"{_CLAIM}{token}":
            old.unlink(missing_ok=True)
    return True


def job_result(job_dir: str | os.PathLike, members: int, token: str, say=print) -> dict | None:
    """On a member's rank 0 after its run.json says complete: if this member is the job's last, analyse the job's
    M members (`sagips.analyze` with its defaults, into JOB_DIR/analysis) and print p̂ ± σ; otherwise one line says
    where the job's result comes from. Never raises (the members' runs are complete and saved whatever happens here).
    Returns the summary, or None."""
    job_dir = Path(job_dir)
    out = job_dir / ANALYSIS_DIR
    runs = [job_dir / f"member{m:03d}" for m in range(members)]  # not member dirs of an earlier, larger job
    from sagips.analysis.ensemble import _MEMBER  # (the pattern analyze expands a job directory by)

    try:
        extra = sorted(d.name for d in job_dir.iterdir() if d.is_dir() and _MEMBER.match(d.name) and d not in runs)
    except OSError:  # (never fail a complete run here: the claim below says what went wrong)
        extra = []
    what = f"{job_dir}/member{{000..{members - 1:03d}}}" if extra else str(job_dir)
    again = f"python -m sagips.analyze {what} --out {out}"
    try:
        if not (members_complete(job_dir, members, token) and claim(job_dir, token)):
            say(f"sagips: the job's p̂ ± σ comes from its last member to end (or at any time: {again})")
            return None
        say(f"sagips: all {members} members of the job are done; analysing them ({again})")
        if extra:
            say(f"sagips: note: {job_dir} also holds {', '.join(extra)} of an earlier job: not in this analysis")
    except Exception as e:  # a job directory it cannot write into: redone at any time
        return _failed(e, "the job's", "the members' runs are complete", again, say)
    return _analyse(runs, out, "the job's", "the members' runs are complete", again, say)


def run_result(run_dir: str | os.PathLike, ranks: int, say=print) -> dict | None:
    """On rank 0 at the end of a `--mode ensemble` run of several ranks (one job, no --ensemble-size): its ranks are
    independent members, so analyse the run (`sagips.analyze RUN_DIR` with its defaults, into RUN_DIR/analysis) and
    print p̂ ± σ, as the last member of a job of several does. Never raises; returns the summary, or None."""
    out = Path(run_dir) / ANALYSIS_DIR
    again = f"python -m sagips.analyze {run_dir} --out {out}"
    try:
        say(f"sagips: the {ranks} ranks are independent members; analysing them ({again})")
    except Exception:  # (stdout itself gone: a closed pipe)
        return None
    return _analyse([Path(run_dir)], out, "the run's", "the run is complete", again, say)


def _analyse(runs, out: Path, whose: str, complete: str, again: str, say) -> dict | None:
    """sagips.analyze RUNS --out OUT, then its p̂ ± σ section printed; a failure is one warning line."""
    try:
        from sagips.analyze import parse_args, quotable, run_analysis

        t0 = time.perf_counter()
        summary = run_analysis(parse_args([f"--out={out}", "--", *map(str, runs)]))  # (paths may start with -)
        say("\n".join(quotable(summary)) + f"\n\nsagips: {whose} analysis (summary.md, summary.json, figures) is "
            f"in {out} ({time.perf_counter() - t0:.0f} s)")
        return summary
    except Exception as e:  # a directory it cannot write into, an analysis that fails: redone at any time
        return _failed(e, whose, complete, again, say)


def _failed(e: Exception, whose: str, complete: str, again: str, say) -> None:
    try:
        say(f"sagips: warning: {whose} analysis failed ({type(e).__name__}: {e}); {complete}: run {again}")
    except Exception:  # (stdout itself gone: a closed pipe)
        pass
    return None
