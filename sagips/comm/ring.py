"""Nonblocking ring allreduce of one flat float32 buffer (paper IV-B2, Algorithm 1).

    ring = Ring(topo.inner, n=grad_buffer.size, algorithm="whole", timeout_s=300)
    ring.allreduce(grad_buffer, epoch=epoch)          # in place: the mean over the ranks of the ring

Two algorithms, one result contract:
- "whole" (the paper's): N-1 hops; in each hop a rank forwards the whole buffer it received last to its right
  neighbour. Every rank ends up holding all N buffers; they are kept in an (N, n) array indexed by source rank and
  reduced in rank order 0, 1, ..., N-1, so the sum is BIT-IDENTICAL on every rank (a running sum in arrival order
  would add the same numbers in a different order on every rank and differ in the last bits).
  Sends (N-1) x n floats per rank and keeps N x n floats of work memory.
- "chunked" (bandwidth-optimal): reduce-scatter then all-gather over N chunks, 2 (N-1)/N x n floats per rank,
  in place in the caller's buffer. Each chunk is summed (and divided) on one path and then only copied, so the result
  is bit-identical on every rank too. Handles n not divisible by N and n < N (some chunks are then empty).

Weights: rank r may contribute with weight w_r. The result is sum_r(w_r * buf_r) (average=False) or
sum_r(w_r * buf_r) / sum_r(w_r) (average=True). The leaders' ring uses w = group size with buf = group mean: the
exact global mean even when groups differ in size. With all w_r = 1 this is the plain sum or mean. The weights travel
as 8-byte messages beside the data (a weight per hop or per chunk), so the data itself is never copied to make room.

No allocation per call: every work buffer is made in __init__. All waits go through the watchdog.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .watchdog import wait_all

RING_TAG = 0x5A61  # default tag; two rings on the same communicator need different tags


class Ring:
    """Ring allreduce over `comm` of float32 buffers of fixed length `n` (see module docstring)."""

    ALGORITHMS = ("whole", "chunked")

    def __init__(self, comm: MPI.Comm, n: int, algorithm: str = "whole", timeout_s: float | None = None,
                 tag: int = RING_TAG, name: str = "ring"):
        if algorithm not in self.ALGORITHMS:
            raise ValueError(f"comm.ring={algorithm!r} is not one of {self.ALGORITHMS}")
        if n < 0:
            raise ValueError(f"buffer length n={n} must be >= 0")
        self.comm, self.n, self.algorithm = comm, int(n), algorithm
        self.timeout_s, self.tag, self.name = timeout_s, tag, name
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        # the weight tag differs from the data tag: a weight can never be matched by a data receive
        self._wtag = tag + 1
        self._peers = [self.left, self.right, self.left, self.right]  # one per request of a hop (for the watchdog)
        self._w = np.zeros(self.size, np.float64)  # whole: weight of rank s; chunked: partial weight sum of chunk c
        self._w_in = np.zeros(1, np.float64)
        if self.size == 1:
            return
        if algorithm == "whole":
            self._rows = np.zeros((self.size, self.n), np.float32)  # row s: the (weighted) buffer of rank s
            self._sum = np.zeros(self.n, np.float32)
        else:
            # chunk c is buf[bounds[c]:bounds[c+1]]
            self._bounds = [c * self.n // self.size for c in range(self.size + 1)]
            self._tmp = np.zeros(max(b - a for a, b in zip(self._bounds, self._bounds[1:])), np.float32)

    def allreduce(self, buf: np.ndarray, average: bool = True, weight: float = 1.0, epoch: int = -1) -> np.ndarray:
        """In place: buf <- sum_r(w_r buf_r) [/ sum_r(w_r) if average]. Returns buf. Bit-identical on every rank."""
        flat = _check(buf, self.n)
        self.last_weight = float(weight)  # sum of the weights that entered the result (set again below)
        if self.size == 1:
            if not average and weight != 1.0:
                flat *= np.float32(weight)
            return buf  # the mean of one contribution is itself, exactly
        if self.algorithm == "whole":
            self._whole(flat, float(weight), average, epoch)
        else:
            self._chunked(flat, float(weight), average, epoch)
        return buf

    # -- the two algorithms -------------------------------------------------------------------------------------

    def _hop(self, send, recv, send_w, epoch):
        """Send `send` (+ weight view `send_w`) right, receive `recv` (+ weight into _w_in) from the left."""
        comm, tag, wtag = self.comm, self.tag, self._wtag
        reqs = [comm.Irecv(recv, self.left, tag), comm.Isend(send, self.right, tag),
                comm.Irecv(self._w_in, self.left, wtag), comm.Isend(send_w, self.right, wtag)]
        wait_all(reqs, self.timeout_s, self.name, comm, epoch, self._peers)

    def _whole(self, flat, weight, average, epoch):
        rows, w, n_ranks, r = self._rows, self._w, self.size, self.rank
        w[r] = weight
        if weight == 1.0:
            own = flat  # sent and reduced straight from the caller's buffer: no copy
        else:
            own = rows[r]
            np.multiply(flat, np.float32(weight), out=own)
        for hop in range(n_ranks - 1):
            # forward the buffer of rank (r - hop), receive the buffer of rank (r - hop - 1)
            s, q = (r - hop) % n_ranks, (r - hop - 1) % n_ranks
            self._hop(own if s == r else rows[s], rows[q], w[s:s + 1], epoch)
            w[q] = self._w_in[0]
        # Canonical rank order 0..N-1 on every rank -> the same float additions -> bit-identical results.
        out = self._sum
        np.add(own if r == 0 else rows[0], own if r == 1 else rows[1], out=out)
        for s in range(2, n_ranks):
            out += own if s == r else rows[s]
        self.last_weight = float(w.sum())
        if average:
            np.divide(out, np.float32(w.sum() or 1.0), out=flat)  # same order, same bits; 0: all dropped
        else:
            flat[:] = out

    def _chunked(self, flat, weight, average, epoch):
        tmp, b, w, n_ranks, r = self._tmp, self._bounds, self._w, self.size, self.rank
        if weight != 1.0:
            flat *= np.float32(weight)
        w[:] = weight  # partial weight sum of every chunk, accumulated along the chunk's path like its data
        # reduce-scatter: after N-1 steps rank r holds the full sum of chunk (r + 1) % N
        for step in range(n_ranks - 1):
            s, q = (r - step) % n_ranks, (r - step - 1) % n_ranks
            recv = tmp[: b[q + 1] - b[q]]
            self._hop(flat[b[s]:b[s + 1]], recv, w[s:s + 1], epoch)
            flat[b[q]:b[q + 1]] += recv
            w[q] += self._w_in[0]
        mine = (r + 1) % n_ranks
        self.last_weight = float(w[mine])  # every chunk's path sums all N weights: the same total everywhere
        if average:  # only my chunk, once: the all-gather then copies final values, identical everywhere
            flat[b[mine]:b[mine + 1]] /= np.float32(w[mine] or 1.0)
        # all-gather: pass the finished chunks around; they are copied, never re-added
        comm, tag = self.comm, self.tag
        for step in range(n_ranks - 1):
            s, q = (r + 1 - step) % n_ranks, (r - step) % n_ranks
            reqs = [comm.Irecv(flat[b[q]:b[q + 1]], self.left, tag), comm.Isend(flat[b[s]:b[s + 1]], self.right, tag)]
            wait_all(reqs, self.timeout_s, self.name, comm, epoch, self._peers[:2])


def _check(buf: np.ndarray, n: int) -> np.ndarray:
    """The flat float32 view of `buf`, or a loud error (a silent copy would break the in-place contract)."""
    if not isinstance(buf, np.ndarray) or buf.dtype != np.float32:
        raise TypeError(f"exchange buffer must be a float32 numpy array, got {getattr(buf, 'dtype', type(buf))}")
    if buf.size != n:
        raise ValueError(f"exchange buffer has {buf.size} floats, this exchange was built for n={n}")
    if not buf.flags.c_contiguous:
        raise ValueError("exchange buffer must be C-contiguous (it is exchanged in place)")
    return buf.reshape(-1)
