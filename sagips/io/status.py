"""run.json's status at an end other than completion, for a script that reads it and for sagips.analyze.

sagips.run writes "running" at the start and "complete" or "stopped" at an orderly end (rank 0). A failure ends the
job through MPI_Abort, so the rank that failed records "failed" here first, with the error's line: `mark` names the
run's run.json once it exists, `failed` writes the record (docs/reliability.md). A rank killed from outside (kill -9,
the out-of-memory killer) cannot write anything: such a run keeps "running".
"""
from __future__ import annotations

import datetime as _dt
import json
import os

_run_json: list = []  # [this run's run.json, is this rank its rank 0?], once it is written


def mark(path: str, is_root: bool) -> None:
    _run_json[:] = [path, is_root]


def failed(error: str, every_rank_raised: bool = False) -> None:
    """Record status "failed" with the error's last line (300 characters at most) and the time. every_rank_raised:
    the same error on every rank, written by rank 0 alone. Never raises: it runs on the way out of a failure."""
    if not _run_json or (every_rank_raised and not _run_json[1]):
        return
    try:
        with open(_run_json[0]) as fh:
            info = json.load(fh)
        if info.get("status") != "running":  # (a run that completed, or one that another rank already marked)
            return
        from sagips.io.atomic import write_text

        line = (error.strip().splitlines() or [""])[-1][:300]
        info.update(status="failed", end_time=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    error=line)
        write_text(_run_json[0], json.dumps(info, indent=2, default=str) + "\n")
    except Exception:  # noqa: BLE001  (the failure itself is what is reported)
        pass
