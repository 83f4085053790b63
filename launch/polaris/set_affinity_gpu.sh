#!/bin/bash
# One GPU per MPI rank on a Polaris node (4 x A100). Used as a wrapper in front of the program:
#
#     mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth launch/polaris/set_affinity_gpu.sh python -m sagips.run ...
#
# The node-local rank comes from PALS (PMI_LOCAL_RANK, or PALS_LOCAL_RANKID). The mapping is reversed
# (local rank 0 -> GPU 3) as in ALCF's own set_affinity_gpu_polaris.sh: with --cpu-bind depth, local rank 0 runs on
# cores 0-7, and on Polaris those cores are closest to GPU 3. Each rank then sees exactly one GPU, so sagips'
# device "auto" (cuda:(local_rank % device_count)) resolves to cuda:0 = the GPU chosen here.
# Without either variable (not started by PALS's mpiexec, or a launcher that names it otherwise) it stops with one
# line instead of guessing: a guess of local rank 0 would put every rank of the node on GPU 3.
# DRY_RUN=1: print the command with the chosen CUDA_VISIBLE_DEVICES instead of running it.
num_gpus=${SAGIPS_GPUS_PER_NODE:-4}
local_rank=${PMI_LOCAL_RANK:-${PALS_LOCAL_RANKID:-}}
if [[ ! "$local_rank" =~ ^[0-9]+$ ]]; then
    echo "set_affinity_gpu.sh: error: no node-local rank (PMI_LOCAL_RANK='${PMI_LOCAL_RANK:-}'," \
        "PALS_LOCAL_RANKID='${PALS_LOCAL_RANKID:-}'): start it under Polaris's mpiexec (PALS), not directly" >&2
    exit 1
fi
gpu=$((num_gpus - 1 - local_rank % num_gpus))
export CUDA_VISIBLE_DEVICES=$gpu
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf -v quoted '%q ' "$@"
    echo "CUDA_VISIBLE_DEVICES=$gpu ${quoted% }"
    exit 0
fi
exec "$@"
