# shellcheck shell=bash
# SAGIPS environment on Polaris (ALCF). Sourced by every launch/polaris/*.pbs script:
#
#     source "$SAGIPS_ROOT/launch/polaris/env.sh"
#
# What it does (idempotent; the first call on a login node does the install, later calls only activate):
#   1. module use /soft/modulefiles; module load conda; conda activate base
#      -> Python, a CUDA build of torch, and an mpi4py built against Cray MPICH (the Slingshot 11 path).
#   2. a venv in $SAGIPS_VENV created with --system-site-packages, so that torch and mpi4py come from the module
#      (never pip's CPU torch, never a second MPI);
#   3. `pip install -e .` WITHOUT the `mpich` extra: the mpich wheel would put a TCP/shared-memory MPICH in front of
#      Cray MPICH and all inter-node traffic would leave Slingshot. If the module's mpi4py is older than 4 (sagips
#      needs mpi4py>=4), mpi4py is rebuilt from source against Cray MPICH with the Cray compiler wrapper.
#   4. exports the MPI settings of a SAGIPS job (below).
#
# DRY_RUN=1: print every command instead of running it (works on any machine: module/conda/PBS are not needed).
# Variables (all optional): SAGIPS_ROOT (the repository; default: two levels above this file), SAGIPS_VENV
# (default $SAGIPS_ROOT/.venv-polaris; must be on a file system the compute nodes see: home or eagle),
# SAGIPS_CONDA_MODULE (default: conda).

: "${DRY_RUN:=0}"
SAGIPS_ROOT=${SAGIPS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
SAGIPS_VENV=${SAGIPS_VENV:-$SAGIPS_ROOT/.venv-polaris}
SAGIPS_CONDA_MODULE=${SAGIPS_CONDA_MODULE:-conda}
export SAGIPS_ROOT SAGIPS_VENV

# sagips_cmd CMD ARGS...: run it, or under DRY_RUN=1 print it as one shell-quoted line (tests parse these lines).
sagips_cmd() {
    if [[ "$DRY_RUN" == 1 ]]; then
        local quoted
        printf -v quoted '%q ' "$@"
        echo "${quoted% }"
    else
        "$@"
    fi
}

# ---- 1. modules (skipped where `module` does not exist: a laptop, CI, or a dry run off Polaris)
if [[ "$DRY_RUN" == 1 ]]; then
    echo "# env.sh: module use /soft/modulefiles; module load $SAGIPS_CONDA_MODULE; conda activate base"
elif type module >/dev/null 2>&1; then
    module use /soft/modulefiles
    module load "$SAGIPS_CONDA_MODULE"
    conda activate base
else
    echo "env.sh: no 'module' command on $(hostname): skipping module load (not on Polaris?)" >&2
fi

# ---- 2.+3. the venv over the module's site-packages, installed once
if [[ "$DRY_RUN" == 1 ]]; then
    echo "# env.sh: python3 -m venv --system-site-packages $SAGIPS_VENV (once); pip install -e $SAGIPS_ROOT (no mpich extra)"
    echo "# env.sh: source $SAGIPS_VENV/bin/activate"
else
    if [[ ! -f "$SAGIPS_VENV/.sagips-installed" ]]; then
        python3 -m venv --system-site-packages "$SAGIPS_VENV"
        # shellcheck disable=SC1091
        source "$SAGIPS_VENV/bin/activate"
        if ! python -c 'import mpi4py, sys; sys.exit(int(mpi4py.__version__.split(".")[0]) < 4)' 2>/dev/null; then
            # Build mpi4py against Cray MPICH ("cc -shared" is the Cray wrapper that links the right libmpi).
            MPICC="cc -shared" python -m pip install --no-cache-dir --no-binary=mpi4py "mpi4py>=4"
        fi
        python -m pip install -e "$SAGIPS_ROOT"   # NOT ".[mpich]"
        python -c 'from mpi4py import MPI; print("env.sh: mpi4py uses", MPI.Get_library_version().splitlines()[0])'
        touch "$SAGIPS_VENV/.sagips-installed"
    else
        # shellcheck disable=SC1091
        source "$SAGIPS_VENV/bin/activate"
    fi
fi

# ---- 4. MPI settings of a SAGIPS job
# The exchanged gradients are offloaded to a CPU numpy buffer before any MPI call (paper IV-B6), so MPI never sees
# a GPU pointer: switch Cray MPICH's GPU-aware path off (it costs a pointer query per message, and needs the GTL
# library linked in, which a plain mpi4py build is not).
export MPICH_GPU_SUPPORT_ENABLED=0
# rma-arar-arar: an inner group is one node, so the RMA window is a shared-memory window (MPI.Win.Allocate_shared)
# and a rank's stores land in its peers' memory without MPI progress: nothing more is needed. If an inner group
# spans nodes (--set comm.inner_size=8 or more), the window falls back to Win.Allocate + Put + Flush, and a Put to a
# peer that is busy outside MPI (in its pipeline) completes only when that peer next calls MPI. Then export
#     MPICH_ASYNC_PROGRESS=1
# (a progress thread per rank: MPICH raises the thread level to MPI_THREAD_MULTIPLE internally and the thread
# takes one of the rank's cores; --depth 8 leaves room for it). Measure with and without it: see docs/polaris.md.
# export MPICH_ASYNC_PROGRESS=1
export PYTHONUNBUFFERED=1   # rank 0's summary lines reach the PBS log while the job runs
