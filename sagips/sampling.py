"""A differentiable inverse-CDF sampler and its grid helpers, batched over parameter sets (pure torch).

    x = make_grid(1000, 0.0, 1.0)                      # (G,)
    f = density(p, x)                                  # (B, G) >= 0, unnormalised, one row per parameter set
    norms, cdf = normalized_cdf(f, x)                  # (B,), (B, G) from 0 to 1
    u = torch.rand(B, E)                               # uniforms in [0, 1)
    events = sample_inverse_cdf(cdf, x, u)             # (B, E), differentiable w.r.t. p through the CDF

The gradient reaches the parameters through the CDF values at the two edges of each event's bin (linear
interpolation inside the bin); the bin index itself comes from `torch.searchsorted` and is not differentiated.
Used by proxy1d (sagips_environments.proxy1d.theory) and by `sagips.ParametricEnvironment`'s `density` form.
"""
from __future__ import annotations

import torch


def make_grid(n: int, x_min: float, x_max: float, device=None, dtype=torch.float32) -> torch.Tensor:
    """n evenly spaced points from x_min to x_max, both included: (n,)."""
    return torch.linspace(x_min, x_max, n, device=device, dtype=dtype)


def cumulative_trapezoid(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Cumulative trapezoid integral along the last axis, starting at 0. y: (..., G), x: (G,) -> (..., G)."""
    dx = x[1:] - x[:-1]
    areas = 0.5 * (y[..., 1:] + y[..., :-1]) * dx
    return torch.cat((torch.zeros_like(y[..., :1]), torch.cumsum(areas, dim=-1)), dim=-1)


def normalized_cdf(y: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(integrals (...,), CDFs (..., G) normalised to end at 1) of non-negative densities y (..., G) on grid x."""
    integral = cumulative_trapezoid(y, x)
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
    """Map generator output in [0, 1]^P to physical parameters in [pmin, pmax]."""
    return p_unit * (pmax - pmin) + pmin
