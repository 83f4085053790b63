"""Gradient offload and fusion: the generator's gradients live in ONE preallocated flat buffer.

Every exchanged `.grad` is a view into a contiguous device buffer (weights first, then biases), as DDP does with
`gradient_as_bucket_view`. Backward accumulates into those views in place, so fusion costs nothing. The exchanged
part (weights, or weights + biases with `comm.exchange_bias`) is a prefix of that buffer:

* on CPU the comm layer works on a numpy view of the prefix itself: no copy at all;
* on CUDA the prefix is copied once to a pinned float32 host buffer (one D2H), exchanged, and copied back (one H2D).

No allocation happens per step, and nothing here reads a device value on the host: the NaN guard (`mask_non_finite`)
decides on the device and its verdict travels to the host beside the gradients, in the same D2H copy that the
exchange waits for anyway (`weight`). So the step can be recorded as a CUDA graph (sagips/graph.py).
"""
from __future__ import annotations

import numpy as np
import torch


class GradBuffer:
    def __init__(self, model: torch.nn.Module, exchange_bias: bool = False):
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("GradBuffer: the model has no trainable parameters")
        weights = [p for p in params if p.ndim > 1]
        biases = [p for p in params if p.ndim <= 1]
        ordered = weights + biases
        device = ordered[0].device
        self.n_total = sum(p.numel() for p in ordered)
        self.n = sum(p.numel() for p in (ordered if exchange_bias else weights))  # the exchanged prefix
        self.flat = torch.zeros(self.n_total, dtype=torch.float32, device=device)
        offset = 0
        for p in ordered:
            k = p.numel()
            p.grad = self.flat[offset:offset + k].view_as(p)
            offset += k
        self._params = ordered
        self.device = device
        self.on_host = device.type == "cpu"
        if self.on_host:
            self.host = self.flat[: self.n]
        else:  # pinned memory makes the D2H/H2D copies asynchronous and fast
            self.host = torch.empty(self.n, dtype=torch.float32, pin_memory=True)
        self.array: np.ndarray = self.host.numpy()  # what the comm layer sees
        #: 1.0 where every gradient of this rank's last backward was finite, else 0.0 (its exchange weight)
        self.ok = torch.ones((), dtype=torch.float32, device=device)
        self.ok_host = self.ok if self.on_host else torch.ones((), dtype=torch.float32, pin_memory=True)
        self._ok_array = self.ok_host.view(1).numpy()

    def zero_(self) -> None:
        """Zero every gradient (use instead of optimizer.zero_grad(), which would drop the views)."""
        self.flat.zero_()

    def check_views(self) -> bool:
        """True while every .grad is still a view into the flat buffer (backward accumulated in place)."""
        base = self.flat.data_ptr()
        end = base + self.flat.numel() * self.flat.element_size()
        return all(p.grad is not None and base <= p.grad.data_ptr() < end for p in self._params)

    def mask_non_finite(self) -> torch.Tensor:
        """The NaN guard, on the device: where any gradient is NaN/Inf, zero them all (a rank never sends NaN) and
        record ok = 0. Returns the device bool `ok` (0-dim)."""
        ok = torch.isfinite(self.flat).all()
        self.flat.masked_fill_(~ok, 0.0)
        self.ok.copy_(ok)
        return ok

    def usable(self) -> torch.Tensor:
        """Device bool (0-dim): the gradients are finite and not all zero (an exchange where nobody contributed)."""
        return torch.isfinite(self.flat).all() & self.flat.ne(0).any()

    def offload_async(self) -> None:
        """Start the D2H copy of the exchanged gradients and of `ok` (no-op on CPU); `wait` before reading them."""
        if not self.on_host:
            self.host.copy_(self.flat[: self.n], non_blocking=True)
            self.ok_host.copy_(self.ok, non_blocking=True)

    def wait(self) -> np.ndarray:
        """Wait for `offload_async` (the comm layer reads host memory next); returns the numpy view."""
        if not self.on_host:
            torch.cuda.current_stream(self.device).synchronize()
        return self.array

    def offload(self) -> np.ndarray:
        """Move the exchanged gradients to the host buffer (no-op on CPU); returns the numpy view."""
        self.offload_async()
        return self.wait()

    @property
    def weight(self) -> float:
        """This rank's exchange weight from the last `mask_non_finite`, read from host memory (after `wait`)."""
        return float(self._ok_array[0])

    def load_back(self) -> None:
        """Copy the exchanged gradients back into the device gradients (no-op on CPU)."""
        if not self.on_host:
            self.flat[: self.n].copy_(self.host, non_blocking=True)
