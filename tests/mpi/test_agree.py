"""shard.agree: an error of some ranks is raised on every rank, as one line, with its class (tests/mpi, any N)."""
import pytest
from _helpers import all_true
from mpi4py import MPI

from sagips.config import ConfigError
from sagips.io.refdata import DataError
from sagips.io.shard import agree


def _raise_on(ranks, kind, msg="missing file"):
    def fn():
        if MPI.COMM_WORLD.Get_rank() in ranks:
            raise kind(msg)
        return MPI.COMM_WORLD.Get_rank()
    return fn


@pytest.mark.mpi(min_size=1)
def test_no_error_returns_each_ranks_value():
    world = MPI.COMM_WORLD
    assert all_true(world, agree(world, _raise_on((), DataError)) == world.Get_rank())


@pytest.mark.mpi(min_size=2)
def test_an_error_of_the_last_rank_is_raised_everywhere_naming_it():
    world = MPI.COMM_WORLD
    last = world.Get_size() - 1
    with pytest.raises(ConfigError) as e:  # the tuple's matching class, not the first one
        agree(world, _raise_on((last,), ConfigError), error=(DataError, ConfigError))
    assert all_true(world, str(e.value) == f"missing file (rank {last})")


@pytest.mark.mpi(min_size=1)
def test_the_same_error_on_every_rank_is_one_line_without_a_rank():
    world = MPI.COMM_WORLD
    with pytest.raises(DataError) as e:
        agree(world, _raise_on(range(world.Get_size()), DataError), error=(DataError, ConfigError))
    assert all_true(world, str(e.value) == "missing file")

