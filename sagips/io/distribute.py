"""Rank 0 loads (or generates) the reference data and broadcasts it to every rank as raw numpy buffers.

Only the older path uses it since issue 23 (sagips/io/shard.py reads each rank's own rows): environments without
`attach_subset`, and generators too costly to run on every rank (`generate_per_rank = False`, optiGAN's MC).

The layout (names, shapes, attributes) travels as a JSON byte string; the arrays travel with `Bcast` on their
buffers, never as pickles.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np


def broadcast_arrays(comm, make: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]] | None,
                     root: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """On `root`, call `make()`; everywhere, return the same (arrays, attrs).

    If `make` raises on the root, every rank raises the same error (no rank is left waiting in a Bcast).
    """
    from mpi4py import MPI

    header = None
    arrays: dict[str, np.ndarray] = {}
    if comm.rank == root:
        try:
            arrays, attrs = make()
            arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
            header = {"ok": True, "arrays": {k: list(v.shape) for k, v in arrays.items()},
                      "attrs": {k: np.asarray(v).tolist() for k, v in attrs.items()}}
        except Exception as e:  # forwarded to every rank below
            from sagips.config import ConfigError

            # a ConfigError subclass (e.g. an environment's EnvironmentCheckError) stays a one-line ConfigError
            kind = "ConfigError" if isinstance(e, ConfigError) else type(e).__name__
            header = {"ok": False, "type": kind, "error": str(e)}
    raw = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8) if comm.rank == root else None
    size = np.array([0 if raw is None else raw.size], dtype=np.int64)
    # The other ranks wait here while the root reads or generates the data (seconds to minutes). MPICH's blocking
    # Bcast busy-polls: with more ranks than cores (4 on a 2-core laptop) three spinning waiters starved the root and
    # made a 1 s generation take 11 s. A nonblocking broadcast, waited on with sleeps, leaves the cores to the root.
    from sagips.comm.watchdog import wait_all

    wait_all([comm.Ibcast([size, MPI.INT64_T], root=root)], float("inf"), "the reference data", comm, 0, [root])
    if raw is None:
        raw = np.empty(int(size[0]), dtype=np.uint8)
    comm.Bcast([raw, MPI.BYTE], root=root)
    header = json.loads(raw.tobytes().decode())
    if not header["ok"]:
        from sagips.config import ConfigError
        from sagips.io.refdata import DataError
        cls = {"DataError": DataError, "ConfigError": ConfigError}.get(header["type"], RuntimeError)
        raise cls(header["error"])
    for name, shape in header["arrays"].items():
        if comm.rank != root:
            arrays[name] = np.empty(shape, dtype=np.float32)
        comm.Bcast([arrays[name], MPI.FLOAT], root=root)
    return arrays, header["attrs"]


def on_root(comm, fn, *args):
    """fn(*args) on rank 0 of `comm`, its result shared with every rank. A ConfigError or DataError there is raised
    on every rank as the same class with the same one-line message (printed once, by rank 0), so that file-system
    work is done once per job and no rank waits for a rank that failed."""
    from sagips.errors import ConfigError
    from sagips.io.refdata import DataError

    kinds = {"ConfigError": ConfigError, "DataError": DataError}
    out = None
    if comm.rank == 0:
        try:
            out = ("ok", fn(*args))
        except (ConfigError, DataError) as e:
            out = ("DataError" if isinstance(e, DataError) else "ConfigError", str(e))
    kind, value = comm.bcast(out, root=0)
    if kind != "ok":
        raise kinds[kind](value)
    return value
