"""Proxy 1D theory and its differentiable inverse-CDF sampler (SAGIPS paper section V; reference/proxy1d.md).

    u(x) = p0 x^p1 (1-x)^p2        d(x) = p3 x^p4 (1-x)^p5
    sigma1 = 4u + d  ("proton-like")    sigma2 = 4d + u  ("neutron-like")

One event is the pair (x ~ sigma1, x ~ sigma2). Everything is batched over parameter sets: p has shape (B, 6) and
no Python loop runs over sets or events. The sampler itself lives in `sagips.sampling` (re-exported here).
"""
from __future__ import annotations

import torch

from sagips import sampling
from sagips.sampling import cumulative_trapezoid, normalized_cdf, sample_inverse_cdf, to_physical  # noqa: F401

TRUE_PARAMS = (2.1875, -0.5, 3.0, 1.09375, -0.5, 4.0)
PARAM_MIN = (0.0, -1.0, 0.0, 0.0, -1.0, 0.0)
PARAM_MAX = (3.0, 1.0, 5.0, 3.0, 1.0, 5.0)


def make_grid(n: int = 1000, x_min: float = 0.1, x_max: float = 0.99999, device=None,
              dtype=torch.float32) -> torch.Tensor:
    return sampling.make_grid(n, x_min, x_max, device=device, dtype=dtype)


def grid_logs(x: torch.Tensor) -> torch.Tensor:
    """(log x, log(1 - x)) on the grid, (2, G): constants of a run, computed once (Proxy1D keeps them)."""
    return torch.stack((torch.log(x), torch.log1p(-x)))


def sigmas(p: torch.Tensor, x: torch.Tensor, logs: torch.Tensor | None = None) -> torch.Tensor:
    """Structure functions on the grid. p: (B, 6) physical parameters, x: (G,), logs: grid_logs(x) -> (B, 2, G)."""
    logx, log1mx = grid_logs(x) if logs is None else logs
    # exp(a log x + b log(1-x)) evaluates the powers for all sets at once; (B, 2, G) for u and d. Strided slices
    # (columns 1, 4 / 2, 5 / 0, 3) are views: an index tuple would be a host-to-device copy on every call.
    expo = p[:, 1::3, None] * logx + p[:, 2::3, None] * log1mx
    ud = p[:, 0::3, None] * torch.exp(expo)
    u, d = ud[:, 0], ud[:, 1]
    return torch.stack((4 * u + d, 4 * d + u), dim=1)


def norms_and_cdf(p: torch.Tensor, x: torch.Tensor, logs: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(norms (B, 2), normalised CDFs (B, 2, G)) for physical parameters p (B, 6)."""
    return normalized_cdf(sigmas(p, x, logs), x)


def sample_events(p: torch.Tensor, x: torch.Tensor, events_per_set: int, gen: torch.Generator | None = None,
                  logs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Events for every parameter set: ((B * E, 2) events, (B, 2) norms)."""
    norms, cdf = norms_and_cdf(p, x, logs)
    u = torch.rand((p.shape[0], 2, events_per_set), generator=gen, device=p.device, dtype=p.dtype)
    xs = sample_inverse_cdf(cdf, x, u)  # (B, 2, E)
    return xs.transpose(1, 2).reshape(-1, 2), norms
