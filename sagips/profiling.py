"""Named profiler ranges for the trainer's loop (`train.profile`, `python -m sagips.run --profile`).

    ranges = Ranges(enabled=True, device=torch.device("cuda", 0))
    with ranges("sagips/critic"):
        ...

When enabled, each range is
- an NVTX range (`torch.cuda.nvtx.range_push/pop`) when the device is CUDA, so that Nsight Systems shows it on the
  timeline (`nsys profile -t cuda,nvtx python -m sagips.run --profile ...`), and
- a `torch.profiler.record_function` range on every device, so that the same names appear as events in a
  `torch.profiler` trace (CPU or GPU).

When disabled, `ranges(name)` returns one shared no-op context manager: no allocation, no torch call, nothing
imported (the cost is one Python call, far below a microsecond).

The trainer's names (docs/optigan.md, "GPU recipe"): `sagips/epoch` (one whole epoch), `sagips/critic` (one critic
step), `sagips/generator` (the generator step), `sagips/data` (each `env.real_batch()`, nested in the two above),
`sagips/exchange` (the gradient exchange, nested in the generator step) and `sagips/log` (the quality evaluation
and metrics record of a logged epoch).
"""
from __future__ import annotations

from typing import Any

import torch

EPOCH, CRITIC, GENERATOR, DATA, EXCHANGE, LOG = ("sagips/epoch", "sagips/critic", "sagips/generator", "sagips/data",
                                                 "sagips/exchange", "sagips/log")
NAMES = (EPOCH, CRITIC, GENERATOR, DATA, EXCHANGE, LOG)


class _NoRange:
    """The shared do-nothing context manager of disabled profiling."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


NO_RANGE = _NoRange()


class _Range:
    __slots__ = ("name", "nvtx", "_rf")

    def __init__(self, name: str, nvtx: Any):
        self.name, self.nvtx, self._rf = name, nvtx, None

    def __enter__(self) -> None:
        if self.nvtx is not None:
            self.nvtx.range_push(self.name)
        self._rf = torch.profiler.record_function(self.name)
        self._rf.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        try:
            self._rf.__exit__(*exc)
        finally:
            self._rf = None
            if self.nvtx is not None:
                self.nvtx.range_pop()
        return False


class Ranges:
    """`ranges(name)` -> a context manager: a named range when enabled, the shared no-op otherwise."""

    def __init__(self, enabled: bool, device: torch.device | str = "cpu", nvtx: Any = None):
        self.enabled = bool(enabled)
        device = torch.device(device)
        # nvtx: injectable for tests; by default torch.cuda.nvtx, on CUDA devices only (a CPU build has no NVTX)
        if nvtx is None and self.enabled and device.type == "cuda":
            nvtx = torch.cuda.nvtx
        self.nvtx = nvtx if self.enabled else None

    def __call__(self, name: str):
        if not self.enabled:
            return NO_RANGE
        return _Range(name, self.nvtx)
