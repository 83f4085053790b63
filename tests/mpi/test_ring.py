"""Ring allreduce under mpiexec (pytest-mpi).

    timeout 300 .venv/bin/mpiexec -n 4 .venv/bin/python -m pytest --with-mpi -q -p no:cacheprovider tests/mpi

Every ring is checked against MPI's own Allreduce, on the inner groups of inner sizes 1, 2, 3 and the whole world.
"""
import numpy as np
import pytest
from _helpers import (
    abs_mean_over,
    all_true,
    close_to,
    identical_on_all,
    mean_over,
    rank_buffer,
)
from mpi4py import MPI

from sagips.comm.ring import Ring

SIZES = (1, 7, 51206)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", Ring.ALGORITHMS)
@pytest.mark.parametrize("n", SIZES)
def test_ring_equals_allreduce_and_is_bit_identical(topo, algorithm, n):
    comm = topo.inner
    x = rank_buffer(MPI.COMM_WORLD.Get_rank(), n, seed=n)
    ref, mag = mean_over(comm, x), abs_mean_over(comm, x)
    ring = Ring(comm, n, algorithm, timeout_s=60)

    y = x.copy()
    assert ring.allreduce(y, epoch=1) is y
    assert all_true(comm, close_to(y, ref, mag))
    assert all_true(comm, identical_on_all(comm, y))

    # the sum (average=False), and a second call on the same preallocated buffers gives the same bits
    z = x.copy()
    ring.allreduce(z, average=False, epoch=2)
    assert all_true(comm, close_to(z, ref * comm.Get_size(), mag * comm.Get_size()))
    y2 = x.copy()
    ring.allreduce(y2, epoch=3)
    assert all_true(comm, np.array_equal(y, y2))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", Ring.ALGORITHMS)
def test_weighted_leaders_ring_gives_global_mean(topo, algorithm):
    """Leaders contribute g * group_mean; the weighted ring divides by sum g: the global mean, unequal groups too."""
    n, world = 1031, MPI.COMM_WORLD
    x = rank_buffer(world.Get_rank(), n, seed=5)
    ref, mag = mean_over(world, x), abs_mean_over(world, x)
    group_mean = Ring(topo.inner, n, algorithm, timeout_s=60).allreduce(x.copy())
    if topo.outer is not None:
        Ring(topo.outer, n, algorithm, timeout_s=60).allreduce(group_mean, weight=topo.group_sizes[topo.group_index])
        ok = close_to(group_mean, ref, mag) and identical_on_all(topo.outer, group_mean)
    else:
        ok = True
    assert all_true(world, ok)


@pytest.mark.mpi(min_size=1)
def test_ring_rejects_wrong_buffers():
    ring = Ring(MPI.COMM_WORLD, 4)
    with pytest.raises(TypeError):
        ring.allreduce(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="n=4"):
        ring.allreduce(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        ring.allreduce(np.zeros(8, np.float32)[::2])
    with pytest.raises(ValueError, match="comm.ring"):
        Ring(MPI.COMM_WORLD, 4, "tree")
