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
import os
import sys

import mpi4py

# MPICH's shared-memory collectives ("release_gather": Bcast, Reduce, Allreduce inside a node) spin on flags in
# shared memory. With more ranks on a node than cores (4 ranks on a 2-core laptop) a spinning rank holds the core
# that the rank it waits for needs: measured with MPICH 5.0.2, 4 ranks on 2 cores, right after a Barrier, a 32 MB
# Bcast took 7.7 s instead of 0.02 s, a 32 MB Allreduce 31 s instead of 0.04 s, and a 200 KB Allreduce now and then
# 0.2 s instead of 0.008 s (docs/benchmarks/startup.md). Where the launcher says that the node is oversubscribed, use
# MPICH's generic algorithms instead (point-to-point underneath, which yield). A user's own setting wins; other MPIs
# ignore these variables. They must be set before MPI is initialised, i.e. before `from mpi4py import MPI`.
OVERSUBSCRIBED_CVARS = {f"MPIR_CVAR_{op}_POSIX_INTRA_ALGORITHM": "mpir" for op in ("BCAST", "REDUCE", "ALLREDUCE")}
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "PALS_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def oversubscription_settings(environ, cores: int) -> dict[str, str]:
    """The variables to add to `environ` for MPICH: OVERSUBSCRIBED_CVARS where the launcher put more ranks on this
    node than there are `cores` (MPICH/hydra, PALS and Open MPI say how many), less those the user set; else {}."""
    local = next((int(v) for v in (environ.get(k, "").strip() for k in _LOCAL_SIZE_VARS) if v.isdigit()), None)
    if local is None or local <= cores:
        return {}
    return {k: v for k, v in OVERSUBSCRIBED_CVARS.items() if k not in environ}


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


if "mpi4py.MPI" not in sys.modules:
    os.environ.update(oversubscription_settings(os.environ, _usable_cores()))
    mpi4py.rc.thread_level = "funneled"
