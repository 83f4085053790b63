"""Every wait of the comm layer goes through `wait_all`: a silent hang becomes a loud, attributed abort.

Horovod's most common complaint is the silent hang. Here, a rank that waits longer than `comm.timeout_s` for a
peer writes one line to stderr naming itself, the exchange, the epoch and the peer it waits for, then aborts the
whole job (MPI_Abort), so the batch scheduler sees a failure instead of a job that burns its allocation.

Ranks in messages are ranks of MPI.COMM_WORLD (what mpiexec prints and what a user can find in the logs), even when
the wait happens on a sub-communicator.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from mpi4py import MPI

# the polling policy (spin, yield, sleep with back-off) and why: sagips/comm/waitpolicy.py
from sagips.comm.waitpolicy import MAX_SLEEP_S as _MAX_SLEEP_S
from sagips.comm.waitpolicy import MIN_SLEEP_S as _MIN_SLEEP_S
from sagips.comm.waitpolicy import SPIN_S as _SPIN_S
from sagips.comm.waitpolicy import YIELD_S as _YIELD_S

ABORT_CODE = 3


def world_ranks(comm: MPI.Comm, ranks: Sequence[int]) -> list[int]:
    """Translate ranks of `comm` into ranks of MPI.COMM_WORLD (for messages)."""
    if not ranks:
        return []
    try:
        out = MPI.Group.Translate_ranks(comm.Get_group(), list(ranks), MPI.COMM_WORLD.Get_group())
        return [int(r) for r in out]
    except MPI.Exception:  # pragma: no cover - e.g. an intercommunicator: fall back to local ranks
        return list(ranks)


def wait_all(requests: list[MPI.Request], timeout_s: float | None, what: str, comm: MPI.Comm, epoch: int,
             peers: Sequence[int], progress: bool = False, paired: bool | None = None) -> None:
    """Wait for all `requests`; abort the job if that takes longer than `timeout_s` seconds.

    `peers` are ranks of `comm`: either one per request (peers[i] is the other side of requests[i], so that only the
    peers still missing are named) or simply the ranks involved. `timeout_s` None or <= 0 waits forever. `progress`:
    requests that complete one after another as a slower rank works through its epochs (the stop agreement's end):
    the clock restarts at each completion, so a rank that is slow but alive is waited for, one that stops is not.
    `paired`: whether peers[i] is the other side of requests[i] (None: where their numbers are equal).
    """
    if not requests:
        return
    if timeout_s is None or timeout_s <= 0:
        MPI.Request.Waitall(requests)
        return
    testall, clock = MPI.Request.Testall, time.perf_counter
    if testall(requests):
        return
    start = clock()
    sleep_s = _MIN_SLEEP_S
    done = sum(r == MPI.REQUEST_NULL for r in requests) if progress else 0
    while not testall(requests):
        if progress:
            now_done = sum(r.Test() for r in requests)  # (a completed request is freed: Test() is then true)
            if now_done > done:
                done, start, sleep_s = now_done, clock(), _MIN_SLEEP_S
        waited = clock() - start
        if waited < _SPIN_S:
            continue
        if waited < _YIELD_S:
            os.sched_yield()
            continue
        if waited >= timeout_s:
            _abort(requests, timeout_s, waited, what, comm, epoch, peers, paired)
        time.sleep(sleep_s)
        sleep_s = min(2.0 * sleep_s, _MAX_SLEEP_S)


def _abort(requests, timeout_s, waited_s, what, comm, epoch, peers, paired=None) -> None:
    peers = list(peers)
    if paired if paired is not None else len(peers) == len(requests):
        # Name only the peers whose requests are still pending. Test() frees completed requests: harmless, we abort.
        missing = [p for req, p in zip(requests, peers) if not req.Test()]
        peers = sorted(set(missing)) or sorted(set(peers))
    else:
        peers = sorted(set(peers))
    me = MPI.COMM_WORLD.Get_rank()
    named = world_ranks(comm, peers)
    if not named:
        who = "the other ranks"
    elif len(named) == 1:
        who = f"rank {named[0]}"
    else:  # a barrier over 400 ranks must not print 399 numbers
        who = "ranks " + ", ".join(map(str, named[:8])) + (f", ... ({len(named)} in all)" if len(named) > 8 else "")
    line = f"rank {me} waited {waited_s:.1f} s in {what} (epoch {epoch}) for {who}"
    sys.stderr.write(f"sagips: {line}; aborting the job (comm.timeout_s={timeout_s:g})\n")
    sys.stderr.flush()
    from sagips.io import status

    # run.json's status (docs/reliability.md): written by rank 0 of the run alone where it is among the waiting
    # ranks, which time out together (a write per rank would grow with the ranks)
    status.failed(line, every_rank_raised=True)
    time.sleep(0.5)  # let the launcher forward the line before MPI_Abort tears everything down
    MPI.COMM_WORLD.Abort(ABORT_CODE)


# Blocking collectives done as nonblocking + wait_all, so that they are covered by the watchdog too.

def bcast(comm: MPI.Comm, buf, root: int, *, timeout_s: float | None, what: str, epoch: int = -1) -> None:
    """In-place broadcast of the numpy array `buf` from `root` (Ibcast + wait_all). A rank that waits waits for the
    root; the root waits for the others (which of them MPI cannot tell)."""
    wait_all([comm.Ibcast(buf, root=root)], timeout_s, what, comm, epoch, _awaited(comm, root))


def _awaited(comm: MPI.Comm, root: int) -> list[int]:
    """Whom a rank waits for in a rooted collective: the root, or, on the root, every other rank."""
    me = comm.Get_rank()
    return [root] if me != root else [r for r in range(comm.Get_size()) if r != me]


def barrier(comm: MPI.Comm, *, timeout_s: float | None, what: str, epoch: int = -1) -> None:
    """Barrier over `comm` (Ibarrier + wait_all)."""
    others = [r for r in range(comm.Get_size()) if r != comm.Get_rank()]
    wait_all([comm.Ibarrier()], timeout_s, what, comm, epoch, others)


def allreduce_sum(comm: MPI.Comm, buf, *, timeout_s: float | None, what: str, epoch: int = -1) -> None:
    """In-place sum of the numpy array `buf` over `comm` (Iallreduce + wait_all)."""
    if timeout_s is None or timeout_s <= 0:
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # the plain blocking call: the baseline as users know it
        return
    others = [r for r in range(comm.Get_size()) if r != comm.Get_rank()]
    wait_all([comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)], timeout_s, what, comm, epoch, others)


def gather_json(comm: MPI.Comm, obj, root: int = 0, *, timeout_s: float | None, what: str,
                epoch: int = -1) -> list | None:
    """Gather a JSON-serialisable object from every rank to `root` (a list in rank order there, None elsewhere),
    through nonblocking collectives under the watchdog: a rank that never arrives aborts the job with a message,
    instead of leaving the others blocked in a plain `comm.gather`. No pickles: JSON bytes travel."""
    import json

    import numpy as np

    def builtin(v):  # numpy scalars and arrays (a quality figure may be one) as plain numbers and lists
        if hasattr(v, "tolist"):
            return v.tolist()
        raise TypeError(f"{what}: {type(v).__name__} is not JSON-serialisable")

    raw = np.frombuffer(json.dumps(obj, default=builtin).encode(), dtype=np.uint8)
    size = np.array([raw.size], dtype=np.int64)
    is_root = comm.Get_rank() == root
    sizes = np.zeros(comm.Get_size(), dtype=np.int64) if is_root else None
    peers = _awaited(comm, root)
    wait_all([comm.Igather([size, MPI.INT64_T], [sizes, MPI.INT64_T] if is_root else None, root=root)], timeout_s, what,
             comm, epoch, peers)
    recv = None
    if is_root:
        counts = sizes.astype(np.int64)
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        data = np.empty(int(counts.sum()), dtype=np.uint8)
        recv = [data, (counts.tolist(), displs.tolist()), MPI.BYTE]
    wait_all([comm.Igatherv([raw, MPI.BYTE], recv, root=root)], timeout_s, what, comm, epoch, peers)
    if not is_root:
        return None
    return [json.loads(bytes(data[d:d + c]).decode()) for c, d in zip(counts, displs)]
