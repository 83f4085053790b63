"""Write a big reference file in blocks: bounded memory, a progress bar, and one part file per MPI rank.

    write_stream("F.h5", Proxy1D, cfg, seed=1234, n=10**9)                         # one process: one file
    mpiexec -n 8 python -m sagips.data proxy1d --events 1e10 --out F.h5            # 8 parts + F.h5, a virtual dataset

The rows are cut into blocks of STREAM_BLOCK_ROWS rows. Block b is `generate_reference` of the environment for that
block's rows with its own seed, `block_seed(seed, b)`, so the file is a pure function of (seed, events, truth): the
same whether it is written in batches of 1 or 100 blocks, by 1 or 400 ranks. Memory holds one batch of blocks.

With N > 1 ranks, rank r writes its contiguous range of blocks to `F.partRRRR-of-NNNN.h5` (a complete reference
file of its own), the ranks agree that every part was written, and rank 0 writes `F.h5`: an HDF5 virtual dataset
that joins the parts by relative names (move the set together), with the same attributes. Every file is written
atomically (temporary file, then rename): a crash or Ctrl-C leaves no half-written file.

Without a file, `generate_subset` makes a rank's subset of the file that `write_stream` would write, block by block,
without writing it: only the blocks that hold the rank's rows are generated, the same rows as a run that reads the
written file (same seed, events and truth) keeps.

The HDF5 chunk (`chunk_rows(n)`, stored as the file attribute `chunk_rows`) is the block that sagips/io/shard.py
reads: the largest power of two <= min(MAX_BLOCK_ROWS, n / MIN_BLOCKS). A rank's subset is then made of whole
chunks (one sequential read of 0.5 MB each at 2 columns, on a file of more than 4.2M rows), and the chunks divide
STREAM_BLOCK_ROWS, so no chunk straddles two part files.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from sagips.io.atomic import atomic_path
from sagips.io.refdata import DataError
from sagips.io.shard import MAX_BLOCK_ROWS, MIN_BLOCKS

STREAM_BLOCK_ROWS = 65536  #: rows per random-stream block; fixed: the file's values depend on it
BATCH_BLOCKS = 8  #: blocks generated and written per HDF5 write (4 MB at 2 columns): the writer's memory


def block_seed(seed: int, block: int) -> int:
    """The seed of block `block`'s random stream: independent streams for every (seed, block)."""
    return int(np.random.SeedSequence([seed, block]).generate_state(1, np.uint32)[0])


