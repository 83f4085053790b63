"""Reference data at scale: each rank reads only the rows it keeps, straight from the HDF5 file.

    layout = share_layout(comm, path, datasets)   # rank 0 opens the file: names, shapes, chunk rows, attributes
    ranges = subset_ranges(np_seed, layout, fraction, mode)   # this rank's rows, a pure function of its key
    arrays = read_subset(path, layout, ranges, datasets)      # hyperslab reads of whole blocks, in file order

Only the layout (a few hundred bytes) crosses MPI; no byte of event data does. The subset depends on nothing but
(np_seed = rank_seeds(seed, member, rank)[1], fraction, mode, layout), so a training state stores that key and
`layout_checksum(layout)` instead of the indices, and --resume rebuilds the same rows.

Modes (config `data.subset`):
- `blocks` (the default for files): the rows are cut into blocks of `block_rows(layout)` rows (the datasets' HDF5
  chunk, at most 65536 rows, and at least 64 blocks per file); each rank takes whole blocks in a seeded random order
  until it holds round(fraction x N) rows, and reads them in file order (large sequential reads).
- `rows`: the rows are a uniform random choice (what every rank did before, when rank 0 broadcast the whole file);
  the rank reads the file in blocks and keeps its rows (all of the file passes through each rank: for small files).

With `ensemble.data: split` the units (blocks or rows) are first dealt out among the job's independent estimates
(the members, or every rank in --mode ensemble) by `member_part`, in a random order from the job's seed, and each rank
keeps its fraction of its own part only: the parts are disjoint and together hold every row.

With `data.share: node` the ranks of one node hold one subset, keyed by `node_seed(seed, member, node)` instead of
the rank's seed, in one shared-memory window (sagips/io/nodeshare.py); each rank reads `rows_between` its part of it.

Every problem is a one-line `DataError`; `agree` makes an error of one rank an error of every rank (no hang).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from sagips.io.refdata import DataError, checked_dataset, open_reference

MAX_BLOCK_ROWS = 65536  #: rows per block when the file is not chunked (or its chunks are larger): 0.5 MB at 2 columns
MIN_BLOCKS = 64  #: a small file is still cut into this many blocks, so that ranks' subsets differ


def _describe(f, path: str, datasets: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"datasets": {}, "attrs": {k: np.asarray(v).tolist() for k, v in f.attrs.items()}}
    for name, cols in datasets.items():
        ds = checked_dataset(f, path, name, cols)
        out["datasets"][name] = {"shape": list(ds.shape), "dtype": str(ds.dtype),
                                 # a virtual dataset (sagips/io/writer.py) has no chunks: its parts' are stored
                                 "chunk_rows": int(ds.chunks[0]) if ds.chunks else int(f.attrs.get("chunk_rows", 0))}
    rows = {d["shape"][0] for d in out["datasets"].values()}
    if len(rows) > 1:
        raise DataError(f"data file {path}: datasets {list(datasets)} have different numbers of rows")
    out["rows"] = rows.pop()
    return out


def read_layout(path: str | os.PathLike, datasets: dict[str, int]) -> dict[str, Any]:
    """{"path", "rows", "datasets": {name: {"shape", "dtype", "chunk_rows"}}, "attrs"} of a reference file,
    validated (the datasets exist, have `datasets[name]` columns and the same rows); reads no event data."""
    path = os.fspath(path)
    with open_reference(path) as f:
        layout = _describe(f, path, datasets)
        layout["path"] = path
        layout["checksum"] = layout_checksum(layout)
        layout["stat"] = _stamp(f, path, datasets)  # a rewrite of the same shape between layout and reads shows here
    return layout


def _stamp(f, path: str, datasets: dict[str, int]) -> list[list]:
    """[name, size, mtime_ns] of the file and of each part file that its virtual datasets read (a rewritten part
    changes no shape of the main file)."""
    here = os.path.dirname(os.path.abspath(path))
    parts = sorted({src.file_name for name in datasets if f[name].is_virtual for src in f[name].virtual_sources()
                    if src.file_name != "."})
    out = []
    for name, p in [(os.path.basename(path), path)] + [(q, os.path.join(here, q)) for q in parts]:
        st = os.stat(p)
        out.append([name, st.st_size, st.st_mtime_ns])
    return out


def layout_checksum(layout: dict[str, Any]) -> str:
    """A short hash of what the subset depends on: the datasets' shapes, types and chunks, and the attributes (not
    the path: a copied file resumes)."""
    blob = json.dumps({k: layout[k] for k in ("rows", "datasets", "attrs")}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def share_layout(comm, path: str, datasets: dict[str, int]) -> dict[str, Any]:
    """Rank 0 reads the layout; every rank gets it, or raises rank 0's DataError (the same line everywhere)."""
    from sagips.io.distribute import on_root

    return on_root(comm, read_layout, path, datasets)


