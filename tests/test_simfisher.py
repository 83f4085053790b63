"""The Fisher information of a simulator's events (sagips/simfisher.py, ParametricEnvironment.fisher in the simulate
form) against independent truths: a Gaussian's analytic information, smear1d's from its density (scipy's
exponentially modified Gaussian, integrated on a fine grid), and a Gaussian clipped to a support (its density plus the
point mass at the edge, integrated)."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats as st

from sagips import ParametricEnvironment
from sagips.analysis import stats
from sagips.config import from_dict


def simulator_env(name, parameters, simulate, **attrs):
    """A simulate-form environment, its truth at its bounds' middle, built with its defaults."""
    truth = {k: (lo + hi) / 2 for k, (lo, hi) in parameters.items()}
    cls = type(name, (ParametricEnvironment,), {"name": name, "parameters": parameters, "true_params": truth,
                                                "simulate": simulate, **attrs})
    return cls(from_dict(cls.Config, {}, "environment."), "cpu", 0)


def gaussian(self, p, u):
    z = math.sqrt(2.0) * torch.erfinv(2.0 * u.clamp(1e-7, 1 - 1e-7) - 1.0)
    return p[:, None, 0:1] + p[:, None, 1:2] * z


def test_a_simulated_gaussian_has_its_analytic_information():
    """x = mu + s z: I = diag(1/s^2, 2/s^2) per event (the scale's information lies in the tails)."""
    env = simulator_env("test_simfisher_gauss", {"mu": (-1.0, 2.0), "s": (0.1, 1.0)}, gaussian)
    for s in (0.3, 0.8):
        info = env.fisher([0.2, s])
        ratio = np.diag(info) / [1 / s ** 2, 2 / s ** 2]  # binning loses information: one-sided, beside the noise
        assert np.all((ratio > 0.98) & (ratio < 1.01)), ratio
        assert abs(info[0, 1]) < 0.02 / s ** 2


def exponnorm_information(p, lo, hi):
    """smear1d's information from its density (scipy), by central differences and the trapezoid rule, plus the point
    masses of the events clipped to the detector's edges, (dP/dp)^2 / P (above hi: 3 % of tau's at tau = 1.6)."""
    x = np.linspace(lo, hi, 400_001)

    def f(q):
        return st.exponnorm.pdf(x, q[0] / q[1], loc=0.0, scale=q[1])

    def masses(q):
        return np.array([st.exponnorm.cdf(lo, q[0] / q[1], scale=q[1]), st.exponnorm.sf(hi, q[0] / q[1], scale=q[1])])

    p, h = np.asarray(p, dtype=np.float64), 1e-5
    d = [(f(p + h * e) - f(p - h * e)) / (2 * h) for e in np.eye(2)]
    f0 = f(p)
    m = f0 > 1e-300
    info = np.array([[integrate.trapezoid(d[i][m] * d[j][m] / f0[m], x[m]) for j in range(2)] for i in range(2)])
    dm = np.stack([(masses(p + h * e) - masses(p - h * e)) / (2 * h) for e in np.eye(2)])  # (P, edges)
    held = masses(p) > 0
    return info + (dm[:, held] / masses(p)[held]) @ dm[:, held].T


def test_smear1d_information_matches_its_density():
    """The example simulator (an exponential decay smeared by a Gaussian resolution; its events clipped to the
    detector's range): the information and the Cramér-Rao bound against the exponentially modified Gaussian's."""
    from tests._plugins import SMEAR_SRC
    import sys

    sys.path.insert(0, str(SMEAR_SRC))
    try:
        from sagips_smear1d import Smear1D
    finally:
        del sys.path[0]
    env = Smear1D(from_dict(Smear1D.Config, {}, "environment."), "cpu", 0)
    for p in ([1.0, 0.2], [0.6, 0.45]):
        want = exponnorm_information(p, *Smear1D.support)
        got = env.fisher(p)
        ratio = np.diag(got) / np.diag(want)  # binning loses information (the bound's side: larger), noise ~0.5 %
        assert np.all((ratio > 0.97) & (ratio < 1.015)), ratio
        np.testing.assert_allclose(stats.cramer_rao(got, 10 ** 6), stats.cramer_rao(want, 10 ** 6), rtol=0.015)


