"""Proxy 1D theory and its differentiable inverse-CDF sampler (SAGIPS paper section V; reference/proxy1d.md).

    u(x) = p0 x^p1 (1-x)^p2        d(x) = p3 x^p4 (1-x)^p5
    sigma1 = 4u + d  ("proton-like")    sigma2 = 4d + u  ("neutron-like")

One event is the pair (x ~ sigma1, x ~ sigma2). Everything is batched over parameter sets: p has shape (B, 6) and
no Python loop runs over sets or events.
"""
from __future__ import annotations

import torch

TRUE_PARAMS = (2.1875, -0.5, 3.0, 1.09375, -0.5, 4.0)
PARAM_MIN = (0.0, -1.0, 0.0, 0.0, -1.0, 0.0)
PARAM_MAX = (3.0, 1.0, 5.0, 3.0, 1.0, 5.0)


def make_grid(n: int = 1000, x_min: float = 0.1, x_max: float = 0.99999, device=None,
              dtype=torch.float32) -> torch.Tensor:
    return torch.linspace(x_min, x_max, n, device=device, dtype=dtype)


def sigmas(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Structure functions on the grid. p: (B, 6) physical parameters, x: (G,) -> (B, 2, G)."""
    logx, log1mx = torch.log(x), torch.log1p(-x)
    # exp(a log x + b log(1-x)) evaluates the powers for all sets at once; (B, 2, G) for u and d
    expo = p[:, (1, 4), None] * logx + p[:, (2, 5), None] * log1mx
    ud = p[:, (0, 3), None] * torch.exp(expo)
    u, d = ud[:, 0], ud[:, 1]
    return torch.stack((4 * u + d, 4 * d + u), dim=1)


def cumulative_trapezoid(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Cumulative trapezoid integral along the last axis, starting at 0. y: (..., G) -> (..., G)."""
    dx = x[1:] - x[:-1]
    areas = 0.5 * (y[..., 1:] + y[..., :-1]) * dx
    return torch.cat((torch.zeros_like(y[..., :1]), torch.cumsum(areas, dim=-1)), dim=-1)


def norms_and_cdf(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(norms (B, 2), normalised CDFs (B, 2, G)) for physical parameters p (B, 6)."""
    integral = cumulative_trapezoid(sigmas(p, x), x)
    norms = integral[..., -1]
    return norms, integral / norms[..., None]


def sample_inverse_cdf(cdf: torch.Tensor, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling, batched and differentiable w.r.t. the CDF values.

    cdf: (..., G) non-decreasing from 0 to 1 on grid x (G,); u: (..., E) uniforms in [0, 1).
    Returns (..., E) samples. The bin index comes from `torch.searchsorted` and is not differentiated; the
    gradient reaches the parameters through the CDF values at the two bin edges (linear interpolation in the bin).
    """
    n = cdf.shape[-1]
    hi = torch.searchsorted(cdf.detach().contiguous(), u.contiguous(), right=True).clamp_(1, n - 1)
    lo = hi - 1
    c_lo, c_hi = torch.gather(cdf, -1, lo), torch.gather(cdf, -1, hi)
    x_lo, x_hi = x[lo], x[hi]
    width = (c_hi - c_lo).clamp_min(torch.finfo(cdf.dtype).tiny)
    return x_lo + (u - c_lo) / width * (x_hi - x_lo)


def to_physical(p_unit: torch.Tensor, pmin: torch.Tensor, pmax: torch.Tensor) -> torch.Tensor:
    """Map generator output in [0, 1]^6 to physical parameters."""
    return p_unit * (pmax - pmin) + pmin


def sample_events(p: torch.Tensor, x: torch.Tensor, events_per_set: int, gen: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Events for every parameter set: ((B * E, 2) events, (B, 2) norms)."""
    norms, cdf = norms_and_cdf(p, x)
    u = torch.rand((p.shape[0], 2, events_per_set), generator=gen, device=p.device, dtype=p.dtype)
    xs = sample_inverse_cdf(cdf, x, u)  # (B, 2, E)
    return xs.transpose(1, 2).reshape(-1, 2), norms
