"""Achieved FLOP/s against the device's measured matmul peak.

Training FLOPs are counted as in the AI4NP GPU poster (`../shared/papers/ai4np-gpu-poster.txt`): a forward pass
costs 2·Φ FLOPs per row and a backward pass 4·Φ, so one training step of a network with Φ parameters on `rows` rows
costs 6·Φ·rows. The peak is not a datasheet number: it is the rate of a large square matmul measured on the same
device, in the same dtype and the same process, so that a shared or throttled machine is compared with itself.
"""
from __future__ import annotations

import time

import torch


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def train_flops(phi: int, rows: int) -> float:
    """FLOPs of one training step (forward + backward) of a network with `phi` parameters on `rows` rows."""
    return 6.0 * phi * rows


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 0,
                min_seconds: float = 0.5) -> float:
    """Best FLOP/s of an n×n @ n×n matmul on `device` (n: 2048 on CPU, 8192 on CUDA when 0).

    The best of several timed batches is reported (the machine's capability, not its average load).
    """
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=c)  # warm-up (kernel selection, page faults)
    sync(device)
    best, spent, reps = 0.0, 0.0, 1
    while spent < min_seconds:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        sync(device)
        dt = time.perf_counter() - t0
        spent += dt
        best = max(best, 2.0 * n ** 3 * reps / dt)
        if dt < 0.05:
            reps *= 2
    return best