def agree(comm, fn, *args, error: type[Exception] | tuple[type[Exception], ...] = DataError):
    """fn(*args) on every rank; if it raises `error` (a class or a tuple of them) on any rank, every rank raises the
    first such error (by rank, its class and message, naming the rank unless every rank raised the same), so that no
    rank is left waiting in a later collective."""
    kinds = error if isinstance(error, tuple) else (error,)
    try:
        out, err = fn(*args), None
    except kinds as e:
        kind = next(i for i, k in enumerate(kinds) if isinstance(e, k))
        out, err = None, (kind, f"{e}")
    if comm.size > 1 and hasattr(comm, "Ibarrier"):
        # ranks that finish their reads first wait with sleeps, not in MPICH's spinning allgather: with more ranks
        # than cores their spinning took the cores from the ranks still reading (4 ranks on 2 cores, 1e8 events:
        # start-up 8.0 s, the reads' share of it twice a lone read's)
        from sagips.comm.watchdog import wait_all

        wait_all([comm.Ibarrier()], float("inf"), "the other ranks' reads", comm, 0, list(range(comm.size)))
    every = comm.allgather(err)
    errors = [(rank, e) for rank, e in enumerate(every) if e is not None]
    if errors:
        rank, (kind, msg) = errors[0]
        same = len(errors) == len(every) and all(e == errors[0][1] for _, e in errors)
        raise kinds[kind](msg if comm.size == 1 or same else f"{msg} (rank {rank})")
    return out


