"""train.amp: which precision the network passes run in, chosen by the hardware (`auto`) or by the user.

On a CPU, bf16 autocast is fast only where the CPU has native bf16 arithmetic (AVX-512 BF16 or AMX); elsewhere torch
emulates it and the critic runs several times slower than in float32. `auto` therefore takes bf16 on a CPU only where
the CPU reports native bf16, torch dispatches AVX-512 kernels (not where it is held to AVX2), *and* a start-up probe
(the run's own critic at the run's own critic batch, forward and backward in the trainer's row chunks, warmed up,
the two precisions alternated over several rounds; the ratio of the medians, with a 10 % margin) measures it faster;
otherwise float32. A probe of a few milliseconds on one chunk was noise on a shared machine: it chose float32 in 2
runs of 3 where bf16 was 1.37x faster per epoch (issue 38). On CUDA, `auto` takes bf16
where the GPU has it (Ampere and newer: no loss scaling, so no replica skips a step on an overflow) and fp16 with a
GradScaler elsewhere. The pipeline always runs in float32.

`resolve` returns the autocast dtype and a record for run.json and the start-up line.
"""
from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

#: bf16 must be at least this much faster than float32 in the probe for `auto` to take it on a CPU
AUTO_BF16_MAX_RATIO = 0.9

_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_NAMES = {None: "float32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_name(dtype: torch.dtype | None) -> str:
    return _NAMES[dtype]


def cpu_capability() -> str:
    """torch's vector ISA for this CPU (e.g. 'AVX2', 'AVX512'), as its kernels dispatch."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001  (an old or exotic build)
        return "unknown"


def cpu_native_bf16() -> bool:
    """True where the CPU computes bf16 natively (AVX-512 BF16 or AMX tiles), as torch itself detects it."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(bool(f()) for f in checks if callable(f))


def dispatch_has_bf16(capability: str) -> bool:
    """Whether torch's kernels, at the vector ISA they dispatch (`cpu_capability`), can use the CPU's bf16 units: only
    at AVX-512 (AMX included). A CPU with AVX-512 BF16 whose torch is held to AVX2 (ATEN_CPU_CAPABILITY=avx2, with
    ONEDNN_MAX_CPU_ISA=AVX2) emulates bf16 like a CPU without it."""
    return capability.upper().startswith("AVX512")


def _first_linear(module: torch.nn.Module) -> torch.nn.Linear | None:
    return next((m for m in module.modules() if isinstance(m, torch.nn.Linear)), None)


def probe(D: torch.nn.Module, device: torch.device, rows: int = 2048, reps: int = 3,
          chunk_rows: Callable[[torch.dtype | None], int] | None = None) -> dict[str, Any] | None:
    """Milliseconds of the run's own critic pass, forward + backward over `rows` rows (the trainer passes the
    critic's batch of one epoch), in the row chunks the trainer would use in each precision (`chunk_rows(dtype)`;
    None: one pass), in float32 and under bf16 autocast.

    One warm-up pass of each, then `reps` rounds that alternate the two, so that load on a shared machine hits both
    alike. The decision takes the ratio of the medians; the record keeps every round's ratio (the spread). The
    critic's weights and gradients and the training's random streams are left as they were (it runs on a copy).
    None where the critic has no Linear layer to size the input by.
    """
    import copy

    from sagips.chunked import chunked_loss

    first = _first_linear(D)
    if first is None:
        return None
    net = copy.deepcopy(D).to(device)
    gen = torch.Generator(device=device).manual_seed(0)  # the training's random streams are left untouched
    x = torch.randn(rows, first.in_features, device=device, generator=gen)
    params = list(net.parameters())

    def once(dtype: torch.dtype | None) -> float:
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = chunked_loss(lambda xs: net(xs).float().sum() / rows, (x,), params,
                                chunk_rows(dtype) if chunk_rows is not None else 0)
        loss.backward()
        net.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return 1e3 * (time.perf_counter() - t0)

    once(None), once(torch.bfloat16)  # warm-up: allocations, kernel selection, oneDNN's primitive caches
    fp32, bf16 = [], []
    for _ in range(max(1, reps)):
        fp32.append(once(None))
        bf16.append(once(torch.bfloat16))
    f, b = statistics.median(fp32), statistics.median(bf16)
    ratios = sorted(round(y / x, 3) for x, y in zip(fp32, bf16))
    return {"rows": rows, "reps": len(fp32), "fp32_ms": round(f, 3), "bf16_ms": round(b, 3),
            "bf16_ratio": round(b / f, 3), "round_ratios": ratios}


def unavailable(mode: str, device: torch.device) -> str | None:
    """Why train.amp=`mode` cannot run on `device` (None: it can); sagips.run refuses it in one line before any work."""
    if mode == "fp16" and device.type != "cuda":
        return (f"train.amp=fp16 needs CUDA (this rank runs on {device}); use train.amp=bf16 or none (or auto: a "
                f"resumed run keeps the precision its start resolved unless another is set)")
    return None


def resolve(mode: str, device: torch.device, D: torch.nn.Module | None = None, rows: int = 2048,
            _probe=probe, chunk_rows: Callable[[torch.dtype | None], int] | None = None
            ) -> tuple[torch.dtype | None, dict[str, Any]]:
    """(autocast dtype or None for float32, record) for train.amp=`mode` on `device`.

    The record holds the resolved precision, why, the CPU capability, whether the CPU has native bf16, and the
    probe's figures where a probe ran. An explicit bf16 on a CPU without native bf16 still runs, with one warning
    that names the measured slowdown; fp16 on a CPU is an error.
    """
    info: dict[str, Any] = {"requested": mode, "device": str(device)}
    if device.type == "cpu":
        info["cpu_capability"] = cpu_capability()
        flag = cpu_native_bf16()
        info["native_bf16"] = native = flag and dispatch_has_bf16(info["cpu_capability"])
        if flag and not native:
            info["native_bf16_held_back"] = True  # the CPU has it, torch's dispatch does not use it
    if mode not in ("auto", *_DTYPES):
        raise ValueError(f"train.amp={mode!r}: expected auto, none, bf16 or fp16")
    why = unavailable(mode, device)
    if why:
        raise RuntimeError(why)
    if mode != "auto":
        dtype = _DTYPES[mode]
        info["reason"] = f"train.amp={mode}"  # (a preset's, an environment's default or the user's)
        if device.type == "cpu" and dtype is torch.bfloat16 and not native:
            info["probe"] = p = _probe(D, device, rows, chunk_rows=chunk_rows) if D is not None else None
            slower = f"{p['bf16_ratio']:.1f}x slower than float32 in the start-up probe" if p else "emulated"
            msg = (f"train.amp=bf16 on a CPU without native bf16 ({info['cpu_capability']}): torch emulates it, "
                   f"{slower}; train.amp=auto or none is faster here")
            info["warning"] = msg
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
    elif device.type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        dtype = torch.bfloat16 if bf16 else torch.float16
        info["reason"] = ("auto: the GPU has bf16 (no loss scaling needed)" if bf16 else
                          "auto: no bf16 on this GPU, fp16 with loss scaling")
    elif not native:
        dtype = None
        info["reason"] = (f"auto: torch dispatches {info['cpu_capability']} on this CPU, so its bf16 units are unused"
                          if info.get("native_bf16_held_back") else
                          f"auto: this CPU ({info['cpu_capability']}) has no native bf16")
    else:
        p = info["probe"] = _probe(D, device, rows, chunk_rows=chunk_rows) if D is not None else None
        fast = p is not None and p["bf16_ratio"] <= AUTO_BF16_MAX_RATIO
        dtype = torch.bfloat16 if fast else None
        info["reason"] = ("auto: native bf16, " + (f"{p['bf16_ratio']:.2f}x the float32 time in the probe" if p
                                                   else "no probe possible (critic without a Linear layer)")
                          + ("" if fast else f", not faster than {AUTO_BF16_MAX_RATIO}x: float32"))
    info["resolved"] = dtype_name(dtype)
    return dtype, info


def describe(info: dict[str, Any]) -> str:
    """One line for the start-up message, e.g. 'precision float32 (auto: this CPU (AVX2) has no native bf16)'."""
    text = f"precision {info['resolved']} ({info['reason']}"
    p = info.get("probe")
    if p and "ratio" not in info["reason"] and "x the float32" not in info["reason"]:
        text += f"; probe: bf16 {p['bf16_ratio']:.2f}x float32"
    return text + ")"
