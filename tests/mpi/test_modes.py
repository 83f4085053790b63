"""Every mode of build_exchange under mpiexec, on distinct per-rank buffers, for inner sizes 1, 2, 3 and world.

Outer epoch semantics under test: on an outer epoch arar-arar gives every rank the global mean, i.e. the same as
arar (up to float rounding); between outer epochs it gives the group mean.
"""
import numpy as np
import pytest
from _helpers import (
    abs_mean_over,
    all_true,
    barrier,
    close_to,
    identical_on_all,
    mean_over,
    rank_buffer,
    sum_over,
)
from mpi4py import MPI

from sagips.comm.modes import MODES, build_exchange

N_FLOATS = 51206


def _run(mode, topo, epoch, ring="whole", **kw):
    x = rank_buffer(MPI.COMM_WORLD.Get_rank(), N_FLOATS, seed=11)
    ex = build_exchange(mode, topo, N_FLOATS, ring=ring, timeout_s=60, **kw)
    y = x.copy()
    stats = ex(y, epoch)
    ex.free()
    return x, y, stats


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("ring", ["whole", "chunked"])
@pytest.mark.parametrize("mode", ["allreduce", "arar"])
def test_flat_modes_give_the_global_mean(topo, mode, ring):
    world = MPI.COMM_WORLD
    x, y, _ = _run(mode, topo, 1, ring)
    ok = close_to(y, mean_over(world, x), abs_mean_over(world, x))
    if mode == "arar":
        ok = ok and identical_on_all(world, y)
    assert all_true(world, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("ring", ["whole", "chunked"])
def test_arar_arar_outer_epoch_equals_arar(topo, ring):
    """outer_every=1: every epoch is an outer epoch -> the global mean, identical bits on every rank."""
    world = MPI.COMM_WORLD
    x, y, stats = _run("arar-arar", topo, 1, ring, outer_every=1)
    _, y_arar, _ = _run("arar", topo, 1, ring)
    mag = abs_mean_over(world, x)
    ok = stats.get("outer") == 1 and close_to(y, mean_over(world, x), mag) and close_to(y, y_arar, mag)
    assert all_true(world, ok and identical_on_all(world, y))


@pytest.mark.mpi(min_size=1)
def test_arar_arar_between_outer_epochs_gives_the_group_mean(topo):
    world = MPI.COMM_WORLD
    x, y, stats = _run("arar-arar", topo, 999, outer_every=1000)
    ok = "outer" not in stats and close_to(y, mean_over(topo.inner, x), abs_mean_over(topo.inner, x))
    ok = ok and identical_on_all(topo.inner, y)
    assert all_true(world, ok)


@pytest.mark.mpi(min_size=1)
def test_ensemble_leaves_the_buffer_alone(topo):
    x, y, stats = _run("ensemble", topo, 1)
    assert stats == {} and np.array_equal(x, y)


@pytest.mark.mpi(min_size=1)
def test_rma_arar_arar(topo):
    """Between outer epochs: mean of own + a subset of the group, every peer used within two on-time epochs.
    On an outer epoch: one identical buffer everywhere, built from every group (a global exchange happened)."""
    world, inner = MPI.COMM_WORLD, topo.inner
    g, rank = inner.Get_size(), world.Get_rank()
    # one-hot payloads: rank r puts 1.0 at index r, so sum * (1 + used) shows exactly whose gradients were used
    x = np.zeros(N_FLOATS, np.float32)
    x[rank] = 1.0
    ex = build_exchange("rma-arar-arar", topo, N_FLOATS, outer_every=1000, max_staleness=5, timeout_s=60)
    used, ok = 0, True
    for epoch in (1, 2):
        y = x.copy()
        stats = ex(y, epoch)
        used += stats["rma_used"]
        summed = y * (1 + stats["rma_used"])
        members = topo.groups[topo.group_index]
        ok = ok and summed[rank] == 1.0 and np.isclose(summed.sum(), 1 + stats["rma_used"])
        ok = ok and set(np.flatnonzero(np.round(summed))) <= set(members)  # nothing from other groups
        barrier()  # on time for the next epoch: every epoch-1 contribution has landed
    ok = ok and used >= g - 1  # a mode that exchanged nothing fails here
    # an outer epoch: identical everywhere, and (with several groups) it carries every group's leader
    y = x.copy()
    stats = ex(y, 1000)
    ex.free()
    ok = ok and stats.get("outer") == 1 and identical_on_all(world, y)
    leaders = [grp[0] for grp in topo.groups]
    ok = ok and bool(np.all(y[leaders] > 0))
    assert all_true(world, ok)
    assert sum_over(world, used) >= world.Get_size() - topo.n_groups


@pytest.mark.mpi(min_size=1)
def test_unknown_mode_is_an_error(topo):
    assert len(MODES) == 6
    with pytest.raises(ValueError, match="mode='horovod'"):
        build_exchange("horovod", topo, 4)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["allreduce", "arar", "arar-arar", "rma-arar-arar"])
def test_a_dropped_rank_is_left_out_of_the_mean(topo, mode):
    """weight=0 (a NaN/Inf gradient, zeroed by the trainer): the others get the mean of the others only."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    bad = 1
    x = rank_buffer(rank, N_FLOATS, seed=5)
    if rank == bad:
        x[:] = 0.0
    ex = build_exchange(mode, topo, N_FLOATS, timeout_s=60, outer_every=1)
    if mode == "rma-arar-arar":
        # everybody on time (the exact case): every good rank publishes before anybody combines; the exchange's own
        # publish then rewrites the same slot with the same bytes
        if rank != bad:
            ex.inner.rma.publish(x, 1)
        barrier(world)
    y = x.copy()
    ex(y, 1, weight=0.0 if rank == bad else 1.0)
    ex.free()
    good = np.array([0.0 if rank == bad else 1.0], np.float64)
    n_good = world.allreduce(good[0])
    expected = mean_over(world, x) * np.float32(world.Get_size() / n_good)  # x is zero on the dropped rank
    # the mean of the good ranks only: a rank that had counted the dropped rank's zeros would be off by n/(n-1)
    ok = close_to(y, expected, abs_mean_over(world, x))
    assert all_true(world, ok)
