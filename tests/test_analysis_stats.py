"""Eqs. 6-9 of the SAGIPS paper (sagips.analysis.stats) against hand-made cases and direct computations."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from sagips.analysis import stats
from sagips.analysis.ensemble import ensemble_from_generators, generator_outputs


class ConstG(nn.Module):
    """A generator whose output does not depend on the noise."""

    def __init__(self, value):
        super().__init__()
        self.value = torch.tensor(value, dtype=torch.float64)

    def forward(self, n):
        return self.value.expand(len(n), -1)


class AffineG(nn.Module):
    """G(n) = a + b * n[:, :P]: the output depends on the noise, so the batch average matters."""

    def __init__(self, a, b):
        super().__init__()
        self.a = torch.tensor(a, dtype=torch.float64)
        self.b = torch.tensor(b, dtype=torch.float64)

    def forward(self, n):
        return self.a + self.b * n[:, :len(self.a)]


def direct_mean_sigma(outputs):
    """Eqs. 7-8 written out with loops over noise vectors (M, K, P) -> averages over K."""
    m, k, p = outputs.shape
    means, sigmas = np.zeros((k, p)), np.zeros((k, p))
    for j in range(k):
        for i in range(p):
            col = [outputs[g, j, i] for g in range(m)]
            mu = sum(col) / m
            means[j, i] = mu
            sigmas[j, i] = math.sqrt(sum((c - mu) ** 2 for c in col) / m)
    return means.mean(0), sigmas.mean(0)


def test_eq7_eq8_constant_generators():
    values = [[1.0, 2.0, -3.0], [3.0, 2.0, -1.0], [2.0, 5.0, -2.0], [6.0, 3.0, -2.0]]
    gens = [ConstG(v) for v in values]
    noise = torch.randn(5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    truth = [2.0, 4.0, -2.0]
    res = ensemble_from_generators(gens, noise, truth)
    v = np.array(values)
    np.testing.assert_allclose(res.p_hat, [3.0, 3.0, -2.0])
    np.testing.assert_allclose(res.sigma, np.sqrt(((v - v.mean(0)) ** 2).mean(0)))  # population std (1/M)
    np.testing.assert_allclose(res.sigma[0], math.sqrt((4 + 0 + 1 + 9) / 4))
    np.testing.assert_allclose(res.residual, [(2 - 3) / 2, (4 - 3) / 4, 0.0], atol=1e-15)
    np.testing.assert_allclose(res.residual_sigma, res.sigma / np.abs(truth))


def test_eq7_eq8_noise_dependent_generators_average_over_the_batch():
    rng = np.random.default_rng(3)
    gens = [AffineG(rng.normal(size=4), rng.uniform(0.5, 2.0, size=4)) for _ in range(5)]
    noise = torch.randn(7, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = generator_outputs(gens, noise)
    assert out.shape == (5, 7, 4)
    # the same noise for every generator: the outputs are exactly a + b * n
    for g, o in zip(gens, out):
        np.testing.assert_allclose(o, (g.a + g.b * noise[:, :4]).numpy())
    p_hat, sigma = stats.ensemble_mean_sigma(out)
    want_p, want_s = direct_mean_sigma(out)
    np.testing.assert_allclose(p_hat, want_p, rtol=1e-12)
    np.testing.assert_allclose(sigma, want_s, rtol=1e-12)
    # sigma is the batch average of per-noise spreads, not the spread of the batch-averaged predictions
    assert not np.allclose(sigma, out.mean(1).std(0))


def test_to_physical_is_applied_per_generator():
    gens = [ConstG([0.0, 1.0]), ConstG([1.0, 0.5])]
    noise = torch.zeros(3, 2, dtype=torch.float64)
    lo, hi = torch.tensor([-1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 4.0], dtype=torch.float64)
    out = generator_outputs(gens, noise, lambda G, n: G(n) * (hi - lo) + lo)
    np.testing.assert_allclose(out[:, 0, :], [[-1.0, 4.0], [1.0, 2.0]])


def test_eq6_hand_made_with_sign():
    truth = [2.0, -0.5, 4.0, -0.5]
    p_hat = [1.5, -0.25, 5.0, -1.0]
    # under-shoot of a positive truth: positive; over-shoot: negative; for a negative truth the sign follows
    # (p - p^)/p as written, with no absolute value in the denominator
    np.testing.assert_allclose(stats.normalized_residuals(truth, p_hat), [0.25, 0.5, -0.25, -1.0])
    np.testing.assert_allclose(stats.residual_sigma(truth, [0.2, 0.1, 1.0, 0.05]), [0.1, 0.2, 0.25, 0.1])
    with pytest.raises(ValueError, match="0"):
        stats.normalized_residuals([1.0, 0.0], [1.0, 1.0])


def test_eq9_from_a_hand_made_run_json():
    info = {"world_size": 4, "events_per_epoch": 12800, "epochs": 1000, "train_seconds": [10.0, 12.5, 11.0, 9.0]}
    assert stats.run_analysis_rate(info) == pytest.approx(4 * 12800 * 1000 / 12.5)
    assert stats.run_analysis_rate(info) == pytest.approx(4_096_000.0)
    assert stats.analysis_rate(1, 102400, 100_000, 3600.0) == pytest.approx(102400 * 100_000 / 3600)
    assert stats.run_analysis_rate({"world_size": 2, "events_per_epoch": 10, "status": "running"}) is None
    with pytest.raises(ValueError):
        stats.analysis_rate(1, 1, 1, 0.0)


def test_resampling_draws_distinct_members():
    rng = np.random.default_rng(0)
    preds = rng.normal(loc=[1.0, 2.0], scale=0.3, size=(3, 4, 2))
    truth = [1.0, 2.0]
    out = stats.resample_rmse_spread(preds, truth, [2, 3], 40, np.random.default_rng(1))
    full = stats.ensemble(preds, truth)
    np.testing.assert_allclose(out[3][0], full.rmse)  # M = N: every draw is the whole ensemble
    np.testing.assert_allclose(out[3][1], full.spread)
    pairs = {(round(r.rmse, 12), round(r.spread, 12)) for r in
             (stats.ensemble(preds[list(c)], truth) for c in ((0, 1), (0, 2), (1, 2)))}
    got = {(round(a, 12), round(b, 12)) for a, b in zip(*out[2])}
    assert got <= pairs and len(got) > 1  # only real pairs of distinct runs, and not always the same one
    # RMSE and spread by hand for one pair
    r = stats.ensemble(preds[[0, 2]], truth)
    assert r.rmse == pytest.approx(math.sqrt(np.mean(r.residual ** 2)))
    assert r.spread == pytest.approx(np.mean(r.sigma / np.abs(truth)))


def test_confidence_ellipse_axis_aligned():
    x = np.array([2.0, -2.0, 0.0, 0.0])
    y = np.array([0.0, 0.0, 1.0, -1.0])
    e = stats.confidence_ellipse(x + 5, y + 7, 0.95)
    k2 = -2 * math.log(0.05)  # 5.991: chi-square(2) at 95%
    assert (e["x"], e["y"]) == pytest.approx((5.0, 7.0))
    assert e["width"] == pytest.approx(2 * math.sqrt(k2 * 8 / 3))  # sample variance of x: 8/3
    assert e["height"] == pytest.approx(2 * math.sqrt(k2 * 2 / 3))
    assert abs(math.sin(math.radians(e["angle_deg"]))) < 1e-9
    assert stats.confidence_ellipse(np.ones(5), np.ones(5)) is None  # degenerate
