"""The gradient exchange between ranks: one contiguous float32 buffer in, the exchanged buffer out.

    topology.py   inner groups (one per node), the leaders' (outer) communicator
    watchdog.py   every wait goes through here: a hang becomes an abort that names the rank, epoch and peer
    ring.py       nonblocking ring allreduce ("whole": the paper's N-1 hops; "chunked": reduce-scatter + all-gather)
    rma.py        asynchronous exchange through one-sided windows (a rank never waits for a slow neighbour)
    modes.py      the five modes as small compositions of the above

This package knows nothing of GANs or torch; buffer.py (the only file here that imports torch) fuses and offloads
the generator gradients into the flat buffer handed to an exchange.
"""
# The MPI thread level must be chosen BEFORE the first `from mpi4py import MPI` anywhere in the process, because
# MPI is initialised on that import. mpi4py asks for MPI_THREAD_MULTIPLE by default; we never call MPI from more
# than one thread, and Open MPI's osc/pt2pt component refuses to create RMA windows under THREAD_MULTIPLE (and the
# multiple-thread path costs locking in MPICH too). "funneled" (not "single") so that a torch/OpenMP helper thread
# that exists in the process is allowed, while all MPI calls stay on the main thread.
# If something already imported mpi4py.MPI, this assignment has no effect: import sagips.comm first.
import sys

import mpi4py

if "mpi4py.MPI" not in sys.modules:
    mpi4py.rc.thread_level = "funneled"
