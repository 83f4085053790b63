# shellcheck shell=bash
# The PBS context of a SAGIPS job, with defaults so that every script also runs outside PBS under DRY_RUN=1.
# Sourced by launch/polaris/*.pbs after SAGIPS_ROOT is set. Defines:
#   RANKS_PER_NODE=4, DEPTH=8              one rank per A100; 32 Milan cores / 4 ranks = 8 cores per rank
#   JOBID, JOBID_SHORT                     $PBS_JOBID (default "dryrun"), and its part before the first dot
#   WORKDIR                                $PBS_O_WORKDIR (the submit directory; default: SAGIPS_ROOT)
#   NODEFILE, NNODES                       $PBS_NODEFILE, one line per node (repeats dropped, order kept); without
#                                          one (dry run) a fake list of NODES nodes
#   sagips_nodes_from_directive FILE       the N of "#PBS -l select=N" in FILE
#   sagips_die MESSAGE                     print to stderr and exit 1
#   sagips_check_mode MODE                 die unless MODE is one of sagips.run's --mode choices
#   sagips_split_args "STRING"             SPLIT_ARGS=(words of STRING), without glob expansion
#   TMPDIR=/tmp (or SAGIPS_TMPDIR)         exported and checked: short enough for Python's AF_UNIX sockets
#   sagips_torch_threads                   TORCH_THREADS=(--set train.threads=7) when MPICH_ASYNC_PROGRESS=1, else ()

: "${DRY_RUN:=0}"
RANKS_PER_NODE=4
DEPTH=8

sagips_die() { echo "$(basename "$0"): error: $*" >&2; exit 1; }

SAGIPS_MODES="ensemble allreduce arar arar-arar rma-arar-arar hvd"   # = sagips.config.MODES (tested)
sagips_check_mode() {
    [[ " $SAGIPS_MODES " == *" $1 "* ]] || sagips_die "unknown mode '$1' (one of: $SAGIPS_MODES)"
}

# sagips_split_args "STRING": the words of STRING in the array SPLIT_ARGS (no glob expansion: --set x=[1,2] stays)
sagips_split_args() {
    SPLIT_ARGS=()
    [[ -n "$1" ]] && read -r -a SPLIT_ARGS <<< "$1"
    return 0
}

sagips_nodes_from_directive() {
    sed -n 's/^#PBS -l select=\([0-9][0-9]*\).*/\1/p' "$1" | head -n 1
}

# TMPDIR: Python's multiprocessing (optiGAN's forkserver DataLoader, environment.loader=dataloader) binds an AF_UNIX
# socket at $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX (TMPDIR + 33 bytes), and a socket path holds at most 107 bytes.
# ALCF lists "AF_UNIX path too long" under mpiexec as a known issue, fixed by TMPDIR=/tmp (Polaris, Known Issues):
# every job sets it here, before any mpiexec (which passes the environment on to the ranks).
export TMPDIR=${SAGIPS_TMPDIR:-/tmp}
SAGIPS_AF_UNIX_MAX=107
((${#TMPDIR} + 33 <= SAGIPS_AF_UNIX_MAX)) ||
    sagips_die "TMPDIR=$TMPDIR is ${#TMPDIR} bytes: Python's AF_UNIX sockets under it would exceed" \
        "$SAGIPS_AF_UNIX_MAX bytes (\"AF_UNIX path too long\"); use a short SAGIPS_TMPDIR, e.g. /tmp"
[[ "$DRY_RUN" == 1 || ( -d "$TMPDIR" && -w "$TMPDIR" ) ]] || sagips_die "TMPDIR=$TMPDIR is not a writable directory"
echo "# $(basename "$0"): TMPDIR=$TMPDIR"

# sagips_torch_threads: with MPICH_ASYNC_PROGRESS=1 (env.sh) each rank's progress thread takes one of its DEPTH
# cores, so torch gets the other DEPTH - 1; call it after env.sh and put "${TORCH_THREADS[@]}" before the user's
# own arguments (a train.threads of theirs wins).
sagips_torch_threads() {
    TORCH_THREADS=()
    [[ "${MPICH_ASYNC_PROGRESS:-0}" == 1 ]] && TORCH_THREADS=(--set "train.threads=$((DEPTH - 1))")
    return 0
}

JOBID=${PBS_JOBID:-dryrun}
JOBID_SHORT=${JOBID%%.*}
WORKDIR=${PBS_O_WORKDIR:-$SAGIPS_ROOT}

if [[ -n "${PBS_NODEFILE:-}" && -r "${PBS_NODEFILE}" ]]; then
    NODEFILE=$PBS_NODEFILE
elif [[ "$DRY_RUN" == 1 ]]; then
    # No PBS here: a fake node list of the requested size (NODES, else the script's own select=).
    : "${NODES:=$(sagips_nodes_from_directive "$0")}"
    [[ "${NODES:-}" =~ ^[1-9][0-9]*$ ]] || sagips_die "dry run: set NODES=<node count>"
    NODEFILE=$(mktemp "${TMPDIR:-/tmp}/sagips-nodefile.XXXXXX")
    trap 'rm -f "$NODEFILE"' EXIT
    for ((i = 0; i < NODES; i++)); do
        printf 'x3000c0s%db0n0.hsn.cm.polaris.alcf.anl.gov\n' "$i" >> "$NODEFILE"
    done
else
    sagips_die "not inside a PBS job (no readable PBS_NODEFILE). Submit with qsub, or run with DRY_RUN=1 to see the commands"
fi
# One line per node, in PBS's order: the count and every hostfile slice (scaling.pbs, ensemble.pbs) then read the
# same list (a node file that repeats a host, one line per rank slot, would otherwise give slices that share nodes).
if [[ $(sort "$NODEFILE" | uniq -d | wc -l) -gt 0 ]]; then
    UNIQUE_NODEFILE=$(mktemp "${TMPDIR:-/tmp}/sagips-nodes.XXXXXX")
    awk 'NF && !seen[$0]++' "$NODEFILE" > "$UNIQUE_NODEFILE"
    NODEFILE=$UNIQUE_NODEFILE
fi
NNODES=$(awk 'NF' "$NODEFILE" | wc -l)
NNODES=${NNODES// /}
