"""Fisher preconditioning of the generator's predicted parameters (environment.precondition=fisher).

A fit whose parameters are strongly correlated has a long, flat valley in its loss. The critic's gradient along the
valley is small beside its noise across it, and Adam, which scales each weight's step by that weight's gradient
noise, then barely moves along the valley: on toy1d (correlations -0.97 and +0.89) every run stopped at the point
where it first met the valley, 7 sigma from its data's maximum-likelihood fit (docs/benchmarks/coverage.notes.md).

`FisherPreconditioner` multiplies the gradient that reaches the generator's output u (the parameters in the box's unit
coordinates) by M = I(u)^(-1/2), the inverse square root of the data's Fisher information per event. The critic's
gradient noise has about the shape of I (the score's covariance), so after M it is the same in every direction,
and Adam's per-weight scaling no longer favours the steep directions: a direction with eigenvalue lambda then
moves at a rate ~ sqrt(lambda) instead of ~ lambda / sqrt(lambda_max). The full inverse, I^-1, does not do this
under Adam: it makes the noise ~ I^-1, now dominated by the flat direction, and every direction crawls (tried:
toy1d stopped where it started). The forward pass is the identity, so the parameters, the events and every loss
are unchanged. M lives in one device buffer that `refresh` overwrites in place between epochs (a recorded CUDA
graph replays the new values).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


#: the largest condition number of I_u that is whitened in full (toy1d: below 1e4 anywhere in its box); beyond it
#: the smallest eigenvalues are raised to the largest / MAX_CONDITION, so no direction gets more than sqrt(1e6) =
#: 1000x the step of the steepest one
MAX_CONDITION = 1e6


class _Scale(torch.autograd.Function):
    """y = u; dL/du = dL/dy @ M (M symmetric)."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(m)
        return u.view_as(u)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (m,) = ctx.saved_tensors
        return grad @ m.to(grad.dtype), None


def unit_inverse_sqrt(fisher: np.ndarray, width: np.ndarray) -> np.ndarray | None:
    """M = I_u^(-1/2) scaled to trace P, where I_u = D I_p D is the Fisher information of the unit coordinates u
    (p = low + D u, D = diag(width)); None where I_u is not positive definite (the previous M is then kept)."""
    d = np.asarray(width, dtype=np.float64)
    info = np.asarray(fisher, dtype=np.float64) * d[:, None] * d[None, :]
    info = (info + info.T) / 2
    if not np.all(np.isfinite(info)):
        return None
    w, v = np.linalg.eigh(info)
    if not w[0] > 1e-12 * w[-1]:
        return None
    w = np.maximum(w, MAX_CONDITION ** -1 * w[-1])  # a nearly unconstrained direction: at most 1000x the step
    m = (v / np.sqrt(w)) @ v.T
    return m * (len(d) / np.trace(m))


class FisherPreconditioner:
    """The preconditioner of P parameters on `device`: `apply(u)` in the training step, `refresh(fisher, width)`
    between epochs, `state()`/`load(state)` for --resume."""

    def __init__(self, n: int, device: torch.device):
        self.m = torch.eye(n, device=device)

    def apply(self, u: torch.Tensor) -> torch.Tensor:
        return _Scale.apply(u, self.m)

    def refresh(self, fisher: np.ndarray | None, width: Any) -> bool:
        """Take M from the Fisher information per event at the current prediction; False (M kept) where there is
        none or it is singular."""
        m = None if fisher is None else unit_inverse_sqrt(fisher, np.asarray(width))
        if m is None:
            return False
        self.m.copy_(torch.as_tensor(m, dtype=self.m.dtype))
        return True

    def state(self) -> list[list[float]]:
        return self.m.tolist()

    def load(self, state: list[list[float]]) -> None:
        self.m.copy_(torch.as_tensor(state, dtype=self.m.dtype))