def chunk_rows(n: int) -> int:
    """HDF5 chunk rows for a file of n rows: the largest power of two <= min(MAX_BLOCK_ROWS, n // MIN_BLOCKS)."""
    return 1 << max(0, min(MAX_BLOCK_ROWS, n // MIN_BLOCKS, STREAM_BLOCK_ROWS).bit_length() - 1)


def can_stream(cfg: Any) -> bool:
    """Whether an environment's config sets its event count (`reference_events`), which the blocks need."""
    return dataclasses.is_dataclass(cfg) and any(f.name == "reference_events" for f in dataclasses.fields(cfg))


def generate_block(env_cls, cfg: Any, seed: int, n: int, block: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Block `block` of a file of n events: `generate_reference` for the block's rows with the block's seed."""
    m = min(STREAM_BLOCK_ROWS, n - block * STREAM_BLOCK_ROWS)
    arrays, attrs = env_cls.generate_reference(dataclasses.replace(cfg, reference_events=m), block_seed(seed, block))
    bad = [k for k, a in arrays.items() if len(a) != m]
    if bad:
        raise DataError(f"environment {env_cls.name}: generate_reference gave {len(arrays[bad[0]])} rows of "
                        f"'{bad[0]}' for reference_events={m}; it cannot be written in blocks")
    return arrays, attrs


def _batches(env_cls, cfg, seed: int, n: int, blocks: range, batch: int) -> Iterator[tuple[dict, dict]]:
    for b0 in range(blocks.start, blocks.stop, batch):
        parts = [generate_block(env_cls, cfg, seed, n, b) for b in range(b0, min(b0 + batch, blocks.stop))]
        yield {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}, parts[0][1]


def virtual_layout(env_cls, cfg: Any, seed: int, n: int) -> dict[str, Any]:
    """The layout (sagips/io/shard.py's `read_layout`, without path and stat) of the n-event file that `write_stream`
    would write with `seed`: what a rank's subset of generated data is chosen from. Generates one row."""
    from sagips.io.shard import layout_checksum

    one, attrs = env_cls.generate_reference(dataclasses.replace(cfg, reference_events=1), seed)
    chunk = chunk_rows(n)
    layout = {"rows": n, "attrs": {k: np.asarray(v).tolist() for k, v in _file_attrs(attrs, n, seed).items()},
              "datasets": {k: {"shape": [n, *a.shape[1:]], "dtype": "float32", "chunk_rows": chunk}
                           for k, a in one.items()}}
    layout["checksum"] = layout_checksum(layout)
    return layout


def _expand(ranges: np.ndarray) -> np.ndarray:
    """The rows of disjoint [start, stop) ranges, in order (vectorised: no Python loop over ranges)."""
    lengths = ranges[:, 1] - ranges[:, 0]
    if not len(lengths):
        return np.zeros(0, np.int64)
    offsets = np.repeat(ranges[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(int(lengths.sum()), dtype=np.int64)


def generate_subset(env_cls, cfg: Any, seed: int, n: int, ranges: np.ndarray,
                    out: dict[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rows `ranges` (sorted, disjoint [start, stop), as `shard.subset_ranges` gives them) of the n-event file that
    `write_stream` would write with `seed`, and its attributes: bit for bit what `shard.read_subset` reads from that
    file. Generates only the blocks that hold those rows; memory is the subset plus one block. out: arrays of the
    subset's shape to fill (a node's shared window, sagips/io/nodeshare.py), else new ones."""
    S = STREAM_BLOCK_ROWS
    ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if len(ranges) and (ranges[0, 0] < 0 or ranges[-1, 1] > n or np.any(ranges[1:, 0] < ranges[:-1, 1])):
        raise ValueError(f"generate_subset: ranges must be sorted, disjoint and within 0..{n}")
    total = int((ranges[:, 1] - ranges[:, 0]).sum())
    first, last = ranges[:, 0] // S, (ranges[:, 1] - 1) // S
    blocks = np.unique(_expand(np.stack([first, last + 1], axis=1)) if len(ranges) else first)
    attrs: dict[str, Any] = {}
    at = 0
    for blk in blocks.tolist():
        lo, hi = blk * S, min(n, (blk + 1) * S)
        i0, i1 = np.searchsorted(ranges[:, 1], lo, side="right"), np.searchsorted(ranges[:, 0], hi, side="left")
        rows = _expand(np.clip(ranges[i0:i1], lo, hi)) - lo
        arrays, attrs = generate_block(env_cls, cfg, seed, n, blk)
        if out is None:
            out = {k: np.empty((total, *a.shape[1:]), dtype=np.float32) for k, a in arrays.items()}
        elif set(out) != set(arrays) or any(len(out[k]) != total for k in out):
            raise ValueError(f"generate_subset: out must hold {total} rows of {sorted(arrays)}")
        for k, a in arrays.items():
            out[k][at:at + len(rows)] = a[rows]
        at += len(rows)
        del arrays
    if out is None:  # no rows: empty arrays of the right widths
        one, attrs = env_cls.generate_reference(dataclasses.replace(cfg, reference_events=1), seed)
        out = {k: np.empty((0, *a.shape[1:]), dtype=np.float32) for k, a in one.items()}
    return out, _file_attrs(attrs, n, seed)


def generator(env_cls, cfg: Any, seed: int, n: int):
    """fill(ranges, out) for sagips/io/nodeshare.py: `generate_subset` into `out` (a node's share without a file)."""
    return lambda ranges, out: generate_subset(env_cls, cfg, seed, n, ranges, out)


def part_name(path: str, rank: int, size: int) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.part{rank:04d}-of-{size:04d}{ext or '.h5'}"


def _file_attrs(attrs: dict[str, Any], n: int, seed: int) -> dict[str, Any]:
    return {**attrs, "chunk_rows": chunk_rows(n), "seed": seed, "stream_block_rows": STREAM_BLOCK_ROWS}


def _write_blocks(path: str, env_cls, cfg, seed: int, n: int, blocks: range, batch: int, bar) -> None:
    """Blocks `blocks` of the n-event file into `path` (atomically), as datasets of their own rows."""
    import h5py

    rows = min(n, blocks.stop * STREAM_BLOCK_ROWS) - blocks.start * STREAM_BLOCK_ROWS
    chunk = chunk_rows(n)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        at = 0
        for arrays, attrs in _batches(env_cls, cfg, seed, n, blocks, batch):
            if at == 0:
                for k, a in arrays.items():
                    f.create_dataset(k, shape=(rows, *a.shape[1:]), dtype=np.float32,
                                     chunks=(min(chunk, rows), *a.shape[1:]))
                for k, v in _file_attrs(attrs, n, seed).items():
                    f.attrs[k] = v
            m = len(next(iter(arrays.values())))
            for k, a in arrays.items():
                f[k][at:at + m] = a
            at += m
            bar.update(m)
            del arrays  # before the next batch is made: memory holds one batch, not two


def _write_virtual(path: str, parts: list[tuple[str, int, int]], shapes: dict[str, tuple], attrs: dict) -> None:
    """`path`: one virtual dataset per name, joining `parts` [(file, first row, stop row)] by their base names.
    Rows no part holds read as NaN (the fill value), which sagips/io/shard.py refuses, never as silent zeros."""
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for k, shape in shapes.items():
            layout = h5py.VirtualLayout(shape=shape, dtype=np.float32)
            for name, a, b in parts:
                layout[a:b] = h5py.VirtualSource(os.path.basename(name), k, shape=(b - a, *shape[1:]))
            f.create_virtual_dataset(k, layout, fillvalue=np.nan)
        for k, v in attrs.items():
            f.attrs[k] = v
        f.attrs["parts"] = [os.path.basename(name) for name, _, _ in parts]


def write_stream(path: str | os.PathLike, env_cls, cfg: Any, seed: int, n: int, comm=None,
                 batch: int = BATCH_BLOCKS, progress: bool = False) -> list[str]:
    """Write n events of `env_cls` at `cfg`'s truth to `path`; with a communicator of N > 1 ranks, every rank
    writes its part and rank 0 the virtual file. Returns the files this rank wrote. Call it on every rank."""
    from tqdm import tqdm

    path = os.fspath(path)
    size, rank = (comm.size, comm.rank) if comm is not None else (1, 0)
    n_blocks = -(-n // STREAM_BLOCK_ROWS)
    mine = range(rank * n_blocks // size, (rank + 1) * n_blocks // size)  # contiguous; empty where N > blocks
    target = path if size == 1 else part_name(path, rank, size)
    rows = min(n, mine.stop * STREAM_BLOCK_ROWS) - mine.start * STREAM_BLOCK_ROWS
    with tqdm(total=rows, unit="ev", unit_scale=True, dynamic_ncols=True, file=sys.stderr, disable=not progress,
              desc=os.path.basename(target)) as bar:
        if size == 1:
            _write_blocks(path, env_cls, cfg, seed, n, mine, batch, bar)
            return [path]
        err = None
        try:
            if len(mine):
                _write_blocks(target, env_cls, cfg, seed, n, mine, batch, bar)
        except Exception as e:  # every rank learns of it below: no rank waits for a part that will not come
            err = e
    # the ranks agree before the virtual file is written: one that failed leaves no file of the set behind
    errors = comm.allgather(None if err is None else f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                                                     f" (rank {rank})")
    failed = [e for e in errors if e is not None]
    if failed:
        if len(mine) and err is None:
            os.unlink(target)
        if err is not None:
            raise err
        raise DataError(f"{path}: not written: {failed[0]}")
    done = None
    if rank == 0:
        parts = [(part_name(path, r, size), min(n, r * n_blocks // size * STREAM_BLOCK_ROWS),
                  min(n, (r + 1) * n_blocks // size * STREAM_BLOCK_ROWS)) for r in range(size)]
        parts = [p for p in parts if p[2] > p[1]]
        try:
            import h5py

            with h5py.File(parts[0][0], "r") as f:  # shapes and attributes as the parts hold them
                shapes = {k: (n, *f[k].shape[1:]) for k in f}
                attrs = dict(f.attrs)
            _write_virtual(path, parts, shapes, attrs)
        except Exception as e:
            done = f"{path}: the virtual dataset was not written: {str(e).splitlines()[0]}"
    done = comm.bcast(done, root=0)
    if done:
        if len(mine):
            os.unlink(target)
        raise DataError(done)
    mine_files = [target] if len(mine) else []
    return mine_files + [path] if rank == 0 else mine_files
