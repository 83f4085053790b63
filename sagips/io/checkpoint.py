"""Generator checkpoints: `checkpoints/rank{R:04d}/epoch{E:07d}.pt`, written atomically.

Each file loads with `torch.load(path, weights_only=True)` and holds at least `generator` (a state_dict), `epoch`,
`time_s` (accumulated training seconds of this rank) and `rank`, plus `environment` (its registered name).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from sagips.io.atomic import atomic_open
from sagips.models import unwrap

_NAME = re.compile(r"^epoch(\d{7})\.pt$")


def checkpoint_path(out_dir: str | os.PathLike, rank: int, epoch: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"rank{rank:04d}" / f"epoch{epoch:07d}.pt"


def save_checkpoint(out_dir, rank: int, epoch: int, time_s: float, generator: torch.nn.Module,
                    environment: str, **extra: Any) -> Path:
    path = checkpoint_path(out_dir, rank, epoch)
    generator = unwrap(generator)  # a DDP-wrapped generator (sagips.ddp) saves its module
    state = {k: v.detach().cpu().clone() for k, v in generator.state_dict().items()}
    payload = {"generator": state, "epoch": int(epoch), "time_s": float(time_s), "rank": int(rank),
               "environment": environment, **extra}
    with atomic_open(path, "wb") as fh:
        torch.save(payload, fh)
    return path


def unwrapped_keys(state: dict[str, Any]) -> dict[str, Any]:
    """A generator's state dict with the keys of the module itself: a training state of the DDP baseline written
    before it saved its generator unwrapped has every key `module.`-prefixed (DistributedDataParallel's); any other
    state dict is returned as it is."""
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module."):]: v for k, v in state.items()}
    return state


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load safely: weights_only=True refuses anything that could run code."""
    return torch.load(path, map_location="cpu", weights_only=True)


def list_checkpoints(out_dir: str | os.PathLike) -> dict[int, dict[int, Path]]:
    """{rank: {epoch: path}} for every complete checkpoint under out_dir/checkpoints."""
    root = Path(out_dir) / "checkpoints"
    found: dict[int, dict[int, Path]] = {}
    if not root.is_dir():
        return found
    for rank_dir in sorted(root.glob("rank[0-9][0-9][0-9][0-9]")):
        rank = int(rank_dir.name[4:])
        for f in rank_dir.iterdir():
            m = _NAME.match(f.name)
            if m:
                found.setdefault(rank, {})[int(m.group(1))] = f
    return found
