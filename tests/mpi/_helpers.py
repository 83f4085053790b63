"""Shared helpers of the tests/mpi suite (run under mpiexec with pytest-mpi, see tests/mpi/test_ring.py)."""
from __future__ import annotations

import hashlib

import sagips.comm  # noqa: F401  (FIRST: sets mpi4py.rc.thread_level before MPI is initialised)

# isort: split
import numpy as np
from mpi4py import MPI

from sagips.comm.watchdog import wait_all

# The helpers' collectives are nonblocking + the watchdog's polite (sleeping) wait: MPICH's blocking collectives
# busy-poll, and on an oversubscribed machine (8 ranks on 2 cores) a rank that finished early and spins in an
# Allreduce steals the core from the ranks still working, slowing a test from milliseconds to a second.
TEST_TIMEOUT_S = 120.0


def _wait(comm, req):
    wait_all([req], TEST_TIMEOUT_S, "test helper", comm, -1, [])

# The inner sizes every grouped test runs over; "world" = one group of all ranks.
INNER_SIZES = (1, 2, 3, "world")


def inner_size_or_skip(param, comm=None):
    """The integer inner size for `param`, or None when it does not fit this world (the same on every rank)."""
    comm = comm or MPI.COMM_WORLD
    size = comm.Get_size() if param == "world" else param
    return size if size <= comm.Get_size() else None


def barrier(comm=None) -> None:
    comm = comm or MPI.COMM_WORLD
    _wait(comm, comm.Ibarrier())


def all_true(comm, ok: bool) -> bool:
    """True on every rank iff `ok` on every rank: assert on this, never on a local condition alone, so that a
    failure on one rank fails the test on all ranks instead of leaving the others waiting in the next collective."""
    flag = np.array([1 if ok else 0], np.int32)
    _wait(comm, comm.Iallreduce(MPI.IN_PLACE, flag, op=MPI.MIN))
    return bool(flag[0])


def mean_over(comm, x: np.ndarray) -> np.ndarray:
    """Reference mean of float32 `x` over `comm` (MPI's Allreduce), and the mean absolute value for tolerances."""
    s = x.copy()
    _wait(comm, comm.Iallreduce(MPI.IN_PLACE, s, op=MPI.SUM))
    return s / np.float32(comm.Get_size())


def abs_mean_over(comm, x: np.ndarray) -> np.ndarray:
    return mean_over(comm, np.abs(x))


def identical_on_all(comm, x: np.ndarray) -> bool:
    """True if `x` has the same bytes on every rank of `comm`."""
    mine = np.frombuffer(hashlib.sha256(np.ascontiguousarray(x).tobytes()).digest(), np.uint8)
    every = np.empty((comm.Get_size(), mine.size), np.uint8)
    _wait(comm, comm.Iallgather(mine, every))
    return bool(np.all(every == every[0]))


def close_to(y: np.ndarray, ref: np.ndarray, mag: np.ndarray, rtol: float = 1e-5) -> bool:
    """|y - ref| <= rtol * (mean |x| + tiny): float32 rounding relative to the magnitudes summed, not to the sum."""
    return bool(np.all(np.abs(y - ref) <= rtol * (mag + 1e-30)))


def rank_buffer(rank: int, n: int, seed: int = 0) -> np.ndarray:
    """A distinct random float32 buffer per rank."""
    return np.random.default_rng([seed, rank]).standard_normal(n).astype(np.float32)


def sum_over(comm, value: float) -> float:
    v = np.array([value], np.float64)
    _wait(comm, comm.Iallreduce(MPI.IN_PLACE, v, op=MPI.SUM))
    return float(v[0])

