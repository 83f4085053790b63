"""Full training states for --resume: `state/rank{R:04d}/epoch{E:07d}.pt` plus a `state/latest.json` marker.

A state holds everything a rank needs to continue bit-identically (networks, optimizers, RNG states, data subset,
epoch, accumulated time). Files are written atomically; the marker names the last epoch for which EVERY rank's state
is complete; rank 0 writes it once the ranks' per-epoch reduction (sagips.comm.stop) shows that every rank saved it.
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


class RankStates:
    """One rank's training states. The rank touches only its own files and remembers what it wrote: a save writes
    one file and deletes this rank's old ones, with no directory listing and no read of state/latest.json (at 400
    ranks on Lustre, a listing and a marker read per rank per save are 800 metadata operations on shared objects).

    Retention: the newest `keep` states, and every state from `complete` on. `complete` is the newest epoch that
    every rank holds, as far as this rank knows (sagips.comm.stop.StopAgreement reduces it with the stop flag; it
    lags the truth, never leads it). Ranks that drift apart (rma-arar-arar, or a stop state off the schedule) must
    keep an epoch in common; before `complete` is known nothing is deleted: a fast rank could otherwise drop the epoch
    that becomes complete while a slow rank is still writing it, and a kill then would leave nothing to resume from.
    """

    def __init__(self, out_dir, rank: int, epochs=(), keep: int = 2, complete: int | None = None):
        self.out_dir, self.rank, self.keep = out_dir, rank, keep
        self.epochs = sorted(set(epochs))  #: this rank's states on disk (its listing at a resume, then its writes)
        self.complete = complete

    @property
    def newest(self) -> int:
        return self.epochs[-1] if self.epochs else 0

    def save(self, epoch: int, state: dict[str, Any]) -> Path:
        path = state_path(self.out_dir, self.rank, epoch)
        with atomic_open(path, "wb") as fh:
            torch.save(state, fh)
        self.epochs = sorted(set(self.epochs) | {epoch})
        self.prune()
        return path

    def set_complete(self, epoch: int) -> bool:
        """Every rank holds `epoch`; True if that is news."""
        if epoch <= 0 or (self.complete is not None and epoch <= self.complete):
            return False
        self.complete = epoch
        self.prune()
        return True

    def prune(self) -> None:
        if self.complete is None:
            return
        for old in self.epochs[:-self.keep]:
            if old >= self.complete:
                continue
            try:
                os.unlink(state_path(self.out_dir, self.rank, old))
            except FileNotFoundError:
                pass
            self.epochs.remove(old)


def save_state(out_dir, rank: int, epoch: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write one state without retention (tools and tests); a training rank uses RankStates."""
    return RankStates(out_dir, rank, keep=keep).save(epoch, state)


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
    """The newest epoch whose state exists for every rank (the marker's, or found by scanning). Lists every rank's
    directory: for tools and tests. A run agrees on it with `agree_resume_epoch` (each rank lists only its own)."""
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


def agree_resume_epoch(comm, out_dir) -> tuple[int | None, list[int]]:
    """(the newest epoch that every rank of `comm` holds, or None; this rank's own state epochs). Collective.

    File-system work per rank does not grow with the ranks: rank 0 reads state/latest.json, every rank lists its own
    state directory once; the rest is MPI. If the marker's epoch is not held by every rank (a marker from another
    run, a deleted file), the ranks intersect their listings through an allgather."""
    marker = comm.bcast((read_latest(out_dir) or {}).get("epoch") if comm.rank == 0 else None, root=0)
    mine = state_epochs(out_dir, comm.rank)
    if isinstance(marker, int) and comm.allreduce(int(marker in mine), op=_min()) == 1:
        return marker, mine
    common = set.intersection(*(set(e) for e in comm.allgather(mine)))
    return (max(common) if common else None), mine


def _min():
    from mpi4py import MPI

    return MPI.MIN


def load_state(out_dir, rank: int, epoch: int) -> dict[str, Any]:
    return torch.load(state_path(out_dir, rank, epoch), map_location="cpu", weights_only=True)
