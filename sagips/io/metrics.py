"""metrics.jsonl: one JSON object per logged epoch.

Every record rewrites the whole file atomically (temporary file in the same directory, fsync, rename; see
`sagips.io.atomic`), so that a kill at any instant leaves the previous complete file or the new one, never a torn
line. The records are small (a few hundred bytes, one per `train.log_every` epochs), so the rewrite is cheap.
`read_metrics` still skips a torn tail, for files written by other tools or older versions.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from typing import Any

from sagips.io.atomic import write_text


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/Inf; keep them visible as strings
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class MetricsWriter:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._lines: list[str] | None = None  # read on the first record (after a resume has truncated the file)

    def write(self, record: dict[str, Any]) -> None:
        if self._lines is None:
            self._lines = []
            if os.path.exists(self.path):
                with open(self.path, encoding="utf-8") as fh:
                    self._lines = [line + "\n" for line in fh.read().splitlines() if line.strip()]
        self._lines.append(json.dumps(_clean(record), separators=(",", ":")) + "\n")
        write_text(self.path, "".join(self._lines))

    def close(self) -> None:
        """Nothing to flush: every record is already on disk."""


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        lines: Iterable[str] = fh.read().splitlines()
    for line in lines:
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a torn last line from a kill
    return out
