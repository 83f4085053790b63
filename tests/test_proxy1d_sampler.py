"""The inverse-CDF sampler against the analytic CDF, and its gradient against finite differences."""
import numpy as np
import pytest
import torch
from scipy import special, stats

from sagips_environments.proxy1d import theory

TRUE = torch.tensor([theory.TRUE_PARAMS], dtype=torch.float64)


def analytic_cdf(xs, p, which, x_min=0.1, x_max=0.99999):
    """Exact CDF of sigma_k on [x_min, x_max] from incomplete beta functions (independent of the grid code)."""
    p0, p1, p2, p3, p4, p5 = p

    def prim(x, a, b):  # integral_0^x t^a (1-t)^b dt
        return special.betainc(a + 1, b + 1, x) * special.beta(a + 1, b + 1)

    cu, cd = (4.0, 1.0) if which == 0 else (1.0, 4.0)

    def F(x):
        return cu * p0 * prim(x, p1, p2) + cd * p3 * prim(x, p4, p5)

    return (F(np.asarray(xs)) - F(x_min)) / (F(x_max) - F(x_min))


@pytest.mark.parametrize("which", [0, 1])
def test_sampler_matches_analytic_cdf(which):
    x = theory.make_grid(1000, dtype=torch.float64)
    gen = torch.Generator().manual_seed(7)
    events, norms = theory.sample_events(TRUE, x, 100_000, gen)
    sample = events[:, which].numpy()
    res = stats.kstest(sample, lambda v: analytic_cdf(v, theory.TRUE_PARAMS, which))
    assert res.pvalue > 1e-3, f"KS test rejects the sampler for sigma{which + 1}: D={res.statistic:.4g}"
    assert sample.min() >= 0.1 and sample.max() <= 0.99999


def test_ks_detects_wrong_parameters():
    """The KS check has power: events at other parameters are rejected against the true CDF."""
    x = theory.make_grid(1000, dtype=torch.float64)
    p = TRUE.clone()
    p[0, 1] = -0.45  # a 10% change of one exponent
    events, _ = theory.sample_events(p, x, 100_000, torch.Generator().manual_seed(7))
    res = stats.kstest(events[:, 0].numpy(), lambda v: analytic_cdf(v, theory.TRUE_PARAMS, 0))
    assert res.pvalue < 1e-6


def test_norms_match_analytic_integral():
    x = theory.make_grid(1000, dtype=torch.float64)
    norms, _ = theory.norms_and_cdf(TRUE, x)
    p0, p1, p2, p3, p4, p5 = theory.TRUE_PARAMS

    def F(xv, cu, cd):
        return (cu * p0 * special.betainc(p1 + 1, p2 + 1, xv) * special.beta(p1 + 1, p2 + 1)
                + cd * p3 * special.betainc(p4 + 1, p5 + 1, xv) * special.beta(p4 + 1, p5 + 1))

    exact = [F(0.99999, 4, 1) - F(0.1, 4, 1), F(0.99999, 1, 4) - F(0.1, 1, 4)]
    np.testing.assert_allclose(norms[0].numpy(), exact, rtol=2e-4)


def test_batched_sampling_has_no_cross_talk():
    """Each parameter set's events depend on that set only (batching is exact)."""
    x = theory.make_grid(200, dtype=torch.float64)
    p = torch.cat([TRUE, TRUE * torch.tensor([1.1, 0.5, 1.2, 0.9, 0.5, 0.8], dtype=torch.float64)])
    _, cdf = theory.norms_and_cdf(p, x)
    u = torch.rand((2, 2, 50), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    both = theory.sample_inverse_cdf(cdf, x, u)
    one = theory.sample_inverse_cdf(cdf[1:], x, u[1:])
    assert torch.equal(both[1:], one)


def test_gradient_reaches_all_parameters_and_matches_finite_differences():
    x = theory.make_grid(1000, dtype=torch.float64)
    u = torch.rand((1, 2, 500), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w = torch.randn((1, 2, 500), generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def f(p):  # a smooth scalar of the samples and norms, with fixed uniforms (the sampler is then deterministic)
        norms, cdf = theory.norms_and_cdf(p, x)
        return (theory.sample_inverse_cdf(cdf, x, u) * w).sum() + norms.sum()

    p = TRUE.clone().requires_grad_(True)
    f(p).backward()
    grad = p.grad[0].numpy()
    assert np.all(np.abs(grad) > 1e-6), f"some parameter gets no gradient: {grad}"
    eps = 1e-6
    fd = []
    for i in range(6):
        e = torch.zeros_like(TRUE)
        e[0, i] = eps
        fd.append(((f(TRUE + e) - f(TRUE - e)) / (2 * eps)).item())
    np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-6)
