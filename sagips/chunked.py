"""Row-chunked losses: the forward and backward of each chunk of rows run back to back, while its activations are
still in the CPU's cache.

A critic step at the paper's batch pushes 204,800 rows through 128-wide layers: every activation is 105 MB, so
each elementwise pass (bias, LeakyReLU and their backward, the bias-gradient sums) streams from main memory, and on a
CPU that memory traffic, not the matmuls, sets the pace. When a loss is a sum over rows, it can be computed chunk by
chunk: a chunk of a few thousand rows keeps its activations in cache from its forward to its backward. The gradient
of each chunk is computed during the forward, as in fused "linear + cross-entropy" kernels; the backward then only
multiplies the stored gradients by the incoming scalar (e.g. a GradScaler's scale). The result equals the unchunked
loss and gradients up to the order of float summation. Memory falls too: no activation of the full batch is kept.

    loss = chunked_loss(lambda x, t: bce(D(x), t, reduction="sum") / n, (events, targets), D.parameters(), 4096)
    loss.backward()          # D's .grad, and events' gradient if events requires grad (e.g. from a generator)

Pure torch (no MPI). On a GPU, where one large batch is what the device wants, use chunk_rows = 0 (one chunk: the
ordinary autograd graph).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch

#: the activations a CPU chunk may hold per thread (bytes): measured best on the 2-core development machine (AMD EPYC,
#: 1 MiB L2 per core, 32 MiB L3) for the proxy critic in fp32 and bf16, 1 and 2 threads; docs/benchmarks/flops.md
CPU_CHUNK_BYTES = 8 << 20


def auto_chunk_rows(requested: int, device: torch.device, net: torch.nn.Module | None = None, threads: int = 1,
                    elem_bytes: int = 4) -> int:
    """train.chunk_rows resolved: `requested` if >= 0; for -1 (auto): 0 on CUDA (one large batch is what a GPU
    wants), else the rows whose activations in `net` (the sum of its Linear layers' output widths, `elem_bytes`
    each: 4 for float32, 2 under bf16 autocast) fill CPU_CHUNK_BYTES per thread, rounded to a power of two, at
    least 256. (More threads want larger chunks: each matmul is split between them.)"""
    if requested >= 0:
        return requested
    if device.type == "cuda":
        return 0
    width = sum(m.out_features for m in net.modules() if isinstance(m, torch.nn.Linear)) if net is not None else 0
    rows = CPU_CHUNK_BYTES * max(1, threads) / (elem_bytes * max(1, width))
    return max(256, 1 << round(math.log2(max(1.0, rows))))


def chunked_loss(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor],
                 params: Iterable[torch.Tensor], chunk_rows: int) -> torch.Tensor:
    """sum over row chunks c of fn(*(t[c] for t in inputs)), differentiable w.r.t. `inputs` and `params`.

    fn: maps row slices of `inputs` (all with the same first dimension) to a scalar; the total must be the sum of
        the chunks' values (a mean over all rows: divide each chunk's sum by the total row count inside fn).
    params: the tensors inside fn to differentiate (e.g. the critic's parameters); those with requires_grad=False
        (a frozen critic in the generator step) get no gradient and cost nothing.
    chunk_rows: rows per chunk; 0 or >= the row count: one plain autograd call (no chunking).
    """
    inputs = tuple(inputs)
    n = inputs[0].shape[0]
    if any(t.shape[0] != n for t in inputs):
        raise ValueError(f"chunked_loss: inputs have different row counts {[t.shape[0] for t in inputs]}")
    params = [p for p in params if p.requires_grad]
    if chunk_rows <= 0 or chunk_rows >= n or not torch.is_grad_enabled():
        return fn(*inputs)
    return _Chunked.apply(fn, chunk_rows, len(inputs), *inputs, *params)


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, chunk_rows, n_inputs, *tensors):
        inputs, params = tensors[:n_inputs], tensors[n_inputs:]
        device = inputs[0].device.type
        grad_inputs = [torch.empty_like(t) if t.requires_grad else None for t in inputs]
        grad_params = [torch.zeros_like(p) for p in params]
        total = None
        n = inputs[0].shape[0]
        with torch.enable_grad():
            for start in range(0, n, chunk_rows):
                sl = slice(start, min(n, start + chunk_rows))
                parts = [t[sl].detach().requires_grad_(t.requires_grad) for t in inputs]
                value = fn(*parts)  # under the caller's autocast, if any
                targets = [x for x in parts if x.requires_grad] + list(params)
                with torch.autocast(device, enabled=False):  # backward passes do not run under autocast
                    grads = torch.autograd.grad(value, targets, allow_unused=True) if targets else ()
                k = 0
                for i, x in enumerate(parts):
                    if x.requires_grad:
                        g = grads[k]
                        k += 1
                        if g is None:
                            grad_inputs[i][sl].zero_()
                        else:
                            grad_inputs[i][sl].copy_(g)
                for acc, g in zip(grad_params, grads[k:]):
                    if g is not None:
                        acc.add_(g)
                value = value.detach()
                total = value if total is None else total + value
        ctx.save_for_backward(*[g for g in grad_inputs if g is not None], *grad_params)
        ctx.wanted = [g is not None for g in grad_inputs]
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        out: list[torch.Tensor | None] = [None, None, None]
        for w in ctx.wanted:
            out.append(saved.pop(0) * grad_out if w else None)
        out.extend(g * grad_out for g in saved)
        return tuple(out)
