"""One agreed stop: after a SIGTERM seen by any rank, every rank saves the same epoch and stops.

PBS sends SIGTERM at the wall time, and ranks see it one epoch or more apart. A rank that stopped on its own would
leave the others waiting for it in their next exchange (until the watchdog aborts the job, after PBS's kill delay),
and the ranks' last states would be of different epochs, so that --resume falls back by up to train.state_every.

The agreement costs one nonblocking reduction of one integer per epoch, and never makes a rank wait for a slower one
while nobody asked to stop (rma-arar-arar keeps its tolerance of stragglers):

1. Detect. At the end of every epoch e each rank posts Iallreduce(MAX) of its stop flag (request e, on a duplicate of
   the run's communicator), and tests its outstanding requests in order without waiting. Every rank posts the same
   sequence, so request e completes once every rank has ended epoch e, with the same result everywhere. A rank keeps
   at most `max_ahead` requests outstanding (then it waits for the oldest): ranks that never exchange (ensemble mode)
   drift at most that far apart.
2. Agree on the epoch. The first rank to learn that request k carried a flag is at some epoch j >= k. Each rank, when
   it learns, posts Iallreduce(MAX) of its current epoch and waits for it (under the watchdog): every rank learns
   from the same request k, so each posts exactly once, and the result T is the latest epoch that any rank had reached.
   Ranks behind T train on until T; every rank then saves epoch T and stops. With ranks in step (every synchronous
   mode, and rma-arar-arar without stragglers) T is the signalled rank's epoch + 1 or + 2.
A rank that ends its last epoch before it learns of a stop joins step 2 in `finish` with the last epoch: the run then
simply completes.

Step 2 waits, so a rank must never enter an exchange that waits for other ranks while one of them may be waiting in
step 2 for it (rma-arar-arar, 4 ranks: ranks 0-2 waited in step 2 at epoch 9 while rank 3, which had not yet
learned, waited in the next outer epoch's exchange for them, until the watchdog aborted the job). So before an epoch
that waits for others (`syncs(epoch)`: every epoch of the ring and allreduce modes, rma-arar-arar's outer epochs,
and the epochs whose logged quality is gathered from every rank) a rank completes its outstanding flag reductions
(all ranks posted them), stopping at the first flagged one: it learns of any stop that another rank may be waiting
on before it can block on that rank.

The same reduction carries each rank's newest saved training state (as MAX of its negative): its result is the newest
epoch that every rank holds (`complete`), from which rank 0 writes state/latest.json and every rank knows which of
its old states it may delete (sagips.io.state.RankStates), with no file read.
"""
from __future__ import annotations

from collections import deque

import numpy as np
from mpi4py import MPI

from sagips.comm import watchdog


class StopAgreement:
    def __init__(self, comm: MPI.Comm, timeout_s: float | None, max_ahead: int = 64, syncs=None):
        """syncs(epoch): whether that epoch's exchange may wait for other ranks (None: every epoch, the safe
        choice)."""
        if max_ahead < 1:
            raise ValueError("max_ahead must be >= 1")
        # Collectives match in the order they are posted on a communicator: the per-epoch flags (step 1) and the
        # one reduction of step 2 (posted at different epochs on different ranks) each have their own, and neither is
        # ever matched against the exchange's collectives.
        self.comm, self.agree_comm = comm.Dup(), comm.Dup()
        self.timeout_s, self.max_ahead = timeout_s, max_ahead
        self.syncs = syncs if syncs is not None else (lambda epoch: True)
        self.pending: deque[tuple[int, MPI.Request, np.ndarray, np.ndarray]] = deque()  # (epoch, request, result, sent)
        self.flagged_at: int | None = None  #: the first epoch whose reduction carried a stop flag
        self.target: int | None = None  #: the agreed last epoch (step 2's result)
        self.signalled_at: int | None = None  #: the epoch at whose end this rank first saw its own stop request
        self.complete = 0  #: the newest epoch whose training state every rank had saved (0: none yet)
        self._others = [r for r in range(self.comm.Get_size()) if r != self.comm.Get_rank()]

    def after_epoch(self, epoch: int, requested: bool, saved: int = 0) -> int | None:
        """Call at the end of every epoch with this rank's stop request and the epoch of its newest saved state.
        Returns the agreed last epoch (>= epoch) once it is known, else None. Every rank posts one reduction per
        epoch that it runs, also after the agreement (all ranks then run the same epochs, so that they post the
        same sequence)."""
        if requested and self.signalled_at is None:
            self.signalled_at = epoch
        flag = np.array([1 if requested else 0, -saved], dtype=np.int64)
        res = np.zeros(2, dtype=np.int64)
        # both buffers live in the queue until the request completes (MPI reads and writes them asynchronously)
        self.pending.append((epoch, self.comm.Iallreduce(flag, res, op=MPI.MAX), res, flag))
        learn = self.syncs(epoch + 1)  # the next epoch may wait for other ranks: learn of any stop first
        while self.pending and self.flagged_at is None:
            e, req, res, _ = self.pending[0]
            if learn or len(self.pending) > self.max_ahead:  # (or too far ahead of the slowest rank: wait for it)
                watchdog.wait_all([req], self.timeout_s, "stop agreement", self.comm, epoch, self._others)
            elif not req.Test():
                break
            self.pending.popleft()
            self.complete = max(self.complete, int(-res[1]))
            if res[0]:
                self.flagged_at = e
        if self.flagged_at is not None and self.target is None:
            self.target = self._agree(epoch)
        return self.target

    def _agree(self, epoch: int) -> int:
        mine = np.array([epoch], dtype=np.int64)
        last = np.zeros(1, dtype=np.int64)
        watchdog.wait_all([self.agree_comm.Iallreduce(mine, last, op=MPI.MAX)], self.timeout_s, "stop agreement",
                          self.agree_comm, epoch, self._others)
        return int(last[0])

    def finish(self, epoch: int, saved: int = 0) -> None:
        """At the end of the run (the last epoch, or the agreed stop): complete every request (all ranks posted the
        same ones), join step 2 if a stop was flagged that this rank had not yet seen, reduce the final saved states
        into `complete`, and free the communicators."""
        reqs = [req for _, req, _, _ in self.pending]
        # they complete one by one as the slowest rank ends its epochs (rma-arar-arar lets it lag up to max_ahead):
        # the watchdog restarts at each, so a straggler that still trains is waited for
        watchdog.wait_all(reqs, self.timeout_s, "stop agreement", self.comm, epoch, self._others, progress=True,
                          paired=False)  # (one request per epoch, not per rank)
        for _, _, res, _ in self.pending:
            self.complete = max(self.complete, int(-res[1]))
        if self.target is None and any(res[0] for _, _, res, _ in self.pending):
            self.target = self._agree(epoch)
        self.pending.clear()
        last = np.array([0, -saved], dtype=np.int64)
        res = np.zeros(2, dtype=np.int64)
        watchdog.wait_all([self.comm.Iallreduce(last, res, op=MPI.MAX)], self.timeout_s, "stop agreement", self.comm,
                          epoch, self._others)
        self.complete = max(self.complete, int(-res[1]))
        self.comm.Free()
        self.agree_comm.Free()
