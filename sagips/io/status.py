"""run.json: its writer, and its status at an end other than completion, for a script that reads it and for
sagips.analyze.

sagips.run writes "running" at the start and "complete" or "stopped" at an orderly end (rank 0). A failure ends the
job through MPI_Abort, so the rank that failed records "failed" here first, with the error's line, in its own run's
run.json and in those of the job's other members, which the abort ends too: `mark` names them once run.json exists,
`failed` writes the record (docs/reliability.md). A rank killed from outside (kill -9, the out-of-memory killer)
cannot write anything: such a run keeps "running".
"""
from __future__ import annotations

import datetime as _dt
import json
import os

_marked: list = []  # [this run's run.json, is this rank its rank 0?, the job's other members' run.json]


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_run_json(out_dir: str, info: dict) -> None:
    from sagips.io.atomic import write_text

    write_text(os.path.join(out_dir, "run.json"), json.dumps(info, indent=2, default=str) + "\n")


def mark(path: str | None, is_root: bool = False, others: list[str] | tuple = ()) -> None:
    """The run.json this rank's failure is recorded in (None: none yet), and the other members' of its job."""
    _marked[:] = [path, is_root, list(others)] if path else []


def failed(error: str, every_rank_raised: bool = False, aborts_job: bool = True) -> None:
    """Record status "failed" with the error's first line (300 characters at most) and the time; where the failure
    aborts the job (`aborts_job`), the job's other members, which the abort ends too, get "failed" with "aborted: "
    and the line. every_rank_raised: an error that every rank raised (or met, as the watchdog's ranks waiting for the
    same peer), written by rank 0 alone, so that the writes do not grow with the ranks. Never raises: it runs on the
    way out of a failure."""
    if not _marked or (every_rank_raised and not _marked[1]):
        return
    line = next((x.strip() for x in error.splitlines() if x.strip()), "")[:300]
    others = _marked[2] if aborts_job else []
    for path, said in [(_marked[0], line), *((p, f"aborted: {line}") for p in others)]:
        try:
            with open(path) as fh:
                info = json.load(fh)
            if info.get("status") != "running":  # (a run that completed, or one another rank already marked)
                continue
            info.update(status="failed", end_time=now(), error=said)
            write_run_json(os.path.dirname(path), info)
        except Exception:  # noqa: BLE001  (the failure itself is what is reported)
            pass
