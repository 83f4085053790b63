#!/bin/bash
# N SAGIPS ranks on this machine; inner groups ("nodes") emulated with --set comm.inner_size=INNER.
#
#     launch/local.sh                                   # 4 ranks posing as 2 nodes x 2 GPUs, arar-arar, quick preset
#     launch/local.sh -n 8 -g 4 -- --mode rma-arar-arar --epochs 500 --output-dir runs/rma8
#     launch/local.sh -n 2 -- --mode arar --set comm.ring=chunked
#     DRY_RUN=1 launch/local.sh -n 4                    # print the command, run nothing
#
# Options: -n N ranks (default 4); -g INNER ranks per inner group (default min(2, N); 0 = one group per real node,
# i.e. all ranks of this machine). Everything after `--` goes to `python -m sagips.run` AFTER the defaults
# (--config configs/proxy1d-quick.yaml --mode arar-arar --output-dir runs/local-n<N>), so it overrides them.
# Uses .venv/bin/mpiexec and .venv/bin/python when they exist (the mpich wheel of `make setup`), else the PATH's.
# TIMEOUT=SECONDS wraps the run in `timeout` (a hung exchange is also caught by the watchdog: comm.timeout_s).
set -euo pipefail
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=4
INNER=""
while getopts ":n:g:h" opt; do
    case "$opt" in
    n) N=$OPTARG ;;
    g) INNER=$OPTARG ;;
    h) usage 0 ;;
    :) echo "local.sh: -$OPTARG needs a value" >&2; usage 2 ;;
    *) echo "local.sh: unknown option -$OPTARG" >&2; usage 2 ;;
    esac
done
shift $((OPTIND - 1))
[[ "${1:-}" == "--" ]] && shift
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "local.sh: -n $N: need a positive integer" >&2; exit 2; }
[[ -z "$INNER" ]] && INNER=$((N < 2 ? N : 2))
[[ "$INNER" =~ ^[0-9]+$ ]] && ((INNER <= N)) || { echo "local.sh: -g $INNER: need 0..$N" >&2; exit 2; }

MPIEXEC=$ROOT/.venv/bin/mpiexec
[[ -x "$MPIEXEC" ]] || MPIEXEC=$(command -v mpiexec || true)
[[ -n "$MPIEXEC" ]] || { echo "local.sh: no mpiexec (run 'make setup', or install an MPI)" >&2; exit 1; }
PYTHON=$ROOT/.venv/bin/python
[[ -x "$PYTHON" ]] || PYTHON=python3

cmd=("$MPIEXEC" -n "$N" "$PYTHON" -m sagips.run --config configs/proxy1d-quick.yaml --mode arar-arar
    --output-dir "runs/local-n$N" --set "comm.inner_size=$INNER" "$@")
[[ -n "${TIMEOUT:-}" ]] && cmd=(timeout "$TIMEOUT" "${cmd[@]}")

cd "$ROOT"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf -v quoted '%q ' "${cmd[@]}"
    echo "${quoted% }"
    exit 0
fi
exec "${cmd[@]}"
