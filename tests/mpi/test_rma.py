"""RMA exchange under mpiexec: exact when on time, never torn / double-counted / too stale, never waits, freed.

Both window backends are tested ("shared": Allocate_shared + stores; "allocate": Allocate + Put + Flush).
"""
import time

import numpy as np
import pytest
from _helpers import (
    INNER_SIZES,
    abs_mean_over,
    all_true,
    close_to,
    inner_size_or_skip,
    mean_over,
    rank_buffer,
    sum_over,
)
from mpi4py import MPI

import sagips.comm.rma as rma_mod
from sagips.comm.rma import RmaExchange
from sagips.comm.topology import build_topology

BACKENDS = ("shared", "allocate")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("param", INNER_SIZES, ids=lambda p: f"inner{p}")
def test_on_time_equals_exact_mean(param, backend):
    """With a barrier between publish and read, every contribution has arrived: the result is the exact mean."""
    k = inner_size_or_skip(param)
    if k is None:
        pytest.skip("inner size larger than the world")
    topo = build_topology(MPI.COMM_WORLD, k)
    n, ok = 51206, True
    with RmaExchange(topo.inner, n, max_staleness=2, timeout_s=60, backend=backend) as ex:
        for epoch in range(1, 4):
            x = rank_buffer(MPI.COMM_WORLD.Get_rank(), n, seed=epoch)
            ref, mag = mean_over(topo.inner, x), abs_mean_over(topo.inner, x)
            ex.publish(x, epoch)
            ex.barrier()
            stats = ex.combine(x, epoch)
            ex.barrier()  # nobody publishes epoch+2 (same parity slot) before everybody has read epoch
            ok = ok and close_to(x, ref, mag) and stats == {"rma_used": topo.inner.Get_size() - 1,
                                                            "rma_stale": 0, "rma_torn": 0}
    topo.free()
    assert all_true(MPI.COMM_WORLD, ok)


def _payload(rank, size, n, epoch):
    """Sender `rank` fills its own region with rank*1000 + epoch, zeros elsewhere: a sum stays decodable."""
    x = np.zeros(n, np.float32)
    region = n // size
    x[rank * region:(rank + 1) * region] = rank * 1000 + epoch
    return x


def _decode(x, size, n):
    """Per sender: the epoch of its contribution in the sum `x` (0: none), or -1 if the region is not one clean
    contribution (torn: mixed values; double-counted: a value that is not s*1000 + e with 1 <= e < 1000)."""
    region, out = n // size, []
    for s in range(size):
        part = x[s * region:(s + 1) * region]
        v = float(part[0])
        if not np.all(part == part[0]):
            out.append(-1)
        elif v == 0:
            out.append(0)
        else:
            e = v - 1000 * s
            out.append(int(e) if 1 <= e < 1000 and e == int(e) else -1)
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", BACKENDS)
def test_straggler_does_not_hold_up_the_others(backend):
    """Rank 1 sleeps `delay` per epoch in the first epochs (its pipeline is slow); the others do not wait for it,
    and no contribution is used torn, twice, or older than max_staleness."""
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    n, epochs, slow_epochs, delay, work, max_staleness = 8 * 1024, 14, 5, 0.2, 0.01, 3
    used_epochs = {s: [] for s in range(size)}
    ok, slow_phase_s, stats_sum = True, 0.0, {"rma_used": 0, "rma_stale": 0, "rma_torn": 0}
    with RmaExchange(comm, n, max_staleness=max_staleness, timeout_s=60, backend=backend) as ex:
        ex.barrier()
        t0 = time.perf_counter()
        for epoch in range(1, epochs + 1):
            time.sleep(delay if (rank == 1 and epoch <= slow_epochs) else work)  # the pipeline
            x = _payload(rank, size, n, epoch)
            stats = ex.exchange(x, epoch, average=False)
            for key in stats_sum:
                stats_sum[key] += stats[key]
            got = _decode(x, size, n)
            ok = ok and got[rank] == epoch and -1 not in got
            for s, e in enumerate(got):
                if s != rank and e > 0:
                    used_epochs[s].append(e)
                    ok = ok and epoch - e <= max_staleness  # never too stale
            ok = ok and stats["rma_used"] == sum(1 for s, e in enumerate(got) if s != rank and e > 0)
            if epoch == slow_epochs:
                slow_phase_s = time.perf_counter() - t0
        ex.barrier()
    for s, es in used_epochs.items():  # each contribution used at most once, in order
        ok = ok and es == sorted(set(es))
    if rank != 1:
        # A ring would take >= slow_epochs * delay = 1.0 s here; the fast ranks only pay their own work.
        ok = ok and slow_phase_s < 0.5 * slow_epochs * delay
    assert all_true(comm, ok)
    # A mode that exchanged nothing must fail: the fast ranks did use each other's (and the straggler's) gradients.
    total_used = sum_over(comm, stats_sum["rma_used"])
    assert total_used >= size - 1


