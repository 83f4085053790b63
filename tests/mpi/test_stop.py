"""sagips/comm/stop.py: a rank never blocks in an exchange on a rank that waits in the stop agreement for it.

Rank 0 asks to stop at the end of epoch 1; the other ranks end epochs 1 and 2 at once and then enter epoch 3, whose
"exchange" (a barrier under the watchdog) waits for every rank. Rank 0 learns of its flag at the end of epoch 2 and
waits in step 2 for the others. Without learning first (syncs(3) False) the others sat in the barrier while rank 0
sat in step 2: the watchdog aborts the job, and the test fails."""
import time

import pytest
from _helpers import all_true
from mpi4py import MPI

from sagips.comm import watchdog
from sagips.comm.stop import StopAgreement


@pytest.mark.mpi(min_size=2)
def test_a_rank_learns_of_a_stop_before_an_epoch_that_waits_for_the_others():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    agreement = StopAgreement(world, timeout_s=20.0, syncs=lambda epoch: epoch == 3)
    exchange = world.Dup()
    target = None
    for epoch in (1, 2, 3, 4):
        if epoch == 3:  # the epoch's exchange: waits for every rank
            watchdog.wait_all([exchange.Ibarrier()], 20.0, "test exchange", exchange, epoch, [])
        if rank == 0 and epoch == 1:
            time.sleep(0.3)  # the others end epochs 1 and 2 first
        target = agreement.after_epoch(epoch, requested=(rank == 0 and epoch == 1))
        if target is not None and epoch >= target:
            break
    agreement.finish(epoch)
    exchange.Free()
    assert all_true(world, target == 2 and epoch == 2)
