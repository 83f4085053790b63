"""metrics.jsonl: one JSON object per logged epoch, appended and flushed line by line.

A kill can at worst cut the last line; `read_metrics` skips such a torn tail instead of failing.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from typing import Any


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
        self._fh = None  # opened on the first record (after a resume has truncated the file)

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None and not self._fh.closed:
            os.fsync(self._fh.fileno())
            self._fh.close()


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
