# shellcheck shell=bash
# SAGIPS environment on Polaris (ALCF). Sourced by every launch/polaris/*.pbs script:
#
#     source "$SAGIPS_ROOT/launch/polaris/env.sh" || exit 1
#
# What it does (idempotent; the first call on a login node builds, later calls and jobs only check and activate):
#   1. module use /soft/modulefiles; module load conda; conda activate base
#      -> Python, a CUDA build of torch, and an mpi4py built against Cray MPICH (the Slingshot 11 path).
#   2. a venv created with --system-site-packages over the module, so that torch and mpi4py come from the module
#      (never pip's CPU torch, never a second MPI). ONE VENV PER MODULE AND PE: its name is the key
#          <conda module>_cray-mpich-<CRAY_MPICH_VERSION>-<PE_ENV>, e.g. conda-2025-09-25_cray-mpich-8.1.28-nvidia
#      under $SAGIPS_ROOT/.venv-polaris/. ALCF changes the default conda module (it did on 2025-10-24) and Cray PE
#      releases rename their MPI library (libmpi_gnu_123.so.12 -> libmpi_gnu.so.12): a venv over an old module,
#      or an mpi4py built against an old PE, stops loading. So a new module or PE gets a venv of its own, and an
#      existing venv is used only if its stamp (.sagips-venv) names the same key AND its python still starts and
#      loads mpi4py's MPI extension (a dlopen of libmpi, no MPI_Init); otherwise it is deleted and rebuilt.
#   3. `pip install -e .` WITHOUT the `mpich` extra: the mpich wheel would put a TCP/shared-memory MPICH in front of
#      Cray MPICH and all inter-node traffic would leave Slingshot. If `from mpi4py import MPI` fails (the module's
#      mpi4py is built against a PE that an upgrade replaced, e.g. PE 26.03 on 2026-08-19; or it is older than the 4
#      that sagips needs), mpi4py is rebuilt from source into the venv with the Cray wrapper `cc`, after checking
#      that `cc` drives the compiler of the loaded PrgEnv (nvc under PrgEnv-nvidia, gcc under PrgEnv-gnu).
#   4. checks, one line each, that torch comes from the conda module, mpi4py from the module or the venv, and that
#      MPI.Get_library_version() names Cray MPICH; any other answer is an error.
#   5. exports the MPI settings of a SAGIPS job (below).
# Inside a PBS job ($PBS_JOBID set) a missing or stale venv is an error, not a build: build it on a login node
# (`source launch/polaris/env.sh`), because jobs that start together would build into the same directory.
# SAGIPS_BUILD_IN_JOB=1 allows the build in a job: pip then needs the internet, which compute nodes reach only through
# ALCF's proxy, so env.sh exports the proxy variables that ALCF documents (http(s)_proxy, HTTP(S)_PROXY =
# http://proxy.alcf.anl.gov:3128) unless they are set already.
#
# DRY_RUN=1: print every command instead of running it (works on any machine: module/conda/PBS are not needed).
# Variables (all optional): SAGIPS_ROOT (the repository; default: two levels above this file), SAGIPS_VENV
# (a fixed venv path instead of .venv-polaris/<key>; it is checked and rebuilt the same way; must be on a file
# system the compute nodes see: home or eagle), SAGIPS_CONDA_MODULE (default: conda, ALCF's default version).

