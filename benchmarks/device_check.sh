#!/usr/bin/env bash
# Issue 38's GPU half in one call of the lent device (docs/optigan.md, "The recorded step"). Prepared on a CPU:
#
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#                    -d .whl mpich mpi4py
#                mkdir -p .devtools && cp ../shared/tools/gpu_profile.py .devtools/   # git-ignored (.git/info/exclude)
#   device:      run(command="bash benchmarks/device_check.sh", carry=[".whl", ".devtools"], timeout_s=540)
#
# In order, each step with its own time limit so that a slow one cannot eat the others: install; the CUDA tests
# (graph against eager in every case, resume from a graph run's state, pinned offload); benchmarks/gpu_step.py (the
# three cases eager and recorded, make run's job 4 ranks on the GPU); the shared profiler for comparison. Everything
# lands in $OUT (the device tool brings it back).
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }

log install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || { log "install of the wheels failed"; exit 2; }
export PATH=/tmp/site/bin:$PATH
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { log "pip install -e . failed (install.log)"; exit 2; }
python3 - <<'EOF' | tee -a "$OUT/steps.log"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
EOF

log "CUDA tests"
timeout 150 python3 -m pytest -q -x tests/test_step.py tests/test_trainer.py -k "graph or resume_from or cuda" \
    >"$OUT/cuda_tests.log" 2>&1; log "CUDA tests rc=$?"
tail -5 "$OUT/cuda_tests.log" | tee -a "$OUT/steps.log"

log "gpu_step"
timeout 240 python3 benchmarks/gpu_step.py --device cuda --job-epochs 300 --out "$OUT" >"$OUT/gpu_step.log" 2>&1
log "gpu_step rc=$?"
grep -E "ms/epoch|wrote" "$OUT/gpu_step.log" | tee -a "$OUT/steps.log"

if [ -f .devtools/gpu_profile.py ]; then
    log "shared profiler (comparison)"
    timeout 120 python3 .devtools/gpu_profile.py --device cuda --out "$OUT/gpu_profile" >"$OUT/gpu_profile.log" 2>&1
    log "gpu_profile rc=$?"
fi
log done
