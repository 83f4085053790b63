"""sagips/comm/watchdog.py's wait: a rank that waits for another sleeps instead of busy-polling MPI.

Rank 0 works for 1 s (here: sleeps) before a barrier; the others wait in it as the end of a run does
(`watchdog.barrier(..., timeout_s=math.inf)`: no timeout). Their CPU time over the wait is a small part of it. MPICH's
own blocking wait spins at 100 % of a core: on a laptop with more ranks than cores that took the core from rank 0's
end-of-run work (the data's information, 10-30 s for a simulator of two columns)."""
import math
import time

import pytest
from _helpers import all_true
from mpi4py import MPI

from sagips.comm import watchdog


@pytest.mark.mpi(min_size=2)
def test_a_rank_waiting_without_a_timeout_sleeps():
    world = MPI.COMM_WORLD
    comm = world.Dup()
    rank = comm.Get_rank()
    watchdog.barrier(comm, timeout_s=60.0, what="test start")
    wall, cpu = time.perf_counter(), time.process_time()
    if rank == 0:
        time.sleep(1.0)
    watchdog.barrier(comm, timeout_s=math.inf, what="the end of the run")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    comm.Free()
    assert all_true(world, rank == 0 or (wall > 0.9 and cpu < 0.25 * wall)), (wall, cpu)
