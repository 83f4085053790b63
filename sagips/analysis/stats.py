"""Ensemble statistics of the SAGIPS paper, section VI (eqs. 6-9). Pure numpy: no torch, no MPI.

Shapes used throughout:
    preds   (M, K, P)  predictions of M generators (or runs) for the same K noise vectors, P physical parameters
    truth   (P,)       the true parameters p_i (loop-closure test)

    eq. 6   r_i   = (p_i - p^_i) / p_i                      normalised residual (positive: the ensemble undershoots)
    eq. 7   p^    = (1/M) sum_m G_m(n)                      ensemble prediction for one noise vector n
    eq. 8   sigma = sqrt((1/M) sum_m (G_m(n) - p^)^2)       its spread (population std, ddof=0)
            both eq. 7 and eq. 8 are averaged over the batch of K noise vectors
    eq. 9   rate  = N(ranks) * N_disc * N_epochs / training time     events analysed per second
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def ensemble_mean_sigma(preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 7 and 8 for a batch of noise vectors: (p^, sigma), each of shape (P,).

    `preds` has shape (M, K, P): the ensemble mean and standard deviation over M are taken per noise vector, then
    averaged over the K noise vectors. A (M, P) array is read as K = 1.
    """
    a = np.asarray(preds, dtype=np.float64)
    if a.ndim == 2:
        a = a[:, None, :]
    if a.ndim != 3 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"preds must have shape (M, K, P) with M, K >= 1, got {a.shape}")
    mean_k = a.mean(axis=0)                                   # (K, P): eq. 7 per noise vector
    sigma_k = np.sqrt(((a - mean_k) ** 2).mean(axis=0))       # (K, P): eq. 8 per noise vector
    return mean_k.mean(axis=0), sigma_k.mean(axis=0)


def normalized_residuals(truth: Sequence[float], p_hat: np.ndarray) -> np.ndarray:
    """Eq. 6: r_i = (p_i - p^_i) / p_i (dimensionless). `p_hat` may carry leading axes (..., P)."""
    t = np.asarray(truth, dtype=np.float64)
    if np.any(t == 0):
        raise ValueError("a true parameter is 0: the normalised residual (p - p^)/p is undefined")
    return (t - np.asarray(p_hat, dtype=np.float64)) / t


def residual_sigma(truth: Sequence[float], sigma: np.ndarray) -> np.ndarray:
    """The 1 sigma of the normalised residual: sigma_i / |p_i| (eq. 8 divided like eq. 6)."""
    t = np.asarray(truth, dtype=np.float64)
    if np.any(t == 0):
        raise ValueError("a true parameter is 0: the normalised residual (p - p^)/p is undefined")
    return np.asarray(sigma, dtype=np.float64) / np.abs(t)


def analysis_rate(n_ranks: int, n_disc: int, n_epochs: int, seconds: float) -> float:
    """Eq. 9: events analysed per second, N(ranks) * N_disc * N_epochs / training time [s]."""
    if not seconds > 0:
        raise ValueError(f"training time must be > 0 s, got {seconds!r}")
    return float(n_ranks) * float(n_disc) * float(n_epochs) / float(seconds)


def run_analysis_rate(run_info: dict[str, Any]) -> float | None:
    """Eq. 9 for one `sagips.run` output (its run.json as a dict): world_size, events_per_epoch, epochs, and the
    slowest rank's training seconds, max(train_seconds). None when the run has not finished (no timings)."""
    secs = run_info.get("train_seconds")
    epochs = run_info.get("epochs")
    if not secs or not epochs or not max(secs) > 0:
        return None
    return analysis_rate(int(run_info["world_size"]), int(run_info["events_per_epoch"]), int(epochs), max(secs))


@dataclass
class EnsembleResult:
    """Eqs. 6-8 of one ensemble at one time step; all arrays have shape (P,)."""

    p_hat: np.ndarray           #: eq. 7, averaged over the noise batch (physical units)
    sigma: np.ndarray           #: eq. 8, averaged over the noise batch (physical units)
    residual: np.ndarray        #: eq. 6 of p_hat (dimensionless)
    residual_sigma: np.ndarray  #: sigma / |p| (dimensionless)

    @property
    def rmse(self) -> float:
        """Root mean square over parameters of the normalised residuals."""
        return float(np.sqrt(np.mean(self.residual ** 2)))

    @property
    def spread(self) -> float:
        """Mean over parameters of the normalised 1 sigma."""
        return float(np.mean(self.residual_sigma))

    @property
    def mean_abs_residual(self) -> float:
        """Mean over parameters of |r_i| (Fig. 15/16, bottom)."""
        return float(np.mean(np.abs(self.residual)))


def ensemble(preds: np.ndarray, truth: Sequence[float]) -> EnsembleResult:
    """Eqs. 6-8 in one call: `preds` (M, K, P), `truth` (P,)."""
    p_hat, sigma = ensemble_mean_sigma(preds)
    if p_hat.shape != np.shape(truth):
        raise ValueError(f"predictions have {p_hat.shape[0]} parameters but the truth has {len(truth)}")
    return EnsembleResult(p_hat, sigma, normalized_residuals(truth, p_hat), residual_sigma(truth, sigma))


def resample_rmse_spread(preds: np.ndarray, truth: Sequence[float], sizes: Sequence[int], n_samples: int,
                         rng: np.random.Generator) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Fig. 9: for each ensemble size M in `sizes`, draw `n_samples` times M of the N runs (without replacement
    inside one draw) and return {M: (rmse (S,), spread (S,))} of those sub-ensembles.

    `preds` has shape (N, K, P): one prediction per run (already averaged over the run's ranks).
    """
    a = np.asarray(preds, dtype=np.float64)
    n = a.shape[0]
    out = {}
    for m in sizes:
        if not 1 <= m <= n:
            raise ValueError(f"ensemble size {m} is not in 1..{n}")
        rmse = np.empty(n_samples)
        spread = np.empty(n_samples)
        for s in range(n_samples):
            res = ensemble(a[rng.choice(n, size=m, replace=False)], truth)
            rmse[s], spread[s] = res.rmse, res.spread
        out[int(m)] = (rmse, spread)
    return out


def confidence_ellipse(x: np.ndarray, y: np.ndarray, level: float = 0.95) -> dict[str, float] | None:
    """The `level` contour of a 2D Gaussian fitted to the points (x, y): centre, full axes and angle [degrees].

    None when the points do not span two dimensions (fewer than 3 points, or a degenerate covariance).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 3:
        return None
    cov = np.cov(np.vstack([x, y]))
    vals, vecs = np.linalg.eigh(cov)
    if not np.all(np.isfinite(vals)) or vals[0] <= 1e-15 * max(vals[1], 1e-300):
        return None
    k2 = -2.0 * math.log(1.0 - level)  # chi-square quantile for 2 degrees of freedom
    major = vecs[:, 1]
    return {"x": float(x.mean()), "y": float(y.mean()), "width": float(2 * math.sqrt(k2 * vals[1])),
            "height": float(2 * math.sqrt(k2 * vals[0])),
            "angle_deg": float(math.degrees(math.atan2(major[1], major[0]))), "level": float(level)}
