"""One copy of the reference data per node (config `data.share: node`, issue 23): the ranks of one node hold the
node's subset in one MPI shared-memory window and bootstrap from it.

    node, index = split_nodes(comm)                           # the ranks of my node (COMM_TYPE_SHARED), numbered
    layout, ranges = shard.plan_subset(world, path, datasets, shard.node_seed(seed, member, index), fraction, mode)
    data = NodeData(node, ranges, datasets, world, shard.reader(path, layout, datasets))  # every rank fills a part
    env.attach_subset(data.arrays, layout["attrs"])           # numpy views of the window: no copy
    ...
    data.free()                                               # collective over the node, after the last use

The node's subset is one subset, keyed like a rank's (seed, member, node index, fraction, mode, layout) but with
`shard.node_seed`: round(fraction x N) rows for the whole node. Node rank 0 allocates the window (the other ranks
allocate 0 bytes and map rank 0's segment through `Shared_query`); each of the node's s ranks reads 1/s of the rows
straight from the file into the window (parallel reads, no copy through a private buffer), and a barrier on the
node ends the reads before anyone trains. The data never changes afterwards, so no RMA epoch stays open.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from sagips.io.refdata import DataError
from sagips.io.shard import agree, rows_between


def split_nodes(comm: MPI.Comm) -> tuple[MPI.Comm, int]:
    """(the ranks of `comm` on my node, ordered by their rank in `comm`; the node's index). Nodes are numbered by
    their lowest rank in `comm`, the same on every rank whatever colours Split_type chose (sagips/comm/topology.py
    numbers inner groups the same way). Collective over `comm`; the caller owns the node communicator."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    first = node.bcast(comm.Get_rank(), root=0)
    firsts = sorted(set(comm.allgather(first)))
    return node, firsts.index(first)


class NodeData:
    """The rows `ranges` of each of `datasets` (float32, (rows, columns), in file order), held once per node in an
    MPI shared-memory window over `node`: `arrays` maps each dataset to a view of it. `fill(part, out)` puts the rows
    `part` (ranges) into the arrays `out`; each rank of the node fills 1/size of the rows, and a DataError that it
    raises on any rank is raised on every rank of `comm`.

    Owns the window and `node` (it frees both): call free() on every rank of `node`, in the same order as the other
    collective frees, once nothing uses `arrays` any more (the views point into memory that Free releases). Use after
    free raises RuntimeError. Collective over `node` (construction and free) and over `comm` (the read errors, which
    every rank of `comm` raises as one DataError)."""

    def __init__(self, node: MPI.Comm, ranges: np.ndarray, datasets: dict[str, int], comm: MPI.Comm,
                 fill: Callable[[np.ndarray, dict[str, np.ndarray]], object]):
        self.node = node
        self.rows = int((ranges[:, 1] - ranges[:, 0]).sum())
        self.nbytes = self.rows * sum(datasets.values()) * 4  # the node's one copy, all datasets
        # only node rank 0 allocates (one segment per node); the others map it. disp_unit 4: float32 units
        self._win = MPI.Win.Allocate_shared(self.nbytes if node.Get_rank() == 0 else 0, 4, comm=node)
        buf, _ = self._win.Shared_query(0)
        flat = np.frombuffer(buf, dtype=np.float32, count=self.nbytes // 4)
        self._arrays: dict[str, np.ndarray] = {}
        offset = 0
        for name, cols in datasets.items():  # each dataset contiguous, one after the other
            self._arrays[name] = flat[offset:offset + self.rows * cols].reshape(self.rows, cols)
            offset += self.rows * cols
        lo, hi = (self.rows * x // node.Get_size() for x in (node.Get_rank(), node.Get_rank() + 1))
        mine = {name: a[lo:hi] for name, a in self._arrays.items()}
        # stores into the window by this process, loads by the others: Win.Sync (a memory barrier) on both sides of
        # the node's barrier, inside a passive-target epoch (the MPI-3 pattern for load/store in shared windows)
        self._win.Lock_all(MPI.MODE_NOCHECK)
        try:
            agree(comm, fill, rows_between(ranges, lo, hi), mine)
        except DataError:
            self._win.Unlock_all()
            self.free()  # every rank raised it here (agree): the collective free is safe
            raise
        self._win.Sync()
        node.Barrier()
        self._win.Sync()
        self._win.Unlock_all()

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        if self._win is None:
            raise RuntimeError("NodeData used after free()")
        return self._arrays

    def allocated_bytes(self) -> list[int]:
        """Bytes that each rank of the node allocated in the window, as MPI reports them (rank 0: all of them)."""
        if self._win is None:
            raise RuntimeError("NodeData used after free()")
        return [len(self._win.Shared_query(r)[0]) for r in range(self.node.Get_size())]

    def free(self) -> None:
        """Free the window, then the node communicator (collective over the node). Idempotent."""
        if self._win is None:
            return
        self._arrays = {}  # views into memory that Free releases: drop them first
        win, self._win = self._win, None
        win.Free()
        self.node.Free()