def block_rows(layout: dict[str, Any]) -> int:
    """Rows per block: the datasets' chunk rows (whole chunks are read), capped at MAX_BLOCK_ROWS and at
    rows / MIN_BLOCKS."""
    chunks = [d["chunk_rows"] for d in layout["datasets"].values() if d["chunk_rows"]]
    b = min([MAX_BLOCK_ROWS, *chunks])
    return max(1, min(b, layout["rows"] // MIN_BLOCKS))


def n_keep(n: int, fraction: float, path: str = "") -> int:
    """Rows a rank keeps: round(fraction x n); a DataError if that is none."""
    k = int(round(fraction * n))
    if k < 1:
        raise DataError(f"data file {path}: {n} rows are too few for subset_fraction={fraction} (it keeps none); "
                        f"use a larger file or a larger environment.subset_fraction")
    return k


def node_seed(seed: int, member: int, node: int) -> int:
    """The numpy seed of node `node`'s subset (data.share=node), from a stream of its own: the counterpart of
    `rank_seeds(seed, member, rank)[1]` (sagips/trainer.py), which no rank's seed equals."""
    s = np.random.SeedSequence([seed, member, node], spawn_key=(1,))
    return int(s.generate_state(2, dtype=np.uint32)[1])


def part_seed(seed: int) -> int:
    """The numpy seed that deals the rows out among the parts of `ensemble.data=split` (`member_part`): one per job
    (every member shares it), from a stream that no rank's or node's seed equals."""
    s = np.random.SeedSequence([seed], spawn_key=(2,))
    return int(s.generate_state(1, dtype=np.uint32)[0])


def _units(layout: dict[str, Any], mode: str) -> np.ndarray:
    """The units a subset is made of, as [start, stop) ranges in file order: the blocks (mode blocks) or the rows."""
    n = layout["rows"]
    if mode == "rows":
        idx = np.arange(n, dtype=np.int64)
        return np.stack([idx, idx + 1], axis=1)
    if mode != "blocks":
        raise ValueError(f"unknown subset mode {mode!r}")
    b = block_rows(layout)
    starts = np.arange(-(-n // b), dtype=np.int64) * b
    return np.stack([starts, np.minimum(starts + b, n)], axis=1)


def member_part(layout: dict[str, Any], mode: str, split: tuple[int, int, int]) -> np.ndarray:
    """Part `index` of `parts` of the rows, split = (seed, index, parts), for `ensemble.data=split`: the units
    (`_units`: whole blocks, or rows) are dealt out in a random order from `part_seed(seed)`, so that the parts are
    disjoint, cover every row and hold as many units to one (the last block may be short). Sorted [start, stop)
    ranges (k, 2)."""
    seed, index, parts = split
    units = _units(layout, mode)
    if parts > len(units):
        raise DataError(f"data file {layout.get('path') or '(generated)'}: {layout['rows']} rows in {len(units)} "
                        f"{mode} cannot be dealt out among {parts} parts (ensemble.data=split); use data.subset=rows "
                        f"or fewer members")
    order = np.random.default_rng(part_seed(seed)).permutation(len(units))
    return units[np.sort(order[index::parts])]


def subset_ranges(np_seed: int, layout: dict[str, Any], fraction: float, mode: str,
                  split: tuple[int, int, int] | None = None) -> np.ndarray:
    """This rank's rows as sorted, disjoint [start, stop) ranges, shape (k, 2), int64: a pure function of the
    arguments (the state key). `split` = (seed, index, parts): the rank keeps its `fraction` of part `index` only
    (`member_part`), not of the whole file."""
    rng = np.random.default_rng(np_seed)
    if mode == "rows":  # a uniform choice of the rows (of the file: the choice rank 0's broadcast made before)
        rows = np.arange(layout["rows"]) if split is None else member_part(layout, mode, split)[:, 0]
        k = n_keep(len(rows), fraction, layout.get("path", ""))
        idx = rows if k == len(rows) else rows[np.sort(rng.choice(len(rows), size=k, replace=False))]
        return np.stack([idx, idx + 1], axis=1).astype(np.int64)
    units = _units(layout, mode) if split is None else member_part(layout, mode, split)
    k = n_keep(int((units[:, 1] - units[:, 0]).sum()), fraction, layout.get("path", ""))
    units = units[rng.permutation(len(units))]  # whole blocks in a seeded random order
    starts, stops = units[:, 0], units[:, 1]
    taken = np.cumsum(stops - starts)
    last = int(np.searchsorted(taken, k))  # the block that completes k rows; only its first rows are kept
    starts, stops = starts[:last + 1], stops[:last + 1].copy()
    stops[-1] -= taken[last] - k
    order = np.argsort(starts)
    return np.stack([starts[order], stops[order]], axis=1).astype(np.int64)


def _runs(ranges: np.ndarray, gap_rows: int) -> list[tuple[int, int]]:
    """`ranges` merged into reads where the gap is below gap_rows, each read at most MAX_BLOCK_ROWS long."""
    out: list[list[int]] = []
    for a, b in ranges.tolist():
        if out and a - out[-1][1] < gap_rows and b - out[-1][0] <= MAX_BLOCK_ROWS:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def read_subset(path: str, layout: dict[str, Any], ranges: np.ndarray, datasets: dict[str, int],
                out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The rows `ranges` of each dataset (float32, in file order). The file must still have `layout`. out: arrays
    of shape (rows of `ranges`, columns) to read into (a node's shared window, sagips/io/nodeshare.py), else new
    ones."""
    with open_reference(path) as f:
        now = _describe(f, path, datasets)
        now["path"] = path
        stamp = _stamp(f, path, datasets)
        if layout_checksum(now) != layout["checksum"] or stamp != layout["stat"]:
            moved = [a[0] for a, b in zip(stamp, layout["stat"]) if a != b] or [os.path.basename(path)]
            raise DataError(f"data file {path}: changed since its layout was read at start-up ({moved[0]} was "
                            f"rewritten; now {now['rows']} rows); do not rewrite a data file while a run starts")
        k = int((ranges[:, 1] - ranges[:, 0]).sum())
        # rows mode (one-row ranges): merged into block reads, the rows between read and dropped; blocks mode:
        # adjacent blocks merged into one read
        one_row = len(ranges) and (ranges[:, 1] - ranges[:, 0]).max() == 1
        runs = _runs(ranges, block_rows(layout) if one_row else 1)
        out = dict(out) if out is not None else {name: np.empty((k, cols), dtype=np.float32)
                                                  for name, cols in datasets.items()}
        scratch, before = None, np.concatenate([[0], np.cumsum(ranges[:, 1] - ranges[:, 0])])
        for name, cols in datasets.items():
            ds, arr, o, r = f[name], out[name], 0, 0
            for a, b in runs:
                r0 = r
                r = int(np.searchsorted(ranges[:, 1], b, side="right"))  # the selected ranges inside this run
                kept = int(before[r] - before[r0])
                try:
                    if kept == b - a:  # the whole run is kept (blocks mode): straight into the output
                        ds.read_direct(arr, np.s_[a:b], np.s_[o:o + kept])
                    else:  # rows mode: into one reused buffer (a new array per block cost 6x the read itself)
                        if scratch is None or scratch.shape[0] < b - a or scratch.shape[1] != cols:
                            scratch = np.empty((max(b - a, MAX_BLOCK_ROWS), cols), dtype=np.float32)
                        ds.read_direct(scratch, np.s_[a:b], np.s_[0:b - a])
                        part = ranges[r0:r]  # gather the kept rows: one index array, not a loop per row
                        lengths = part[:, 1] - part[:, 0]
                        idx = np.repeat(part[:, 0] - a - (np.cumsum(lengths) - lengths), lengths) + np.arange(kept)
                        np.take(scratch, idx, axis=0, out=arr[o:o + kept])
                except OSError as e:
                    raise DataError(f"data file {path}: dataset '{name}' is corrupt "
                                    f"({str(e).splitlines()[0][:120]})") from None
                o += kept
            # checked a block at a time: ~np.isfinite of the whole subset would add 4 bytes per row to the peak
            if not all(np.isfinite(arr[i:i + MAX_BLOCK_ROWS]).all() for i in range(0, len(arr), MAX_BLOCK_ROWS)):
                bad = ~np.isfinite(arr)  # named by its row in the file: the rank's row i is in the range where
                i = int(np.argwhere(bad)[0][0])  # cumsum passes i
                lengths = ranges[:, 1] - ranges[:, 0]
                j = int(np.searchsorted(np.cumsum(lengths), i, side="right"))
                row = int(ranges[j, 0] + i - (np.cumsum(lengths)[j] - lengths[j]))
                raise DataError(f"data file {path}: dataset '{name}' holds {int(bad.sum())} NaN/Inf values in this "
                                f"rank's rows (first in row {row}); clean the file")
    return out


def reader(path: str, layout: dict[str, Any], datasets: dict[str, int]):
    """fill(ranges, out) for sagips/io/nodeshare.py: `read_subset` of the file into `out`."""
    return lambda ranges, out: read_subset(path, layout, ranges, datasets, out)


def plan_subset(comm, path: str, datasets: dict[str, int], np_seed: int, fraction: float, mode: str,
                split: tuple[int, int, int] | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """(the layout, the ranges of the subset of `np_seed`, of part `split` if given) on every rank of `comm`; only
    the layout is broadcast."""
    layout = share_layout(comm, path, datasets)
    return layout, agree(comm, subset_ranges, np_seed, layout, fraction, mode, split)


def load_subset(comm, path: str, datasets: dict[str, int], np_seed: int, fraction: float, mode: str
                ) -> tuple[dict[str, np.ndarray], dict[str, Any], np.ndarray]:
    """What `sagips.run` does with a data file, on every rank of `comm`: (this rank's arrays, the layout, its
    ranges). Only the layout is broadcast; an error on any rank is a DataError on every rank."""
    layout, ranges = plan_subset(comm, path, datasets, np_seed, fraction, mode)
    arrays = agree(comm, read_subset, path, layout, ranges, datasets)
    return arrays, layout, ranges


def rows_between(ranges: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The part of `ranges` that holds the subset's rows lo..hi-1 (counted in subset order), as ranges; how the
    ranks of one node split the reads of the node's subset (data.share=node)."""
    lengths = ranges[:, 1] - ranges[:, 0]
    before = np.concatenate([[0], np.cumsum(lengths)])  # subset rows before each range
    keep = (before[1:] > lo) & (before[:-1] < hi)
    part = ranges[keep].copy()
    part[:, 0] += np.maximum(0, lo - before[:-1][keep])
    part[:, 1] -= np.maximum(0, before[1:][keep] - hi)
    return part.reshape(-1, 2)