@pytest.mark.mpi(min_size=2)
def test_torn_slot_is_skipped_and_counted(monkeypatch):
    """Rank 0 publishes a slot whose checksum does not match its payload: every reader skips and counts it."""
    comm = MPI.COMM_WORLD
    n, rank = 1000, comm.Get_rank()
    ok = True
    with RmaExchange(comm, n, max_staleness=5, backend="allocate") as ex:
        x = np.full(n, rank + 1, np.float32)
        if rank == 0:  # corrupt the checksum of this one publish
            monkeypatch.setattr(rma_mod.zlib, "crc32", lambda b: 12345)
        ex.publish(x, 1)
        monkeypatch.undo()
        ex.barrier()
        stats = ex.combine(x, 1, average=False)
        ex.barrier()
        if rank != 0:
            ok = stats["rma_torn"] == 1 and stats["rma_used"] == comm.Get_size() - 2
            ok = ok and np.all(x == sum(r + 1 for r in range(1, comm.Get_size())))  # nothing of rank 0 in it
        # the next, sound publish of rank 0 is used
        x = np.full(n, rank + 1, np.float32)
        ex.publish(x, 2)
        ex.barrier()
        stats = ex.combine(x, 2, average=False)
        ex.barrier()
        ok = ok and stats["rma_torn"] == 0 and np.all(x == sum(r + 1 for r in range(comm.Get_size())))
    assert all_true(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_stale_contribution_is_dropped_and_counted():
    comm = MPI.COMM_WORLD
    n, rank = 100, comm.Get_rank()
    with RmaExchange(comm, n, max_staleness=2, backend="shared") as ex:
        x = np.full(n, rank + 1, np.float32)
        if rank == 1:
            ex.publish(x, 1)  # rank 1 publishes epoch 1 ...
        ex.barrier()
        stats = ex.combine(x, 10)  # ... which everybody else reads at epoch 10: 9 epochs old > 2
        ok = rank == 1 or (stats["rma_stale"] == 1 and stats["rma_used"] == 0 and np.all(x == rank + 1))
        ex.barrier()
    assert all_true(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("backend", BACKENDS)
def test_window_is_freed_and_use_after_free_raises(backend):
    comm = MPI.COMM_WORLD
    ex = RmaExchange(comm, 16, max_staleness=1, backend=backend)
    x = np.ones(16, np.float32)
    ex.exchange(x, 1)
    ex.barrier()
    ex.free()
    ex.free()  # idempotent
    assert ex.freed
    with pytest.raises(RuntimeError, match="after free"):
        ex.exchange(x, 2)
    with pytest.raises(RuntimeError, match="after free"):
        ex.barrier()
    with RmaExchange(comm, 16, max_staleness=1, backend=backend) as ex2:
        ex2.exchange(x, 1)
    assert ex2.freed


@pytest.mark.mpi(min_size=1)
def test_check_slot_rejects_torn_and_foreign_slots():
    """The slot verification alone: payload, header epoch, trailer epoch and n must all agree."""
    n = 10
    payload = np.arange(n, dtype=np.float32)
    head = np.array([7, rma_mod.zlib.crc32(payload), n, 0], np.int64)
    trail = np.array([7], np.int64)
    assert rma_mod.check_slot(head, payload, trail, n) == 7
    torn = payload.copy()
    torn[3] = -1  # half of a newer write landed
    assert rma_mod.check_slot(head, torn, trail, n) is None
    assert rma_mod.check_slot(head, payload, np.array([5], np.int64), n) is None  # trailer of another epoch
    assert rma_mod.check_slot(head, payload, trail, n + 1) is None                # built for another size
    empty = np.array([-1, rma_mod.zlib.crc32(payload), n, 0], np.int64)
    assert rma_mod.check_slot(empty, payload, np.array([-1], np.int64), n) is None


@pytest.mark.mpi(min_size=2)
def test_a_slot_spent_by_an_outer_epoch_is_not_added_again():
    """Issue 21, item 7: after an outer epoch e every buffer holds the global mean; a peer's slot of epoch e that was
    still unread here must not be added at e + 1 (it would count twice)."""
    comm = MPI.COMM_WORLD
    n, rank = 100, comm.Get_rank()
    with RmaExchange(comm, n, max_staleness=10, backend="shared") as ex:
        x = np.full(n, rank + 1, np.float32)
        if rank == 1:
            ex.publish(x, 2)  # rank 1's epoch-2 gradient lands in everybody's window ...
        ex.barrier()
        ex.consumed(2)  # ... and the outer epoch 2 spends it (the leader's global mean holds it)
        y = x.copy()
        stats = ex.combine(y, 3)  # at epoch 3 nothing is fresh: rank 1 has not published epoch 3 yet
        ok = rank == 1 or (stats["rma_used"] == 0 and np.all(y == x))
        ex.barrier()
        if rank == 1:
            ex.publish(x, 3)  # a newer slot is used as before
        ex.barrier()
        stats = ex.combine(y, 3)
        ok = ok and (rank == 1 or stats["rma_used"] == 1)
        ex.barrier()
    assert all_true(comm, ok)
