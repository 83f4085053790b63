#!/usr/bin/env bash
# Issue 38's GPU half in one call of the lent device (docs/optigan.md, "The recorded step"). Prepared on a CPU:
#
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#                    -d .whl mpich mpi4py
#                mkdir -p .devtools && cp ../shared/tools/gpu_profile.py .devtools/   # git-ignored (.git/info/exclude)
#   device:      run(command="bash benchmarks/device_check.sh", carry=[".whl", ".devtools"], timeout_s=600)
#
# In order, each step with its own time limit so that a slow one cannot eat the others: install; the CUDA tests
# (graph against eager in every case, resume from a graph run's state, pinned offload); benchmarks/gpu_step.py (the
# three cases eager and recorded, make run's job 4 ranks on the GPU); benchmarks/graph_trace.py (where recorded runs
# of ensemble part from eager ones, epoch by epoch); benchmarks/graph_modes.py (every mode under mpiexec, eager
# against recorded; make run's whole job); the shared profiler for comparison. STEPS picks some, in that order.
# Everything lands in $OUT (the device tool brings it back); all steps take about 9 minutes on an H100.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }
STEPS=${STEPS:-tests,gpu_step,trace,modes,profile}  # e.g. STEPS=modes bash benchmarks/device_check.sh for one of them
want() { [[ ",$STEPS," == *",$1,"* ]]; }

log install
# --prefix, not --target: the mpich wheel's libmpi lands in $SITE/lib only so (mpi4py dlopens it from there); the
# image's own mpi4py (built for no MPI here) is shadowed by --ignore-installed and PYTHONPATH
SITE=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix "$SITE" \
    .whl/*.whl >/tmp/install.log 2>&1 || { log "install of the wheels failed"; tail -5 /tmp/install.log; exit 2; }
export PYTHONPATH=$(echo "$SITE"/lib/python3*/site-packages):$PWD:${PYTHONPATH:-}
export LD_LIBRARY_PATH=$SITE/lib:${LD_LIBRARY_PATH:-} PATH=$SITE/bin:$PATH
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>/tmp/install.log 2>&1 \
    || { log "pip install -e . failed; the checkout is on PYTHONPATH instead"; tail -3 /tmp/install.log; }
python3 - <<'PY' 2>&1 | tee -a "$OUT/steps.log"
import torch
from mpi4py import MPI
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "|", MPI.Get_library_version().splitlines()[0])
PY
timeout 60 mpiexec -n 2 python3 -c "from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.allreduce(1) == 2" \
    && log "mpiexec -n 2: ok" || log "mpiexec -n 2 failed"
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv | tee -a "$OUT/steps.log"

if want tests; then
log "CUDA tests"
timeout 150 python3 -m pytest -q --tb=short -rs tests/test_step.py tests/test_trainer.py tests/test_profiling.py \
    tests/test_precondition.py -k "graph or replayed or resume_from or cuda or nvtx" >"$OUT/cuda_tests.log" 2>&1
log "CUDA tests rc=$?"
grep -E "passed|failed|FAILED|ERROR|Error:" "$OUT/cuda_tests.log" | tail -20 | tee -a "$OUT/steps.log"
fi

if want gpu_step; then
log "gpu_step"
timeout 200 python3 benchmarks/gpu_step.py --device cuda --job-epochs 300 --out "$OUT" >"$OUT/gpu_step.log" 2>&1
log "gpu_step rc=$?"
grep -E "ms/epoch|wrote|Error" "$OUT/gpu_step.log" | tee -a "$OUT/steps.log"
fi

if want trace; then  # its output goes to steps.log whole (the device returns at most 8 files)
log "graph_trace"
timeout 400 python3 benchmarks/graph_trace.py --out "$OUT" ${GRAPH_TRACE_ARGS:-} 2>&1 | tee -a "$OUT/steps.log"
log "graph_trace rc=${PIPESTATUS[0]}"
fi

if want modes; then  # every mode under mpiexec, eager against recorded, and make run's whole job (auto, off)
log "graph_modes"
timeout ${MODES_TIMEOUT_S:-420} python3 benchmarks/graph_modes.py --out "$OUT" ${GRAPH_MODES_ARGS:-} 2>&1 | tee "$OUT/graph_modes.log" | grep -v "^--- " \
    | grep -E "tolerances|make run|Error" | tee -a "$OUT/steps.log"
log "graph_modes rc=${PIPESTATUS[0]}"
fi

if want profile && [ -f .devtools/gpu_profile.py ]; then  # its traces stay behind: the device returns at most 8 files
    log "shared profiler (comparison)"
    timeout 45 python3 .devtools/gpu_profile.py --device cuda --no-compile --epochs 20 --out /tmp/gp >/tmp/gp.log 2>&1
    log "gpu_profile rc=$?"
    cp /tmp/gp/gpu_profile.json /tmp/gp/gpu_profile.txt "$OUT"/ 2>/dev/null || tail -5 /tmp/gp.log | tee -a "$OUT/steps.log"
fi
log done
