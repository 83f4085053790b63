"""Asynchronous exchange inside an inner group through MPI one-sided windows (paper IV-B3, RMA-ARAR).

    with RmaExchange(topo.inner, n=grad_buffer.size, max_staleness=10) as rma:
        for epoch in range(1, epochs + 1):
            ...
            stats = rma.exchange(grad_buffer, epoch)   # never waits for a slow neighbour

The point: a rank whose pipeline is slow must not hold up its neighbours. Each call a rank
  1. publishes its own gradient into its slot in every peer's window (Put + Flush, or a direct store), and
  2. combines its own gradient with the contributions that have ARRIVED in its own window since it last looked
     (possibly none): buf <- mean(own, fresh contributions).
Nobody waits for anybody; a slow rank's gradient is used by the others when it lands, a fast rank's gradient may be
superseded before a slow reader looks (only the newest contribution of each sender is used).

Window layout (allocated once, over the inner communicator). Every rank's window holds, for every sender s, two
slots (double-buffered by epoch parity, so that a reader that meets the slot of epoch e being rewritten still finds
the complete slot of epoch e-1 beside it):

    slot = [header: epoch, crc32, n, 0 (int64 x 4)] [payload: n float32, padded to 8 bytes] [trailer: epoch (int64)]

Reading rules, per sender s, newest slot first:
  - used at most once: only a slot whose epoch is newer than the last epoch used from s is considered;
  - never torn: the slot is first copied to a private snapshot, then the header epoch must equal the trailer epoch,
    n must match and crc32(payload) must equal the header's crc. Otherwise the read is torn (a write was landing):
    it is skipped and counted (the other parity slot is tried), and the slot will be looked at again next call;
  - never too stale: a contribution with epoch - sender_epoch > max_staleness is dropped and counted.

Two backends, one protocol:
  - "shared": MPI.Win.Allocate_shared when the group is on one node (the normal case: an inner group IS a node).
    A rank writes into its peers' windows with plain stores and MPI.Win.Sync as the memory barrier. No data movement
    depends on MPI progress, so a peer that is busy (sleeping in its pipeline, computing on the GPU) cannot delay
    anybody.
  - "allocate": MPI.Win.Allocate + Put + Flush(target), for groups that span nodes (comm.inner_size larger than a
    node). With a netmod that implements Put in software (MPICH ch4:ofi over tcp, measured in docs/modes.md), the
    Flush to a peer that is not inside an MPI call blocks until that peer calls MPI: run with MPICH_ASYNC_PROGRESS=1
    there.
Both keep one passive-target epoch open for the object's lifetime: Lock_all(MPI.MODE_NOCHECK) in __init__, and
Unlock_all before Free in free().
"""
from __future__ import annotations

import zlib

import numpy as np
from mpi4py import MPI

from . import watchdog
from .ring import _check

_HEADER = 32         # bytes: epoch, crc32, n, reserved (int64 each)
_TRAILER = 8         # bytes: epoch again (the commit stamp)
_EMPTY = -1          # epoch of a slot that was never written
_MAX_PUT = 1 << 24   # bytes per Put: some networks limit the size of one RDMA operation; chunk above this


