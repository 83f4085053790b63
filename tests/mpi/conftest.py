"""Fixtures shared by the tests/mpi suite (run under mpiexec with pytest --with-mpi)."""
import sagips.comm  # noqa: F401  (FIRST: sets mpi4py.rc.thread_level before MPI is initialised)

# isort: split
import pytest
from _helpers import INNER_SIZES, inner_size_or_skip
from mpi4py import MPI


@pytest.fixture(params=INNER_SIZES, ids=lambda p: f"inner{p}")
def topo(request):
    """A Topology over COMM_WORLD for each inner size that fits the world (freed after the test)."""
    from sagips.comm.topology import build_topology

    size = inner_size_or_skip(request.param)
    if size is None:
        pytest.skip("inner size larger than the world")
    t = build_topology(MPI.COMM_WORLD, size)
    yield t
    t.free()
