"""Full training states for --resume: `state/rank{R:04d}/epoch{E:07d}.pt` plus a `state/latest.json` marker.

A state holds everything a rank needs to continue bit-identically (networks, optimizers, RNG states, data subset,
epoch, accumulated time). Files are written atomically; the marker names the last epoch for which EVERY rank's state
is complete, and is written only after all ranks reported their state written.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from sagips.io.atomic import atomic_open, write_text

_NAME = re.compile(r"^epoch(\d{7})\.pt$")


def state_path(out_dir, rank: int, epoch: int) -> Path:
    return Path(out_dir) / "state" / f"rank{rank:04d}" / f"epoch{epoch:07d}.pt"


def save_state(out_dir, rank: int, epoch: int, state: dict[str, Any], keep: int = 2) -> Path:
    path = state_path(out_dir, rank, epoch)
    with atomic_open(path, "wb") as fh:
        torch.save(state, fh)
    # keep the newest `keep` states of this rank, and every state from the newest complete epoch (the marker) on:
    # ranks that drift apart (rma-arar-arar, or a SIGTERM seen one epoch apart) must keep an epoch in common. Before
    # the first marker nothing is deleted: a fast rank could otherwise drop the epoch that becomes the first marker
    # while a slow rank is still writing it, and a kill then would leave no complete epoch to resume from.
    marker = (read_latest(out_dir) or {}).get("epoch")
    for old in sorted(state_epochs(out_dir, rank))[:-keep]:
        if marker is None or old >= marker:
            continue
        try:
            os.unlink(state_path(out_dir, rank, old))
        except FileNotFoundError:
            pass
    return path


def state_epochs(out_dir, rank: int) -> list[int]:
    d = Path(out_dir) / "state" / f"rank{rank:04d}"
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for f in d.iterdir() if (m := _NAME.match(f.name)))


def write_latest(out_dir, epoch: int, world_size: int) -> None:
    write_text(Path(out_dir) / "state" / "latest.json", json.dumps({"epoch": epoch, "world_size": world_size}) + "\n")


def read_latest(out_dir) -> dict | None:
    p = Path(out_dir) / "state" / "latest.json"
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def resume_epoch(out_dir, world_size: int) -> int | None:
    """The newest epoch whose state exists for every rank (the marker's, or found by scanning)."""
    common = None
    for r in range(world_size):
        eps = set(state_epochs(out_dir, r))
        common = eps if common is None else common & eps
    if not common:
        return None
    latest = read_latest(out_dir)
    if latest and latest.get("epoch") in common:
        return int(latest["epoch"])
    return max(common)


def load_state(out_dir, rank: int, epoch: int) -> dict[str, Any]:
    return torch.load(state_path(out_dir, rank, epoch), map_location="cpu", weights_only=True)