: "${DRY_RUN:=0}"
SAGIPS_ROOT=${SAGIPS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
SAGIPS_CONDA_MODULE=${SAGIPS_CONDA_MODULE:-conda}
export SAGIPS_ROOT

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

# sagips_venv_key: the name of the venv for the loaded conda module, Cray MPICH version and programming environment
# (from Lmod's LOADEDMODULES and the cray-mpich module's variables).
sagips_venv_key() {
    local conda="" mods m key
    IFS=: read -r -a mods <<< "${LOADEDMODULES:-}"
    for m in "${mods[@]}"; do
        [[ "$m" == conda || "$m" == conda/* ]] && conda=$m
    done
    [[ -n "$conda" ]] || conda=$SAGIPS_CONDA_MODULE
    key="${conda//\//-}_cray-mpich-${CRAY_MPICH_VERSION:-none}"
    [[ -n "${PE_ENV:-}" ]] && key+="-${PE_ENV,,}"
    echo "${key//[^A-Za-z0-9._-]/_}"
}

# sagips_mpi4py_loads [PYTHON]: `from mpi4py import MPI` works: the extension module finds its libmpi (what a PE
# upgrade breaks) and mpi4py is >= 4. No MPI_Init (rc.initialize = False): on a login node the import is the test.
sagips_mpi4py_loads() {
    "${1:-python}" -c 'import mpi4py, sys; mpi4py.rc.initialize = False
from mpi4py import MPI
sys.exit(int(mpi4py.__version__.split(".")[0]) < 4)' >/dev/null 2>&1
}

# sagips_venv_ok DIR KEY: DIR is a venv built by this script for KEY, and its interpreter still loads mpi4py.MPI.
sagips_venv_ok() {
    [[ -f "$1/.sagips-venv" ]] && grep -qxF "key=$2" "$1/.sagips-venv" && sagips_mpi4py_loads "$1/bin/python"
}

# sagips_check_compiler: the Cray wrapper `cc` drives the compiler of the loaded PrgEnv (ALCF's compiler table:
# PrgEnv-nvhpc, Polaris's default, and PrgEnv-nvidia -> nvc; PrgEnv-gnu -> gcc), so that a build links the Cray MPICH
# of that PE. One line on stdout, or one error line.
sagips_check_compiler() {
    local want first
    case "${PE_ENV:-}" in
    NVHPC | NVIDIA) want=nvc ;;
    GNU) want=gcc ;;
    CRAY) want=Cray ;;
    AOCC) want=AMD ;;
    *) _sagips_env_fail "PE_ENV='${PE_ENV:-}': no PrgEnv module loaded (module load PrgEnv-nvidia), so the compiler" \
        "of a build is unknown"; return 1 ;;
    esac
    first=$(cc --version 2>/dev/null | grep -m 1 .)  # nvc prints a blank line before its version
    if [[ "$first" != *"$want"* ]]; then
        _sagips_env_fail "cc is '${first:-not found}', not $want of PrgEnv-${PE_ENV,,}: load the PrgEnv that matches" \
            "(module load PrgEnv-${PE_ENV,,}) before building mpi4py"
        return 1
    fi
    echo "env.sh: cc is $first (PrgEnv-${PE_ENV,,})"
}

# sagips_build_mpi4py: mpi4py from source into the active venv, against Cray MPICH, with the Cray wrapper
# ("cc -shared" links the PE's libmpi). --ignore-installed: the module's own mpi4py (seen through
# --system-site-packages) may satisfy "mpi4py>=4" by version while no longer loading.
sagips_build_mpi4py() {
    sagips_check_compiler || return 1
    MPICC="cc -shared" python -m pip install --no-cache-dir --ignore-installed --no-binary=mpi4py "mpi4py>=4"
}

# sagips_check_sources: one line each: where torch and mpi4py come from (torch: the conda module, never the venv,
# where pip would put a CPU build; mpi4py: the module or the venv) and the MPI library (Cray MPICH). Prefixes:
# CONDA_PREFIX (the module) and VIRTUAL_ENV (the venv). Returns 1 after the first wrong answer.
sagips_check_sources() {
    local out torch mpi4py lib
    local conda venv
    out=$(python -c 'import importlib.util, os, mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI
print(os.path.realpath(importlib.util.find_spec("torch").origin))
print(os.path.realpath(mpi4py.__file__))
print(MPI.Get_library_version().splitlines()[0].strip())' 2>&1) ||
        { _sagips_env_fail "python cannot import mpi4py.MPI or find torch: ${out##*$'\n'}"; return 1; }
    { read -r torch; read -r mpi4py; read -r lib; } <<< "$out"
    conda=$(readlink -f "${CONDA_PREFIX:-/nonexistent}")
    venv=$(readlink -f "${VIRTUAL_ENV:-/nonexistent}")
    if [[ -z "${CONDA_PREFIX:-}" || "$torch" != "$conda"/* ]]; then
        _sagips_env_fail "torch is $torch, not the conda module's (CONDA_PREFIX=${CONDA_PREFIX:-unset}): remove" \
            "the torch that pip put into $VIRTUAL_ENV (or ~/.local), never pip install torch"; return 1
    fi
    echo "env.sh: torch from the conda module: $torch"
    if [[ "$mpi4py" != "$conda"/* && "$mpi4py" != "$venv"/* ]]; then
        _sagips_env_fail "mpi4py is $mpi4py, neither the conda module's ($CONDA_PREFIX) nor the venv's" \
            "(${VIRTUAL_ENV:-none})"; return 1
    fi
    echo "env.sh: mpi4py from the $([[ "$mpi4py" == "$conda"/* ]] && echo conda module || echo venv): $mpi4py"
    if [[ "${lib^^}" != *"CRAY MPICH"* ]]; then
        _sagips_env_fail "mpi4py's MPI library is '$lib', not Cray MPICH: inter-node traffic would leave Slingshot" \
            "(is the mpich wheel installed? pip uninstall mpich)"; return 1
    fi
    echo "env.sh: MPI library: $lib"
}

# sagips_remove_venv DIR: delete a venv that this script built (it refuses any other directory).
sagips_remove_venv() {
    if [[ ! -f "$1/.sagips-venv" ]]; then
        echo "env.sh: error: $1 is not a venv built by env.sh (no .sagips-venv stamp): not deleting it;" \
            "choose another SAGIPS_VENV" >&2
        return 1
    fi
    rm -rf -- "$1"
}

# sagips_build_venv DIR KEY: create the venv over the loaded module, install sagips, stamp it with KEY.
sagips_build_venv() {
    local dir=$1 key=$2
    python3 -m venv --system-site-packages "$dir" || return 1
    # shellcheck disable=SC1091
    source "$dir/bin/activate" || return 1
    if ! sagips_mpi4py_loads python; then
        echo "env.sh: the module's mpi4py does not load (or is older than 4): building it into $dir" >&2
        sagips_build_mpi4py || return 1
        sagips_mpi4py_loads python || { _sagips_env_fail "the mpi4py just built does not load either"; return 1; }
    fi
    python -m pip install -e "$SAGIPS_ROOT" || return 1   # NOT ".[mpich]"
    local mpi
    mpi=$(python -c 'import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])') || return 1
    echo "env.sh: mpi4py uses $mpi"
    printf 'key=%s\npython=%s\nmpi=%s\nbuilt=%s on %s\n' "$key" "$(readlink -f "$(command -v python3)")" "$mpi" \
        "$(date -u +%FT%TZ)" "$(hostname)" > "$dir/.sagips-venv"
}

_sagips_env_fail() { echo "env.sh: error: $*" >&2; }

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

# ---- 2.+3. the venv of this module and PE: checked, (re)built where needed, activated
SAGIPS_VENV_KEY=$(sagips_venv_key)
SAGIPS_VENV=${SAGIPS_VENV:-$SAGIPS_ROOT/.venv-polaris/$SAGIPS_VENV_KEY}
export SAGIPS_VENV SAGIPS_VENV_KEY
if [[ "$DRY_RUN" == 1 ]]; then
    echo "# env.sh: venv $SAGIPS_VENV (key $SAGIPS_VENV_KEY): used if its stamp names this key and its python" \
        "loads mpi4py.MPI; else (re)built: python3 -m venv --system-site-packages; pip install -e $SAGIPS_ROOT" \
        "(no mpich extra)"
    echo "# env.sh: source $SAGIPS_VENV/bin/activate"
elif sagips_venv_ok "$SAGIPS_VENV" "$SAGIPS_VENV_KEY"; then
    # shellcheck disable=SC1091
    source "$SAGIPS_VENV/bin/activate"
elif [[ -n "${PBS_JOBID:-}" && "${SAGIPS_BUILD_IN_JOB:-0}" != 1 ]]; then
    _sagips_env_fail "no usable venv for $SAGIPS_VENV_KEY at $SAGIPS_VENV (missing, built for another module or PE," \
        "or its python no longer loads mpi4py). Build it on a login node first: cd $SAGIPS_ROOT && source" \
        "launch/polaris/env.sh (or set SAGIPS_BUILD_IN_JOB=1)"
    return 1 2>/dev/null || exit 1
else
    if [[ -e "$SAGIPS_VENV" ]]; then
        echo "env.sh: $SAGIPS_VENV does not match $SAGIPS_VENV_KEY or no longer loads mpi4py: rebuilding it" >&2
        sagips_remove_venv "$SAGIPS_VENV" || { return 1 2>/dev/null || exit 1; }
    fi
    if [[ "$SAGIPS_VENV" == "$SAGIPS_ROOT/.venv-polaris/"* ]]; then
        mkdir -p "$SAGIPS_ROOT/.venv-polaris" && echo '*' > "$SAGIPS_ROOT/.venv-polaris/.gitignore"  # not for git
        [[ -f "$SAGIPS_ROOT/.venv-polaris/.sagips-installed" ]] &&
            echo "env.sh: $SAGIPS_ROOT/.venv-polaris itself is an old single venv (built by an earlier env.sh);" \
                "remove its bin/ lib/ include/ when no job uses it" >&2
    fi
    if [[ -n "${PBS_JOBID:-}" ]]; then   # SAGIPS_BUILD_IN_JOB=1: pip reaches the index through ALCF's proxy
        : "${http_proxy:=http://proxy.alcf.anl.gov:3128}" "${https_proxy:=$http_proxy}"
        : "${HTTP_PROXY:=$http_proxy}" "${HTTPS_PROXY:=$https_proxy}"
        export http_proxy https_proxy HTTP_PROXY HTTPS_PROXY
        echo "env.sh: building inside job $PBS_JOBID through the proxy $https_proxy" >&2
    fi
    echo "env.sh: building $SAGIPS_VENV for $SAGIPS_VENV_KEY" >&2
    if ! sagips_build_venv "$SAGIPS_VENV" "$SAGIPS_VENV_KEY"; then
        _sagips_env_fail "building $SAGIPS_VENV failed (see above); it is left without a stamp and will be rebuilt"
        return 1 2>/dev/null || exit 1
    fi
fi

# ---- 4. where torch, mpi4py and the MPI library come from (on Polaris, i.e. where the modules were loaded)
if [[ "$DRY_RUN" == 1 ]]; then
    echo "# env.sh: check: torch from the conda module, mpi4py from the module or the venv, MPI library Cray MPICH"
elif type module >/dev/null 2>&1; then
    sagips_check_sources || { return 1 2>/dev/null || exit 1; }
fi

# ---- 5. MPI settings of a SAGIPS job
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
# takes one of the rank's 8 cores: the scripts then give torch 7 threads, `--set train.threads=7`, by
# sagips_torch_threads in common.sh). Measure with and without it: see docs/polaris.md,
# which also lists the known hangs of one-sided MPI across nodes on Slingshot (validate.pbs checks your job).
# export MPICH_ASYNC_PROGRESS=1
export PYTHONUNBUFFERED=1   # rank 0's summary lines reach the PBS log while the job runs