@pytest.mark.parametrize("clip", [0.35, 0.5, 0.7])
def test_events_clipped_to_a_support_keep_the_point_mass_information(clip):
    """N(mu, s) clipped to (-10, clip): the events above it sit at the edge with no derivative. Its information is
    the density's below the edge plus the point mass's, (dP/dp)^2 / P. No kernel reaches the point mass, and the
    events beside it keep a bin of their own wherever the clip falls."""
    env = simulator_env(f"test_simfisher_clip{clip}", {"mu": (-1.0, 2.0), "s": (0.1, 1.0)}, gaussian,
                        support=(-10.0, clip))
    mu, s = 0.1, 0.5
    z = (clip - mu) / s
    x = np.linspace(mu - 12 * s, clip, 400_001)
    y = (x - mu) / s
    f = st.norm.pdf(y) / s
    score = np.stack([y / s, (y * y - 1) / s])  # d log f / d(mu, s)
    dens = integrate.trapezoid(score[:, None] * score[None] * f, x, axis=2)
    mass, dmass = st.norm.sf(z), st.norm.pdf(z) * np.array([1 / s, z / s])
    want = dens + np.outer(dmass, dmass) / mass
    got = env.fisher([mu, s])
    ratio = np.diag(got) / np.diag(want)  # noise ~1.5 % here
    assert np.all((ratio > 0.95) & (ratio < 1.03)), ratio
    assert abs(got[0, 1] - want[0, 1]) < 0.05 * math.sqrt(want[0, 0] * want[1, 1])


def test_a_simulator_without_a_derivative_has_none():
    """Events that do not move with p have no information estimate (None, not 0), nor do discrete ones; analyze's
    note says why."""
    still = simulator_env("test_simfisher_still", {"a": (0.2, 1.0)}, lambda self, p, u: u + 0.0 * p.sum().detach())
    assert still.fisher([0.5]) is None
    steps = simulator_env("test_simfisher_steps", {"a": (0.2, 1.0)}, lambda self, p, u: torch.floor(10 * p[:, None] + u))
    assert steps.fisher([0.5]) is None  # a discrete simulator: its events have no derivative
    from sagips.analysis.ensemble import _fisher_at

    assert "no finite derivative" in _fisher_at(steps, np.array([0.5]))


def bivariate(self, p, u):
    """(x1, x2) = (mu + s z1, rho z1 + sqrt(1 - rho^2) z2): two columns whose correlation is a parameter."""
    z = math.sqrt(2.0) * torch.erfinv(2.0 * u.clamp(1e-7, 1 - 1e-7) - 1.0)
    mu, s, rho = p[:, None, 0], p[:, None, 1], p[:, None, 2]
    return torch.stack((mu + s * z[..., 0], rho * z[..., 0] + torch.sqrt(1 - rho ** 2) * z[..., 1]), dim=-1)


def test_events_of_two_columns_have_the_bivariate_gaussians_information():
    """Two columns (sagips/simfisher.py, cell_fisher), strongly correlated (rho = -0.8): the information of a
    Gaussian of covariance C(p), dm^T C^-1 dm + tr(C^-1 dC_i C^-1 dC_j) / 2, in Cramér-Rao bounds within 3 %, the
    correlation's included (its information lies between the columns; 2^20 events: noise ~2 %)."""
    env = simulator_env("test_simfisher_bivariate", {"mu": (-1.0, 1.5), "s": (0.5, 2.0), "rho": (-0.95, 0.75)},
                        bivariate, event_width=2)
    mu, s, rho = 0.0, 1.2, -0.8  # (the truth, at the bounds' middle, is not used)
    cov = np.array([[s * s, rho * s], [rho * s, 1.0]])
    ci = np.linalg.inv(cov)
    dm = [np.array([1.0, 0.0]), np.zeros(2), np.zeros(2)]
    dc = [np.zeros((2, 2)), np.array([[2 * s, rho], [rho, 0.0]]), np.array([[0.0, s], [s, 0.0]])]
    want = np.array([[dm[i] @ ci @ dm[j] + 0.5 * np.trace(ci @ dc[i] @ ci @ dc[j]) for j in range(3)]
                     for i in range(3)])
    from sagips import simfisher

    got = simfisher.binned_fisher(env._events, torch.tensor([mu, s, rho]), 2, n_events=1 << 20)
    ratio = np.sqrt(np.diag(np.linalg.inv(got)) / np.diag(np.linalg.inv(want)))
    assert np.all((ratio > 0.96) & (ratio < 1.04)), ratio
    assert np.allclose(got, want, atol=0.06 * np.sqrt(np.outer(np.diag(want), np.diag(want))))


