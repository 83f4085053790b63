"""Achieved FLOP/s against the device's measured matmul peak.

Training FLOPs are counted as in the AI4NP GPU poster (`../shared/papers/ai4np-gpu-poster.txt`): a forward pass
costs 2·Φ FLOPs per row and a backward pass 4·Φ, so one training step of a network with Φ parameters on `rows` rows
costs 6·Φ·rows. The peak is not a datasheet number: it is the rate of a large square matmul measured on the same
device, in the same dtype and the same process, so that a shared or throttled machine is compared with itself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
import time

import torch


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def train_flops(phi: int, rows: int) -> float:
    """FLOPs of one training step (forward + backward) of a network with `phi` parameters on `rows` rows."""
    return 6.0 * phi * rows


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else platform.processor())."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(m: int, k: int, n: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                min_seconds: float = 0.5) -> float:
    """Best FLOP/s of an (m×k) @ (k×n) matmul on `device` in `dtype` (2·m·k·n FLOPs per call).

    The best of several timed batches is reported (the machine's capability, not its average load).
    """
    device = torch.device(device)
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
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
        best = max(best, 2.0 * m * k * n * reps / dt)
        if dt < 0.05:
            reps *= 2
    return best


def matmul_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 0,
                min_seconds: float = 0.5) -> float:
    """Best FLOP/s of an n×n @ n×n matmul on `device` (n: 2048 on CPU, 8192 on CUDA when 0)."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 2048)
    return matmul_rate(n, n, n, device, dtype, min_seconds)


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameter numbers (glibc malloc.h)


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process instead of returning it to the kernel.

    Why: an activation of the paper's batch (204,800 rows × 128 floats = 105 MB) is above glibc's largest mmap
    threshold (32 MB), so every such tensor is a fresh mmap that the kernel must fault in and zero page by page, and
    is unmapped again when freed. On the 2-core VM of docs/benchmarks/flops.md this first touch ran at ~1 GB/s and
    took half of a CPU training step. With mmap off and trimming off, freed blocks are reused by the next step
    (the process keeps its peak heap, ~2 GB per rank at the paper's batch). Linux/glibc only; returns whether it
    was applied. Process-wide: call it once, in a process that trains on the CPU.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1))


def process_age_s(supervised: bool = False) -> float | None:
    """Seconds since the launched process started (the interpreter's own start-up and imports included).

    Read from /proc (Linux): the process's start in clock ticks after boot against the system's uptime. Under the
    supervisor of sagips.supervise the rank is a forked child: `supervised` measures from its parent, the process that
    the launcher started. None where /proc is not there.
    """
    pid = os.getppid() if supervised else os.getpid()
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None

