"""Topology under mpiexec: groups, leaders, numbering, sub-communicators, errors."""
import json

import pytest
from _helpers import INNER_SIZES, all_true, inner_size_or_skip
from mpi4py import MPI

from sagips.comm.topology import build_topology


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("param", INNER_SIZES, ids=lambda p: f"inner{p}")
def test_fixed_inner_size_layout(param):
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    k = inner_size_or_skip(param)
    if k is None:
        pytest.skip("inner size larger than the world")
    topo = build_topology(world, k)
    expected = [list(range(s, min(s + k, size))) for s in range(0, size, k)]  # the last group may be smaller
    ok = (topo.describe()["groups"] == expected
          and topo.group_sizes == [len(g) for g in expected]
          and topo.n_groups == len(expected)
          and topo.group_index == rank // k
          and topo.inner.Get_size() == len(expected[rank // k])
          and topo.is_leader == (rank % k == 0)
          and (topo.outer is None) != topo.is_leader)
    if topo.outer is not None:  # the outer rank of a leader is its group index
        ok = ok and topo.outer.Get_rank() == topo.group_index and topo.outer.Get_size() == topo.n_groups
    assert all_true(world, ok)
    json.dumps(topo.describe())
    topo.free()
    topo.free()  # idempotent


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("inner_size", [None, 0])
def test_node_split_is_one_group_on_one_machine(inner_size):
    world = MPI.COMM_WORLD
    topo = build_topology(world, inner_size)
    ok = topo.n_groups == 1 and topo.group_index == 0 and topo.inner.Get_size() == world.Get_size()
    ok = ok and topo.describe()["groups"] == [list(range(world.Get_size()))]
    assert all_true(world, ok)
    topo.free()


@pytest.mark.mpi(min_size=2)
def test_topology_of_a_sub_communicator():
    """An ensemble member: the topology of a Split of COMM_WORLD, in that communicator's ranks."""
    world = MPI.COMM_WORLD
    member = world.Split(color=world.Get_rank() % 2, key=world.Get_rank())
    topo = build_topology(member, 1)
    ok = topo.n_groups == member.Get_size() and topo.group_index == member.Get_rank()
    ok = ok and topo.describe()["groups"] == [[r] for r in range(member.Get_size())]
    topo.free()
    member.Free()
    assert all_true(world, ok)


@pytest.mark.mpi(min_size=1)
def test_inner_size_too_large_names_the_key():
    size = MPI.COMM_WORLD.Get_size()
    with pytest.raises(ValueError, match=rf"comm.inner_size={size + 1} is larger than the world size {size}"):
        build_topology(MPI.COMM_WORLD, size + 1)
    with pytest.raises(ValueError, match="comm.inner_size=-1"):
        build_topology(MPI.COMM_WORLD, -1)


@pytest.mark.mpi(min_size=1)
def test_thread_level_is_funneled():
    """sagips.comm asks for MPI_THREAD_FUNNELED (Open MPI's osc/pt2pt refuses windows under THREAD_MULTIPLE)."""
    assert MPI.Query_thread() == MPI.THREAD_FUNNELED


@pytest.mark.mpi(min_size=1)
def test_gather_json_under_the_watchdog_matches_mpi_gather():
    """The quality gather goes through nonblocking collectives under the watchdog; its result is MPI's own gather's."""
    import numpy as np

    from sagips.comm import watchdog

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    obj = {"rank": rank, "params": [rank * 0.5] * (rank + 1), "x": np.float32(rank), "name": "é" * rank}
    got = watchdog.gather_json(comm, obj, 0, timeout_s=60, what="test gather")
    want = comm.gather({**obj, "x": float(obj["x"])}, root=0)
    assert (got == want) if rank == 0 else got is None