def _is_node_local(comm: MPI.Comm) -> bool:
    """True if all ranks of `comm` share one node (collective over `comm`)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return comm.allreduce(node.Get_size() == comm.Get_size(), op=MPI.LAND)
    finally:
        node.Free()


class RmaExchange:
    """Asynchronous mean of a float32 buffer of length `n` inside `comm` (see module docstring).

    Owns an MPI window: call free() (collective, same order on every rank, before freeing `comm`) or use it as a
    context manager. Use after free raises RuntimeError.
    """

    BACKENDS = ("auto", "shared", "allocate")

    def __init__(self, comm: MPI.Comm, n: int, max_staleness: int, timeout_s: float | None = None,
                 backend: str = "auto"):
        if backend not in self.BACKENDS:
            raise ValueError(f"RMA backend {backend!r} is not one of {self.BACKENDS}")
        if max_staleness < 0:
            raise ValueError(f"comm.max_staleness={max_staleness} must be >= 0")
        self.comm, self.n, self.max_staleness, self.timeout_s = comm, int(n), int(max_staleness), timeout_s
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        if backend == "auto":
            backend = "shared" if _is_node_local(comm) else "allocate"
        self.backend = backend

        payload = (4 * self.n + 7) // 8 * 8
        self._slot_bytes = _HEADER + payload + _TRAILER
        nbytes = self.size * 2 * self._slot_bytes  # a slot per (sender, parity)
        if backend == "shared":
            self._win = MPI.Win.Allocate_shared(nbytes, 1, comm=comm)
            # Direct views of every peer's window memory (the same physical pages): stores go straight there.
            self._peer_mem = [np.frombuffer(self._win.Shared_query(p)[0], np.uint8) for p in range(self.size)]
            self._local = self._peer_mem[self.rank]
        else:
            self._win = MPI.Win.Allocate(nbytes, 1, comm=comm)
            self._local = np.frombuffer(self._win.tomemory(), np.uint8)
        # Reading our own window while remote Puts may land. In the UNIFIED memory model (MPICH and Open MPI on
        # cache-coherent machines; always for shared windows) the public and private copies are the same memory:
        # MPI.Win.Sync() (a memory barrier inside the lock_all epoch) makes every Put completed before it visible to
        # our loads. In the SEPARATE model a local load may not see remote Puts at all, so we Get from ourselves.
        # A Put landing WHILE we load gives undefined bytes, never a crash: the checksum catches those (torn).
        self._unified = backend == "shared" or self._win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_UNIFIED
        # One passive-target epoch for the lifetime: no Lock/Unlock per operation (slow), NOCHECK because nobody
        # ever takes an exclusive lock on this window.
        self._win.Lock_all(MPI.MODE_NOCHECK)

        # Preallocated: the image of my outgoing slot, a snapshot for reading one slot, the accumulator.
        self._out = np.zeros(self._slot_bytes, np.uint8)
        self._snap = np.zeros(self._slot_bytes, np.uint8)
        self._acc = np.zeros(self.n, np.float32)
        self._out_head, self._out_payload, self._out_trail = self._views(self._out)
        self._snap_head, self._snap_payload, self._snap_trail = self._views(self._snap)
        self._last_used = [_EMPTY] * self.size  # per sender: the epoch of the last contribution used (or dropped)

        # Mark all my slots empty before anybody may write into them (local stores into my own window memory, made
        # public by Win.Sync in either memory model), then agree on it.
        self._local[:] = 0
        for s in range(self.size):
            for parity in (0, 1):
                off = self._offset(s, parity)
                self._local[off:off + 8].view(np.int64)[0] = _EMPTY
        self._win.Sync()
        watchdog.barrier(comm, timeout_s=timeout_s, what="rma window setup")

    # -- public API -----------------------------------------------------------------------------------------------

    def exchange(self, buf: np.ndarray, epoch: int, average: bool = True) -> dict:
        """Publish `buf` (mine at `epoch`), then buf <- mean(own, fresh contributions). Returns the rma stats."""
        self.publish(buf, epoch)
        return self.combine(buf, epoch, average)

    def publish(self, buf: np.ndarray, epoch: int) -> None:
        """Write my gradient of `epoch` into my slot (parity epoch % 2) in every peer's window."""
        self._check_alive()
        flat = _check(buf, self.n)
        self._out_payload[:] = flat
        self._out_head[0] = self._out_trail[0] = epoch
        self._out_head[1] = zlib.crc32(self._out_payload)
        self._out_head[2] = self.n
        off = self._offset(self.rank, epoch % 2)
        peers = [p for p in range(self.size) if p != self.rank]
        if self.backend == "shared":
            for p in peers:
                self._peer_mem[p][off:off + self._slot_bytes] = self._out  # plain stores into p's window
            self._win.Sync()  # memory barrier: the stores are visible before anything I do next
        else:
            for p in peers:
                for a in range(0, self._slot_bytes, _MAX_PUT):
                    b = min(a + _MAX_PUT, self._slot_bytes)
                    self._win.Put([self._out[a:b], MPI.BYTE], p, target=(off + a, b - a, MPI.BYTE))
            for p in peers:
                # Remote completion (the bytes are in p's memory) before _out may be reused by the next publish.
                # NB: with software RMA (MPICH ch4:ofi over tcp) this blocks until p enters MPI; Flush_local blocks
                # just the same (measured, docs/modes.md). Node-local groups use the "shared" backend instead.
                self._win.Flush(p)

    def combine(self, buf: np.ndarray, epoch: int, average: bool = True) -> dict:
        """buf <- own + fresh contributions (their mean if `average`). Never waits. Returns the rma stats."""
        self._check_alive()
        flat = _check(buf, self.n)
        stats = {"rma_used": 0, "rma_stale": 0, "rma_torn": 0}
        self._win.Sync()  # make Puts/stores completed by peers visible to my loads (see __init__)
        acc = self._acc
        for s in range(self.size):  # sender order is fixed, so the sum is reproducible for the same inputs
            if s == self.rank:
                continue
            # newest first; an older parity slot is the fallback when the newest is being rewritten
            cands = sorted(((self._local_header(s, p)[0], p) for p in (0, 1)), reverse=True)
            for seen_epoch, parity in cands:
                if seen_epoch <= self._last_used[s]:
                    break  # nothing fresh (the other slot is older still)
                sender_epoch = self._read_slot(s, parity)
                if sender_epoch is None:
                    stats["rma_torn"] += 1
                    continue
                if sender_epoch <= self._last_used[s]:
                    break
                self._last_used[s] = sender_epoch  # used or dropped: never looked at again
                if epoch - sender_epoch > self.max_staleness:
                    stats["rma_stale"] += 1
                else:
                    if stats["rma_used"] == 0:
                        np.add(flat, self._snap_payload, out=acc)
                    else:
                        acc += self._snap_payload
                    stats["rma_used"] += 1
                break
        if stats["rma_used"]:  # nothing fresh: buf is left as it is (own gradient only)
            if average:
                np.divide(acc, np.float32(1 + stats["rma_used"]), out=flat)
            else:
                flat[:] = acc
        return stats

    def consumed(self, epoch: int) -> None:
        """Every contribution of `epoch` or earlier is spent: an outer epoch replaced every buffer of the group with the
        global mean, which holds what the leader had read by then. A peer's slot of such an epoch, still unread here,
        must not be added again at a later epoch (it would count twice, or as a gradient of the old weights)."""
        self._last_used = [max(e, epoch) for e in self._last_used]

    def barrier(self) -> None:
        """Barrier over the group, through the watchdog (tests: make every rank 'on time')."""
        self._check_alive()
        watchdog.barrier(self.comm, timeout_s=self.timeout_s, what="rma barrier")

    def free(self) -> None:
        """Close the lock_all epoch and free the window. Collective; idempotent."""
        if self._win is None:
            return
        win, self._win = self._win, None
        self._peer_mem = self._local = None  # views into memory that Free releases: drop them first
        win.Unlock_all()  # a window still locked at Free (or never freed) hangs MPI_Finalize
        win.Free()

    @property
    def freed(self) -> bool:
        return self._win is None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    # -- slots ----------------------------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._win is None:
            raise RuntimeError("RmaExchange used after free(): its MPI window no longer exists")

    def _offset(self, sender: int, parity: int) -> int:
        return (2 * sender + parity) * self._slot_bytes

    def _views(self, slot: np.ndarray):
        head = slot[:_HEADER].view(np.int64)
        payload = slot[_HEADER:_HEADER + 4 * self.n].view(np.float32)
        trail = slot[self._slot_bytes - _TRAILER:].view(np.int64)
        return head, payload, trail

    def _local_header(self, sender: int, parity: int) -> np.ndarray:
        off = self._offset(sender, parity)
        if self._unified:
            return self._local[off:off + _HEADER].view(np.int64)
        head = np.empty(_HEADER // 8, np.int64)  # SEPARATE model only (not seen with MPICH or Open MPI on CPUs)
        self._win.Get([head, MPI.BYTE], self.rank, target=(off, _HEADER, MPI.BYTE))
        self._win.Flush(self.rank)
        return head

    def _read_slot(self, sender: int, parity: int) -> int | None:
        """Copy the slot into the snapshot and verify it. Returns the sender's epoch, or None if torn."""
        off = self._offset(sender, parity)
        if self._unified:
            self._snap[:] = self._local[off:off + self._slot_bytes]
        else:
            self._win.Get([self._snap, MPI.BYTE], self.rank, target=(off, self._slot_bytes, MPI.BYTE))
            self._win.Flush(self.rank)
        return check_slot(self._snap_head, self._snap_payload, self._snap_trail, self.n)


def check_slot(head: np.ndarray, payload: np.ndarray, trail: np.ndarray, n: int) -> int | None:
    """The epoch of a consistent snapshot of a slot, or None (torn, empty or foreign)."""
    epoch = int(head[0])
    if epoch == _EMPTY or int(trail[0]) != epoch or int(head[2]) != n:
        return None
    if zlib.crc32(payload) != int(head[1]):
        return None
    return epoch
