"""The torch-DDP baseline: the same environment, networks, pipeline and trainer as `sagips.run`, with the generator
wrapped in `torch.nn.parallel.DistributedDataParallel` (gloo on CPU, NCCL on CUDA) instead of a SAGIPS exchange.

    mpiexec -n 2 python -m sagips.ddp --config configs/proxy1d-quick.yaml --output-dir runs/ddp

It takes the flags of `python -m sagips.run` (`--mode` is ignored) and writes the same outputs, with mode
`ddp-gloo` (or `ddp-nccl`) in run.json, so that `sagips.analyze` and `benchmarks/analysis_rate.py` treat it as one
more mode. What differs from SAGIPS, as a user of DDP would have it: DDP averages the gradients of *all* generator
parameters (weights and biases) synchronously, bucketed and overlapped with the backward pass; every rank keeps its
own discriminator (not wrapped) and its own data subset. MPI is used only to start: rank 0 picks a free TCP port and
broadcasts its host and port, then `torch.distributed` runs on its own.
"""
from __future__ import annotations

import socket
import sys

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class DDPPeer:
    """What `sagips.run` needs from this baseline (it never imports this module): wrap the generator, name the mode
    for run.json, and close torch.distributed at the end."""

    mode = "ddp"

    def wrap(self, comm, G: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """Start torch.distributed over the ranks of `comm` and return G wrapped in DDP."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        backend = "nccl" if device.type == "cuda" else "gloo"
        host, port = comm.bcast((socket.gethostname(), _free_port()) if comm.rank == 0 else None, root=0)
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=comm.rank,
                                    world_size=comm.size)
        self.mode = f"ddp-{backend}"
        return DistributedDataParallel(G, device_ids=[device.index] if device.type == "cuda" else None,
                                       broadcast_buffers=False)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv=None) -> int:
    from sagips.run import main as run_main

    return run_main(argv, peer=DDPPeer())


if __name__ == "__main__":
    sys.exit(main())