def test_columns_that_add_nothing_are_dropped_and_wide_events_get_none():
    """A column that is a sum of the others (its rounding noise is not information), a constant one, or one that
    does not move with p (first, where decorrelation leaves it as it is) leave the information of mu + z as it is:
    1 + 0.25 with a second column 0.5 mu + z', else 1 (2^18 events: noise ~3 %). Four columns: none, and analyze's
    note says why."""
    def z(u):
        return math.sqrt(2.0) * torch.erfinv(2.0 * u.clamp(1e-7, 1 - 1e-7) - 1.0)

    from sagips import simfisher

    cases = {1.25: lambda q, u: torch.stack((q[:, None, 0] + z(u[..., 0]), 0.5 * q[:, None, 0] + z(u[..., 1]),
                                             1.5 * q[:, None, 0] + z(u[..., 0]) + z(u[..., 1])), -1),
             1.0: lambda q, u: torch.stack((z(u[..., 0]), torch.zeros_like(u[..., 0]), q[:, None, 0] + z(u[..., 1])),
                                           -1)}
    for want, sim in cases.items():
        got = simfisher.binned_fisher(sim, torch.tensor([0.3]), 3, n_events=1 << 18)
        assert got is not None and abs(got[0, 0] / want - 1) < 0.06, (want, got)
    env = simulator_env("test_simfisher_four", {"mu": (-1.0, 2.0)},
                        lambda self, p, u: torch.stack([p[:, None, 0] + z(u[..., i]) for i in range(4)], -1),
                        event_width=4, n_uniforms=4)
    assert env.fisher([0.3]) is None
    from sagips.analysis.ensemble import _fisher_at

    assert "up to 3 columns, and this simulator's have 4" in _fisher_at(env, np.array([0.3]))


def test_a_parameter_the_events_ignore_gives_a_singular_information():
    """Events that depend on a + b only: the matrix is returned (not None), analyze's inverse refuses it and its
    note says the information is singular."""
    def summed(self, p, u):
        return gaussian(self, torch.stack((p[:, 0] + p[:, 1], torch.full_like(p[:, 0], 0.5)), dim=1), u)

    env = simulator_env("test_simfisher_sum", {"a": (0.1, 1.0), "b": (0.1, 1.0)}, summed)
    info = env.fisher([0.5, 0.3])
    assert info is not None and np.allclose(info, info[0, 0], rtol=0.02)  # I = (1/s^2) [[1, 1], [1, 1]]
    assert stats.cramer_rao(info, 100) is None
    assert any("singular" in n for n in stats.correlated_pairs(info, ["a", "b"]))


def test_the_estimate_repeats_within_its_noise():
    """Two streams of uniforms: the bound differs by under 1 % (its noise is ~0.3 % at the default 2^21 events)."""
    from sagips.simfisher import binned_fisher

    env = simulator_env("test_simfisher_repeat", {"mu": (-1.0, 2.0), "s": (0.1, 1.0)}, gaussian)
    a = stats.cramer_rao(binned_fisher(env._events, torch.tensor([0.0, 0.5]), 1, seed=1), 100)
    b = stats.cramer_rao(binned_fisher(env._events, torch.tensor([0.0, 0.5]), 1, seed=11), 100)
    np.testing.assert_allclose(a, b, rtol=0.01)
