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
from collections.abc import Mapping, Sequence
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


# ------------------------------------------------------------------------------------------------ quotable sigma
#: the last fraction of the checkpoints' epochs over which the drift (a parameter still moving) is measured
DRIFT_FRACTION = 0.2
#: a parameter that moved more than this many sigma over the last DRIFT_FRACTION of the epochs is "still moving"
DRIFT_THRESHOLD = 1.0
#: ... or more than this many of the data's Cramér-Rao bounds, where the bound is known: members that disagree widely
#: make sigma wide, and a movement small against it can still be a fit far from settled at the data's precision
#: (seen: a new user's detector resolution, a member still climbing 2-4 bounds over the last 20 % from an early
#: collapse, the mean 0.8 sigma and 1.7-2.1 bounds: "converged", 3-4 sigma_ML below the ML fit; of the calibrated
#: profiles at today's defaults, 1 parameter of 180 toy1d records moves more than 1.5 bounds where its spread does not
#: already call it moving, none of proxy1d's 480 or smear1d's 40)
DRIFT_BOUNDS = 1.5
#: what the diagnostic tells a user whose parameter still moves
DRIFT_ADVICE = "train longer, or raise environment.events_per_sample"


def drift_advice(infos: Sequence[dict]) -> str:
    """DRIFT_ADVICE with the runs' events per parameter set (run.json: the value `auto` chose, or the config's
    number), so that the user knows what to raise it from."""
    def used(info: dict) -> Any:
        sized = info.get("batch_sized") or {}
        return sized.get("events_per_sample") or ((info.get("config") or {}).get("environment") or {}).get(
            "events_per_sample")

    values = sorted({v for v in map(used, infos) if isinstance(v, int) and not isinstance(v, bool)})
    if not values or len(values) > 3:  # (unknown, or runs of many sizes: no one number to raise)
        return DRIFT_ADVICE
    auto = all((i.get("batch_sized") or {}).get("events_per_sample") for i in infos)
    return f"{DRIFT_ADVICE} ({'/'.join(map(str, values))} here{', chosen by auto' if auto else ''})"


#: what to do where nothing judges the movement (one rank, or ranks that exchange): more members, then analyze
UNJUDGED_ADVICE = "train several members (--ensemble-size) and run sagips.analyze"


def member_scatter(values: np.ndarray) -> np.ndarray:
    """s_i: the sample standard deviation (ddof=1) over M members of their predictions, `values` (M, P) -> (P,);
    NaN where M < 2 (one member has no spread)."""
    v = np.asarray(values, dtype=np.float64)
    if v.shape[0] < 2:
        return np.full(v.shape[1:], np.nan)
    return v.std(axis=0, ddof=1)


def seen_fraction(subset_fraction: float, coupled_ranks: int) -> float:
    """The effective fraction of the reference data one member learns from, as `members_factor` needs it: each of its
    R = `coupled_ranks` ranks keeps a random `subset_fraction` f. Ranks that exchange gradients average their
    losses, so an event held by c ranks counts c times (not the union of the subsets): the member's sampling
    variance is sigma_stat^2 (1 - f) / (R f), i.e. seen = R f / (R f + 1 - f) (f for one rank). (Checked by
    simulation in review: R = 2 and 4 at f = 0.5 give 0.50 and 0.25 sigma_stat^2, the union 1 - (1 - f)^R would
    give 0.33 and 0.07.)"""
    f, r = float(subset_fraction), max(1, int(coupled_ranks))
    return r * f / (r * f + 1.0 - f)


def members_factor(seen: float | None, n_members: int, shared_data: bool) -> float:
    """sigma(p^) = s * factor: from the scatter s of M members to the error of their mean p^ against the truth.

    - Members that share ONE reference data set, each learning from a random fraction `seen` of it (half-sampling):
      a member's estimate is theta_data + delta_m, where theta_data is what the whole data set gives (its statistical
      error sigma_stat against the truth) and Var(delta_m) = sigma_stat^2 (1/seen - 1) + sigma_train^2. Then
      s^2 estimates sigma_stat^2 (1/seen - 1) + sigma_train^2, and the error of the mean of M members is
      sigma_stat^2 (1 + (1/seen - 1)/M) + sigma_train^2/M <= s^2 (seen/(1 - seen) + 1/M): factor^2 = seen/(1-seen)
      + 1/M (exact for the statistical part, conservative for the training part). seen = 0.5: factor^2 = 1 + 1/M.
      Where the data's Cramér-Rao bound is known, `split_scatter` takes sigma_stat from it instead, and the training
      part is then exact too.
    - Members with independent data sets (separate runs, each generating its own from its seed), or with disjoint
      parts of one data set (ensemble.data=split): the mean of M independent estimates, factor = 1/sqrt(M), exact
      for the statistical and the training noise alike.
    - seen = 1 (every member learns from all the data) or unknown: the scatter holds no statistical error; factor =
      1/sqrt(M), the training noise of the mean alone (the caller says so).
    """
    m = max(1, int(n_members))
    if not half_sampled(seen, shared_data):
        return 1.0 / math.sqrt(m)
    return math.sqrt(seen / (1.0 - seen) + 1.0 / m)


#: the two-sided probabilities of the intervals analyze quotes: +-1 and +-2 standard deviations of a Gaussian
P68, P95 = 0.682689492137, 0.954499736104


def t_quantile(q: float, dof: float) -> float:
    """Student's t quantile: x with P(T <= x) = q for T ~ t(dof), q in [0.5, 1), dof >= 1 (inf: the Gaussian).

    Numpy only (scipy is not a run-time dependency). With x = sqrt(dof) tan(theta) the t density becomes
    c cos(theta)^(dof - 1) dtheta, c = Gamma((dof+1)/2) / (sqrt(pi) Gamma(dof/2)), which is integrated on a fine grid
    of [0, pi/2) (where the density exceeds e^-80) and inverted; tests compare it with scipy.stats.t.ppf."""
    if not 0.5 <= q < 1.0:
        raise ValueError(f"t_quantile: q must be in [0.5, 1), got {q}")
    if not math.isfinite(dof) or dof > 1e4:
        from statistics import NormalDist
        return NormalDist().inv_cdf(q)
    if dof < 1:
        raise ValueError(f"t_quantile: dof must be >= 1, got {dof}")
    top = math.pi / 2 if dof <= 1 else min(math.pi / 2, math.acos(math.exp(-80.0 / (dof - 1.0))))  # density > e^-80
    theta = np.linspace(0.0, top, 20001)
    dens = np.cos(theta) ** (dof - 1.0)
    c = math.exp(math.lgamma((dof + 1.0) / 2.0) - math.lgamma(dof / 2.0)) / math.sqrt(math.pi)
    cum = np.concatenate([[0.0], np.cumsum((dens[1:] + dens[:-1]) / 2.0 * np.diff(theta))]) * c
    return math.sqrt(dof) * math.tan(float(np.interp(q - 0.5, cum, theta)))


def interval_factor(p: float, dof: float) -> float:
    """Half-width of the central interval of probability p in units of sigma, when sigma is estimated with `dof`
    degrees of freedom (Student's t; inf: a Gaussian, 1 for p = P68)."""
    return t_quantile(0.5 + p / 2.0, dof)


def drift_window(epochs: Sequence[int], fraction: float = DRIFT_FRACTION) -> np.ndarray:
    """Indices of the checkpoints in the last `fraction` of the epochs (epoch >= (1 - fraction) * last epoch),
    at least the last two."""
    e = np.asarray(epochs, dtype=np.float64)
    idx = np.nonzero(e >= (1.0 - fraction) * e[-1])[0]
    if len(idx) < 2:
        idx = np.arange(max(0, len(e) - 2), len(e))
    return idx


def drift(epochs: Sequence[int], series: np.ndarray, fraction: float = DRIFT_FRACTION) -> tuple[np.ndarray, int, int]:
    """How far each parameter moved over the last `fraction` of the epochs: the least-squares slope of `series`
    (T, P) against the epoch over `drift_window`, times the window's span; (moved (P,), first epoch, last epoch).
    Fewer than two checkpoints: zero movement over an empty window."""
    s = np.asarray(series, dtype=np.float64)
    e = np.asarray(epochs, dtype=np.float64)
    if len(e) < 2:
        return np.zeros(s.shape[1:]), int(e[-1]) if len(e) else 0, int(e[-1]) if len(e) else 0
    idx = drift_window(e, fraction)
    x, y = e[idx], s[idx]
    xc = x - x.mean()
    slope = (xc[:, None] * (y - y.mean(axis=0))).sum(axis=0) / (xc ** 2).sum()
    return slope * (x[-1] - x[0]), int(x[0]), int(x[-1])


@dataclass
class Uncertainty:
    """p^_i +- sigma_i of one ensemble, with its parts (all (P,), physical units). See docs/analysis.md."""

    p_hat: np.ndarray     #: the mean over the members at the last checkpoint
    sigma: np.ndarray     #: sqrt(spread^2 + drift^2 [where drift_added] + sampling^2 + nonclosure^2): to quote
    spread: np.ndarray    #: the spread part of sigma: `members`, or without members ranks/sqrt(R), or 0
    #: the members' scatter turned into the error of p^: s * members_factor, or with the data's bound
    #: `split_scatter` (NaN: M < 2)
    members: np.ndarray
    scatter: np.ndarray   #: s: the sample standard deviation of single members (NaN: M < 2)
    ranks: np.ndarray     #: pooled standard deviation of the ranks inside a run (NaN: no run has 2 ranks)
    drift: np.ndarray     #: |movement of p^| over the last DRIFT_FRACTION of the epochs
    sampling: np.ndarray  #: the Monte-Carlo error of p^ from the finite batch of K noise vectors it averages
    drift_added: np.ndarray  #: (P,) bool: the drift is a part of sigma (`drift_in_sigma`)
    n_members: int
    factor: float         #: members = scatter * factor (where no bound splits the scatter, `split_scatter`)
    spread_from: str      #: "members", "ranks" (a lower bound: no independent members) or "none"
    notes: list[str]      #: what sigma does not contain, in words
    #: (P,) the Cramér-Rao bound of the data set (`cramer_rao`; density environments), or None
    cramer_rao: np.ndarray | None = None
    #: (P,) bool: the spread part is the data's floor (`data_floor`), not the members' scatter; None: no floor known
    floored: np.ndarray | None = None
    #: (P,) the part of the spread sampled from the members (their M - 1 degrees of freedom), where a known part
    #: (the bound's, `split_scatter`) is in it too; None: the spread, or the members' part where not floored
    sampled: np.ndarray | None = None
    #: (P,) the systematic part of sigma (`nonclosure_part`, analysis.nonclosure; 0: none)
    nonclosure: np.ndarray | None = None

    @property
    def dof(self) -> np.ndarray:
        """Degrees of freedom of sigma, per parameter (`effective_dof`): M - 1 and more where the fixed drift and
        noise parts weigh in; inf where sigma does not come from members' scatter (or its spread is the data's
        floor, which is not sampled)."""
        # the sampled part: the members' (a floor that replaced it, or that adds to it, is known, not sampled)
        sampled = (self.sampled if self.sampled is not None else self.spread if self.floored is None
                   else np.where(self.floored, 0.0, self.members))
        return effective_dof(sampled, self.sigma, self.n_members, self.spread_from == "members")

    @property
    def k68(self) -> np.ndarray:
        """The 68.3 % interval is p^ +- k68 sigma (Student's t with `dof`: 1.20 for 4 members alone, 1 for many)."""
        return np.array([interval_factor(P68, d) for d in self.dof])

    @property
    def k95(self) -> np.ndarray:
        """The 95.4 % interval (+-2 sigma of a Gaussian) is p^ +- k95 sigma (3.31 for 4 members alone, 2 for many)."""
        return np.array([interval_factor(P95, d) for d in self.dof])


def effective_dof(spread: np.ndarray, sigma: np.ndarray, n_members: int, from_members: bool) -> np.ndarray:
    """Welch-Satterthwaite degrees of freedom of sigma^2 = spread^2 + drift^2 + noise^2 (+ nonclosure^2), where only
    the members' spread is sampled (M - 1 degrees of freedom) and the drift, the noise's Monte-Carlo error and the
    non-closure count as known:
    dof = (M - 1) (sigma / spread)^4 (P,); inf without members or where the spread is 0."""
    sp = np.abs(np.asarray(spread, dtype=np.float64))
    sg = np.asarray(sigma, dtype=np.float64)
    if not from_members or n_members < 2:
        return np.full(sg.shape, math.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (n_members - 1) * (sg / sp) ** 4
    return np.where(np.isfinite(d) & (sp > 0), d, math.inf)


#: the note's words for a sigma without the data's statistical error (analyze's interval line points to it)
NO_STATISTICS = "sigma holds their training noise but no statistical error of the data"


def uncertainty(member_values: np.ndarray, rank_sigma: np.ndarray, n_ranks: int, moved: np.ndarray,
                seen: float | None, shared_data: bool, sampling: np.ndarray | None = None,
                bound: np.ndarray | None = None, nonclosure: float | Mapping[str, float] = 0.0,
                nonclosure_from: str = "analysis.nonclosure", names: Sequence[str] | None = None) -> Uncertainty:
    """p^ +- sigma from the members' predictions (M, P) at the last checkpoint, the pooled rank spread (P,) of runs
    of `n_ranks` ranks, the drift `moved` (P,) of p^ (see `drift`), the Monte-Carlo error `sampling` (P,) of the
    noise average (see `noise_sampling_error`; None: 0) and the data set's Cramér-Rao bound `bound` (P,) (density
    environments; None: unknown), which floors the members' part (`data_floor`, `spread_with_floor`), and a
    systematic of `nonclosure` bounds (`nonclosure_part`, analysis.nonclosure; `nonclosure_from` names where it came
    from) added to sigma in quadrature."""
    v = np.asarray(member_values, dtype=np.float64)
    m = v.shape[0]
    p_hat = v.mean(axis=0)
    scatter = member_scatter(v)
    factor = members_factor(seen, m, shared_data)
    members = scatter * factor
    ranks = np.asarray(rank_sigma, dtype=np.float64)
    dr = np.abs(np.asarray(moved, dtype=np.float64))
    notes, floored, sampled = [], None, None
    whole = shared_data and (seen is None or seen >= 1.0)  # every member learned from all the data
    if m >= 2:
        spread, source = members, "members"
        if bound is not None and half_sampled(seen, shared_data):  # the bound splits the scatter (`split_scatter`)
            members, floored, sampled = split_scatter(scatter, bound, seen, m)
            spread = members
        elif bound is not None:  # the data's floor (`data_floor`): the larger part, or added to training noise alone
            spread, floored = spread_with_floor(members, data_floor(bound, seen, m, shared_data), not whole)
        if whole:
            notes.append(f"the members all learn from the whole data set: {NO_STATISTICS}" if bound is None else
                         "the members all learn from the whole data set: their scatter holds their training noise, "
                         "and sigma adds the data's Cramér-Rao bound to it")
    elif np.all(np.isfinite(ranks)):
        spread, source = ranks / math.sqrt(max(1, n_ranks)), "ranks"
        if bound is None:
            notes.append("one member: sigma holds the spread of its ranks (training noise) but no statistical error, "
                         "a lower bound; train several members (--ensemble-size, or runs with different --seed)")
        else:  # the ranks' spread is training noise; the data's error of what the run learned from adds to it
            spread, floored = spread_with_floor(spread, data_floor(bound, seen, 1, True), False)
            notes.append("one member: sigma holds the spread of its ranks (training noise) and the data's Cramér-Rao "
                         "bound for what the run learned from, the error of an efficient fit: a lower bound where "
                         "the GAN falls short of that; train several members (--ensemble-size, or runs with "
                         "different --seed)")
    else:
        spread, source = np.zeros_like(p_hat), "none"
        notes.append("one generator: no spread, sigma is the drift alone; train several members")
    mc = np.zeros_like(p_hat) if sampling is None else np.abs(np.asarray(sampling, dtype=np.float64))
    given = nonclosure_factors(nonclosure, names, len(p_hat), nonclosure_from).any()  # (first: its name errors)
    nc = nonclosure_part(nonclosure, bound, names)
    if given and nc is None:
        notes.append(f"the non-closure {nonclosure_text(nonclosure)} ({nonclosure_from}) is a number of the data's "
                     "Cramér-Rao bounds, which are not known here: not applied, so σ holds no systematic of the "
                     "training")
    elif nc is not None:
        notes.append(f"σ includes a systematic of the training (non-closure) of {nonclosure_text(nonclosure)} × the "
                     f"data's "
                     f"Cramér-Rao bound ({nonclosure_from}; a calibration on data of known truth measures it: "
                     "docs/analysis.md)")
    sigma, added = compose_sigma(spread, dr, mc, source == "members", nc, bound)
    u = Uncertainty(p_hat, sigma, spread, members, scatter, ranks, dr, mc, added, m, factor, source, notes)
    u.nonclosure = np.zeros_like(p_hat) if nc is None else nc
    u.cramer_rao, u.floored = (None if bound is None else np.asarray(bound, dtype=np.float64)), floored
    u.sampled = sampled
    return u


def half_sampled(seen: float | None, shared_data: bool) -> bool:
    """Do the members share one data set, each learning from a random fraction `seen` < 1 of it?"""
    return shared_data and seen is not None and seen < 1.0


def split_scatter(scatter: np.ndarray, bound: np.ndarray, seen: float, n_members: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(members part of sigma, floored, its sampled part) (each (P,)) of M members that share one data set, each
    learning from a random fraction `seen` < 1 of it, where the data's Cramér-Rao bound b is known.

    `members_factor`'s model: s^2 estimates sigma_stat^2 (1/seen - 1) + sigma_train^2, and the error of the mean of
    M members is sigma_stat^2 (1 + (1/seen - 1)/M) + sigma_train^2/M. Without b, all of s^2 is scaled as if it were
    statistical (conservative: training noise that averages over M members is counted as if it did not). With
    sigma_stat = b, the training part is what the scatter holds beyond the statistical one, and the error is
    b^2 + max(s^2, b^2 (1/seen - 1))/M: exact for an efficient member (one whose error on its subset is the bound's);
    a member that is less efficient on the data than the bound puts its excess in the training part, which
    benchmarks/coverage.py measures. Where s^2 < b^2 (1/seen - 1) the members agree more than the data allow: the
    part is the data's floor (`data_floor`; floored). The sampled part, s/sqrt(M) (0 where floored), is what carries
    the members' M - 1 degrees of freedom (`Uncertainty.dof`); the bound's part is known."""
    s = np.asarray(scatter, dtype=np.float64)
    b = np.asarray(bound, dtype=np.float64)
    m = max(1, int(n_members))
    stat = b ** 2 * (1.0 / seen - 1.0)  # the statistical part of one member's scatter
    ok = np.isfinite(b)
    low = ok & ~(s ** 2 >= stat)  # (a NaN scatter: the floor)
    part = np.sqrt(b ** 2 + np.where(low, stat, s ** 2) / m)
    members = np.where(ok, part, s * members_factor(seen, m, True))  # (no bound: the scale-all rule, all sampled)
    return members, low, np.where(low, 0.0, np.where(ok, s / math.sqrt(m), members))


def compose_sigma(spread: np.ndarray, drift: np.ndarray, sampling: np.ndarray, from_members: bool,
                  nonclosure: np.ndarray | None = None, bound: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(sigma, drift added (P,) bool): sigma = sqrt(spread^2 + drift^2 [where `drift_in_sigma`, with the data's
    Cramér-Rao `bound` where known] + sampling^2 + nonclosure^2) (`nonclosure_part`; None: 0)."""
    sp, dr, mc = (np.abs(np.asarray(v, dtype=np.float64)) for v in (spread, drift, sampling))
    nc = np.zeros_like(sp) if nonclosure is None else np.abs(np.asarray(nonclosure, dtype=np.float64))
    added = drift_in_sigma(dr, sp, from_members, bound=bound)
    return np.sqrt(sp ** 2 + np.where(added, dr, 0.0) ** 2 + mc ** 2 + nc ** 2), added


def nonclosure_terms(sq_error: np.ndarray, sigma: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """What each fit says of the non-closure (elementwise, in squared Cramér-Rao bounds): (its squared error - sigma^2)
    / bound^2, with sigma without any non-closure. Their mean over data sets of known truth is s^2, the
    `analysis.nonclosure` to apply (negative: sigma covers more than the error). The squared error is (p^ - p_true)^2
    (sagips.closure), or, where an ML fit on the same events is known, (p^ - p_ML)^2 + sigma_ML^2, which leaves out
    the draw of the data sets (benchmarks/coverage.py)."""
    return ((np.asarray(sq_error, dtype=np.float64) - np.asarray(sigma, dtype=np.float64) ** 2)
            / np.asarray(bound, dtype=np.float64) ** 2)


def nonclosure_factors(nonclosure: float | Mapping[str, float], names: Sequence[str] | None, n: int,
                       key: str = "analysis.nonclosure") -> np.ndarray:
    """`analysis.nonclosure` as one number of bounds per parameter (n,): a number for all, or a mapping of parameter
    names to numbers (those left out: 0; a name that is not a parameter: ValueError, one line that names `key`, the
    setting or flag it came from)."""
    if not isinstance(nonclosure, Mapping):
        return np.full(n, float(nonclosure or 0.0))
    names = list(names) if names is not None else [f"r_{i}" for i in range(n)]
    unknown = [k for k in nonclosure if k not in names]
    if unknown:
        raise ValueError(f"{key} names {unknown[0]!r}, which is not a parameter here "
                         f"({', '.join(names)})")
    return np.array([float(nonclosure.get(k, 0.0)) for k in names])


def nonclosure_normal(nonclosure: Any) -> float | dict[str, float]:
    """A non-closure as a number or a mapping of names to numbers, in floats (YAML's 1 and a run.json's 1.0 alike;
    None: 0)."""
    if isinstance(nonclosure, Mapping):
        return {str(k): float(v) for k, v in nonclosure.items()}
    return float(nonclosure or 0.0)


def nonclosure_text(nonclosure: float | Mapping[str, float]) -> str:
    """How a note writes the non-closure: '0.7' or 'tau 0, resolution 2.5'."""
    if isinstance(nonclosure, Mapping):
        return ", ".join(f"{k} {float(v):.3g}" for k, v in nonclosure.items())
    return f"{float(nonclosure):.3g}"


def nonclosure_part(nonclosure: float | Mapping[str, float], bound: np.ndarray | None,
                    names: Sequence[str] | None = None) -> np.ndarray | None:
    """The systematic part of sigma (P,), physical units: `analysis.nonclosure` (a number of the data's Cramér-Rao
    bounds, for all parameters or per name: `nonclosure_factors`; measured by a calibration: sagips.closure,
    benchmarks/coverage.py) times the bound; None where it is 0 or no bound is known (then it cannot apply, and
    `uncertainty` says so)."""
    if bound is None:
        return None
    f = nonclosure_factors(nonclosure, names, len(bound))
    if not f.any():
        return None
    return f * np.abs(np.asarray(bound, dtype=np.float64))


def data_floor(bound: np.ndarray, seen: float | None, n_members: int, shared_data: bool) -> np.ndarray:
    """The smallest statistical error of the members' mean p^ that its data allow (P,), from the Cramér-Rao bound
    of all the data set's events (`cramer_rao`: no unbiased fit to them does better). Members that share the data
    set, each learning from a random fraction `seen` < 1 of it, leave bound^2 (1/seen - 1)/M more in their mean
    (`members_factor`'s half-sampling term); members on disjoint parts of it, or that all learn from all of it
    (or `seen` unknown): the bound itself."""
    b = np.asarray(bound, dtype=np.float64)
    if half_sampled(seen, shared_data):
        return b * math.sqrt(1.0 + (1.0 / seen - 1.0) / max(1, int(n_members)))
    return b


def spread_with_floor(members: np.ndarray, floor: np.ndarray, holds_statistics: bool
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(spread part of sigma, replaced (P,) bool) from the members' part and the data's floor (`data_floor`).
    Where the members' scatter holds the data's error (half-sampling, disjoint parts), the spread is the larger of
    the two: members that agree more than the data allow stopped together short of the data's maximum, and a member
    part below the floor is an underestimate whatever the reason. Where it holds none (every member learned from all
    the data, NO_STATISTICS), the floor is the data's error and adds in quadrature to the training noise (replaced:
    none, the members' part is still in it)."""
    m = np.asarray(members, dtype=np.float64)
    f = np.asarray(floor, dtype=np.float64)
    ok = np.isfinite(f)
    if not holds_statistics:
        return np.where(ok, np.sqrt(np.nan_to_num(m) ** 2 + np.where(ok, f, 0.0) ** 2), m), np.zeros(m.shape, bool)
    low = ok & ~(m >= f)  # (a NaN members part: the floor)
    return np.where(low, f, m), low


def drift_in_sigma(drift: np.ndarray, spread: np.ndarray, from_members: bool,
                   threshold: float = DRIFT_THRESHOLD, bound: np.ndarray | None = None) -> np.ndarray:
    """(P,) bool: is the drift a part of sigma? Yes where the parameter still moves (`convergence`: more than
    `threshold` x the members' spread, or more than DRIFT_BOUNDS x the data's Cramér-Rao `bound` where it is
    known), or where the spread is not from independent members (a lower bound, so
    nothing can be judged against it). No where it moved less: a movement inside the spread is the training noise
    that the spread already holds, and its square, added again, would inflate sigma even for a parameter that has
    stopped (the drift of a 2-checkpoint window is the difference of two noisy means; benchmarks/coverage.py)."""
    d = np.abs(np.asarray(drift, dtype=np.float64))
    sp = np.asarray(spread, dtype=np.float64)
    if not from_members:
        return np.ones(d.shape, dtype=bool)
    ok = np.isfinite(sp) & (sp > 0)
    b = np.full(d.shape, np.nan) if bound is None else np.abs(np.asarray(bound, dtype=np.float64))
    return ~ok | (d > threshold * np.where(ok, sp, 0.0)) | (np.isfinite(b) & (d > DRIFT_BOUNDS * b))


#: |correlation| of two parameters in the data's Fisher information above which analyze warns (toy1d: a-b 0.97)
CORRELATION_WARN = 0.95


def inverse_information(fisher: np.ndarray) -> np.ndarray | None:
    """I^-1 of a per-event Fisher matrix (P, P), symmetrised; None where it is not finite or not positive definite
    (its smallest eigenvalue at most 1e-12 of its largest: a combination of the parameters the data do not fix)."""
    f = np.asarray(fisher, dtype=np.float64)
    if not np.all(np.isfinite(f)):
        return None
    f = (f + f.T) / 2
    eig = np.linalg.eigvalsh(f)
    if not eig[0] > 1e-12 * max(eig[-1], 0.0):
        return None
    return np.linalg.inv(f)


def information_correlation(fisher: np.ndarray) -> np.ndarray | None:
    """The correlation matrix (P, P) of an efficient estimate, from the inverse of the per-event Fisher information
    `fisher` (P, P); None where that is not finite or not invertible (`inverse_information`)."""
    cov = inverse_information(fisher)
    if cov is None:
        return None
    d = np.sqrt(np.diag(cov))
    return cov / np.outer(d, d)


def correlated_pairs(fisher: np.ndarray, names: Sequence[str], threshold: float = CORRELATION_WARN,
                     preconditioned: bool = False, options: bool = True) -> list[str]:
    """One note per pair of parameters whose correlation in the inverse of the per-event Fisher matrix `fisher`
    (P, P) reaches `threshold`: along such a valley a fit with plain gradients converges slowly, members that start
    together can stop together short of the data's maximum or pass it and relax back too slowly to show, and sigma
    misses it (docs/analysis.md, "What σ cannot see"). `preconditioned`: the runs trained with
    environment.precondition=fisher, which moves along the valley (the note then says so, and names the check that
    remains). `options`: the environment has
    environment.precondition and environment.g_start (ParametricEnvironment); otherwise (proxy1d) the note names
    the checks that need neither."""
    if not np.all(np.isfinite(np.asarray(fisher, dtype=np.float64))):
        return []
    corr = information_correlation(fisher)
    if corr is None:
        return ["the data's Fisher information at p^ is singular: some combination of the parameters is not "
                "constrained by the data at all; sigma cannot hold its error"]
    if preconditioned:
        advice = ("the runs were preconditioned with the data's Fisher information (environment.precondition=fisher), "
                  "which moves the fit along "
                  "such a valley; to check that it got there, start members apart (environment.g_start) and see "
                  "that they meet")
    elif options:
        advice = ("along such a valley a fit with plain gradients converges slowly, members that start together "
                  "can stop together short of the data's maximum, and sigma then misses it: train with "
                  "environment.precondition=fisher, or check that members started apart (environment.g_start) meet")
    else:
        advice = ("along such a valley a fit with plain gradients converges slowly: members that start together "
                  "can stop together short of the data's maximum, or pass it and relax back too slowly to show as "
                  "movement (proxy1d's preset ends ~1-1.5 sigma_ML past it along p0-p2), and sigma misses either (it "
                  "keeps at least the data's floor, below): check that the parameters no longer move, and that runs "
                  "with other seeds meet")
    out = []
    for i in range(len(corr)):
        for j in range(i + 1, len(corr)):
            if abs(corr[i, j]) >= threshold:
                out.append(f"{names[i]} and {names[j]} are {100 * corr[i, j]:+.0f} % correlated in the data's "
                           f"information at p^: {advice} (docs/analysis.md, \"What σ cannot see\")")
    return out


def cramer_rao(fisher: np.ndarray, n_events: int) -> np.ndarray | None:
    """The Cramér-Rao bound (P,): sqrt(diag(I^-1) / N) for the per-event Fisher information I (P, P) of N events,
    the smallest standard deviation an unbiased estimate from all N events can have; None where I is not finite or
    not positive definite."""
    cov = inverse_information(fisher) if n_events >= 1 else None
    return None if cov is None else np.sqrt(np.diag(cov) / n_events)


#: a sigma below the Cramer-Rao bound is noted where so small an estimate of it has probability < BOUND_P
BOUND_P = 0.01


def chi2_quantile(q: float, dof: float) -> float:
    """x with P(X <= x) = q for X ~ chi^2(dof), q in (0, 1), dof > 0. Numpy-free and scipy-free: bisection on the
    regularized lower incomplete gamma function P(dof/2, x/2) from its power series (tests compare it with
    scipy.stats.chi2.ppf)."""
    if not 0.0 < q < 1.0 or not dof > 0:
        raise ValueError(f"chi2_quantile: q in (0, 1) and dof > 0 needed, got q={q}, dof={dof}")
    a = dof / 2.0

    def cdf(x: float) -> float:
        h = x / 2.0
        if h <= 0.0:
            return 0.0
        term = total = 1.0 / a
        n = 1
        while term > 1e-17 * total and n < 10_000:
            term *= h / (a + n)
            total += term
            n += 1
        return min(1.0, math.exp(a * math.log(h) - h - math.lgamma(a)) * total)

    lo, hi = 0.0, dof + 20.0 * math.sqrt(dof) + 50.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2.0


def below_cramer_rao(names: Sequence[str], members: np.ndarray, bound: np.ndarray, n_members: int,
                     p: float = BOUND_P, options: bool = True) -> list[str]:
    """A note per parameter whose members part of sigma (the members' scatter turned into the error of their
    mean: the part that holds the data's statistical error) is below its Cramér-Rao bound by more than its sampling
    explains: members^2 / bound^2 below the p-quantile of chi^2_(M-1) / (M-1) (a members part that is exactly
    right falls under 0.20 bound at M = 4, and under 0.42 bound at M = 8, with probability 1 %). The drift and
    Monte-Carlo parts are not the data's error and do not count. Members that agree more than the data allow have
    stopped together short of the data's maximum. `options`: as in `correlated_pairs`."""
    if n_members < 2:
        return []
    k = n_members - 1
    limit = math.sqrt(chi2_quantile(p, k) / k)
    out = []
    for name, s, b in zip(names, np.asarray(members, dtype=np.float64), bound):
        if math.isfinite(s) and s < limit * b:
            out.append(f"{name}: the members' part of sigma, {s:.3g}, is below the Cramér-Rao bound {b:.3g} of the "
                       f"data (the Fisher information of all its events at p^): the members agree more than the data "
                       f"allow, so they may have stopped together short of the data's maximum; sigma quotes the "
                       f"data's floor instead, and members started apart "
                       f"{'(environment.g_start) ' if options else '(other seeds) '}should meet "
                       f"(docs/analysis.md, \"What σ cannot see\")")
    return out


#: sigma above this many Cramér-Rao bounds is noted: training noise, not the data, sets it (a fit at the data's
#: floor has sigma ~1-1.5 bounds; proxy1d's preset ends at 1.4 along its weakest valley, toy1d's at 1.14-1.16, and at
#: 3.3-4.5 before its critic saw the data's scale)
FAR_FROM_FLOOR = 5.0


def above_cramer_rao(names: Sequence[str], sigma: np.ndarray, bound: np.ndarray,
                     limit: float = FAR_FROM_FLOOR) -> list[str]:
    """A note per parameter whose sigma is more than `limit` times its Cramér-Rao bound: the members are far apart
    compared with what the data allow, so p^ +- sigma, though it quotes that spread, is much less precise than the
    data's maximum would be."""
    out = []
    for name, s, b in zip(names, np.asarray(sigma, dtype=np.float64), np.asarray(bound, dtype=np.float64)):
        if math.isfinite(s) and math.isfinite(b) and b > 0 and s > limit * b:
            out.append(f"{name}: σ {s:.3g} is {s / b:.0f}x the data's Cramér-Rao bound {b:.3g}: the members are far "
                       f"apart, so training noise, not the data, sets σ; p̂ ± σ quotes that spread, but the data "
                       f"allow a far smaller error: train longer (train.epochs) and check each member's own "
                       f"convergence at the end of its run (docs/analysis.md, \"σ far above the data's error\")")
    return out


def noise_sampling_error(preds: np.ndarray) -> np.ndarray:
    """The Monte-Carlo error (P,) of p^ = the mean over members and over K shared noise vectors, from `preds`
    (N, K, P): the standard deviation over the noise of the members' mean prediction, / sqrt(K).

    A generator with noise maps it to a spread of parameters (seen: 2.5 % in smear1d's tau at noise_scale 0.01,
    where the data's own error is 0.1 %; 0 for a generator of one point), so a mean over K = 1024 vectors moves
    by 0.8 of the statistical error from one noise batch to the next; the members share the batch, so this error
    is common to all of them and their scatter does not hold it. A spread below 1e-12 of p^ is the rounding of the
    averages (a generator of one point), and reads 0."""
    a = np.asarray(preds, dtype=np.float64)
    if a.ndim != 3 or a.shape[1] < 2:
        return np.zeros(a.shape[-1])
    mean = a.mean(axis=0)
    err = mean.std(axis=0, ddof=1) / math.sqrt(a.shape[1])
    return np.where(err <= 1e-12 * np.abs(mean).max(axis=0), 0.0, err)


def convergence(names: Sequence[str], epochs: Sequence[int], series: np.ndarray, sigma: np.ndarray,
                fraction: float = DRIFT_FRACTION, threshold: float = DRIFT_THRESHOLD,
                advice: str = DRIFT_ADVICE, lower_bound: bool = False,
                floor: np.ndarray | None = None, unjudged: str = UNJUDGED_ADVICE,
                correlation: np.ndarray | None = None,
                records: tuple[str, str] = ("checkpoints", "train.checkpoint_every")) -> list[dict[str, Any]]:
    """Per parameter: did it still move over the last `fraction` of the epochs, against `sigma` (P,), the spread
    between members (the spread part of the quotable sigma)? `series` (T, P) is the ensemble's p^ at `epochs`.
    `lower_bound`: sigma is only the spread of ranks that exchange gradients (no independent members), a lower
    bound of the error: a parameter that moved less than it has converged, one that moved more is not judged,
    unless `floor` (P,) gives the data's own statistical error independently of the ranks (the Cramér-Rao bound of a
    density environment, `cramer_rao`): the movement is then judged against the larger of the two, so that a run
    whose parameter still moves by more than its data's error is told so. `unjudged`: what to do where the movement
    cannot be judged (no spread, or only the ranks' lower bound). `correlation` (P, P): the data's correlation of the
    parameters (`information_correlation`); a parameter that moved less than its sigma is not called converged while
    a partner correlated with it by `CORRELATION_WARN` or more still moves: along such a valley they move together,
    each by its own share of its sigma (seen: proxy1d after 300 of 4,000 epochs, r_0 0.6 sigma and 14 sigma from its
    truth, r_1, +99 %, 1.4 sigma); with `floor`, so is one whose best value a partner's movement shifts by more
    than `threshold` of its sigma, at any correlation (rho_ij floor_i / floor_j per unit of the partner's movement).
    `records`: what the series' epochs are, and the setting that makes them denser (analyze's checkpoints; the run
    end's metrics.jsonl records, train.log_every).

    One dict per parameter: name, moved (physical units), sigma (what it is judged against), z = |moved|/sigma
    (None without one), moving (bool, or None when it cannot be judged), window [first, last epoch], message (one
    line, what to do).
    The single diagnostic of both the end of `sagips.run` and `sagips.analyze`."""
    s = np.asarray(series, dtype=np.float64)
    moved, e0, e1 = drift(epochs, s, fraction)
    pct = f"{100 * fraction:.0f} %"
    noun, setting = records
    # fewer than two records in the last `fraction`: the window reaches back to the last two
    few = len(s) >= 2 and e0 < (1.0 - fraction) * e1
    over = (f"between its last two {noun} (too few in the last {pct} of epochs: lower {setting})"
            if few else f"over the last {pct} of epochs")
    # two records only (a run shorter than its record interval): the window is the whole run, and how far a fit moved
    # since its start does not say whether it has settled (seen: a 2-epoch run read "converged", its ranks unmoved
    # from the box's middle)
    whole = len(s) == 2
    out = []
    for i, name in enumerate(names):
        mv, sg = float(moved[i]), float(np.asarray(sigma, dtype=np.float64)[i])
        last = float(s[-1, i])
        fl = float(np.asarray(floor, dtype=np.float64)[i]) if floor is not None else math.nan

        def bounds_moved(why: str) -> str:  # (the DRIFT_BOUNDS rule's message, for ranks and members alike)
            return (f"{name} moved {abs(mv) / fl:.1f} Cramér-Rao bounds of the data ({z:.1f}σ; {why}) {over} "
                    f"({e0}-{e1}): it has not settled at the data's precision: {advice}")
        if lower_bound and len(s) >= 2 and math.isfinite(fl) and fl > 0:
            # one run of exchanging ranks of a density: against the larger of its ranks' spread and its data's error
            # (toy1d: single runs still walking along the valley by 1-2 sigma_ML over the last 20 %)
            by_ranks = math.isfinite(sg) and sg > fl
            what = "the ranks' spread" if by_ranks else "the data's statistical error, the Cramér-Rao bound"
            sg = sg if by_ranks else fl  # (the sigma it is judged against, as in the other branches)
            z = abs(mv) / sg
            moving = z > threshold
            msg = (f"{name} moved {z:.1f}σ {over} ({e0}-{e1}; σ {what}): {advice}" if moving
                   else f"{name}: converged (moved {z:.1f}σ {over}, {e0}-{e1}; σ {what})")
            if not moving and abs(mv) > DRIFT_BOUNDS * fl:  # (a wide spread of ranks: as for members below)
                moving, msg = True, bounds_moved(f"σ {what}")
        elif len(s) < 2:
            z, moving = None, None
            msg = f"{name}: too few checkpoints to judge whether it still moves (keep train.checkpoint_every small)"
        elif not (math.isfinite(sg) and sg > 0):
            z, moving = None, None
            rel = f" ({100 * abs(mv / last):.2g} % of its value)" if last else ""
            msg = (f"{name} moved {mv:+.3g}{rel} {over} ({e0}-{e1}); no spread between members to judge it "
                   f"against: {unjudged}")
        else:
            z = abs(mv) / sg
            moving = z > threshold
            msg = (f"{name} moved {z:.1f}σ {over} ({e0}-{e1}): {advice}" if moving else
                   f"{name}: converged (moved {z:.1f}σ {over}, {e0}-{e1})")
            if not moving and not lower_bound and math.isfinite(fl) and fl > 0 and abs(mv) > DRIFT_BOUNDS * fl:
                moving, msg = True, bounds_moved("the members' spread is wide")  # (drift_in_sigma adds it alike)
            if not moving and not lower_bound and math.isfinite(fl) and fl > 0 and sg > FAR_FROM_FLOOR * fl:
                # members far apart (the rule of `above_cramer_rao`'s note; seen: 17-44x after 50 epochs, each
                # member still near its start): a movement small against their spread says nothing of convergence
                moving = None
                msg = (f"{name}: not judged: the members' spread puts σ at {sg / fl:.0f}x the data's error (σ {sg:.3g}, "
                       f"the Cramér-Rao bound {fl:.3g}): they have not met, and moving {z:.1f}σ {over} ({e0}-{e1}) "
                       f"does not say they will: train longer (train.epochs)")
            if moving and lower_bound:  # seen: make run near the data's ML floor, told to train longer at 3-11x
                rel = f" ({100 * abs(mv / last):.2g} % of its value)" if last else ""
                moving = None
                msg = (f"{name} moved {mv:+.3g}{rel} {over} ({e0}-{e1}), {z:.1f}x the ranks' "
                       f"spread, which is only a lower bound of σ here: to judge it, {unjudged}")
        if whole:
            moving = None
            msg = (f"{name}: not judged: its only {noun} in the window ({e0}-{e1}) are the run's first and last, so "
                   f"its movement ({'no spread to judge it' if z is None else f'{z:.1f}σ'}) does not say whether it "
                   f"has settled: lower {setting} or train longer")
        elif few and moving is False:
            # a window that reaches back beyond the last `fraction` does not show that the end is still (seen: a
            # 20-epoch run, a record every 5: "converged (0.0σ)" for every parameter at max|r| 0.99, its ranks
            # unmoved from the box's middle); a movement beyond sigma there still says "still moving"
            moving = None
            msg = (f"{name}: not judged: too few {noun} in the last {pct} of epochs to say that it has settled "
                   f"(it moved {z:.1f}σ between its last two, {e0}-{e1}): lower {setting} or train longer")
        out.append({"name": name, "moved": mv, "sigma": sg, "z": z, "moving": moving, "window": [e0, e1],
                    "message": msg})
    c = None if correlation is None else np.asarray(correlation, dtype=np.float64)
    if c is not None and c.shape == (len(out), len(out)) and len(s) >= 2:
        still = [o["moving"] is True for o in out]  # (the verdicts of the loop above, before any is changed here)
        b = None if floor is None else np.abs(np.asarray(floor, dtype=np.float64))
        b = b if b is not None and b.shape == (len(out),) and np.all(np.isfinite(b) & (b > 0)) else None
        for i, o in enumerate(out):
            if o["moving"] is not False:
                continue
            partners = [j for j in range(len(out)) if j != i and still[j] and abs(c[i, j]) >= CORRELATION_WARN]
            if partners:
                j = max(partners, key=lambda k: abs(c[i, k]))
                o["moving"] = None
                o["message"] = (f"{o['name']}: not judged: it moved {o['z']:.1f}σ {over} ({e0}-{e1}), but {names[j]}, "
                                f"{100 * c[i, j]:+.0f} % correlated with it in the data's information, still moves, "
                                f"and along such a valley they move together: {advice}")
                continue
            if b is None or not (o["sigma"] > 0):
                continue
            # a partner still moving takes this parameter's best value with it: by rho_ij b_i / b_j per unit of its
            # own movement (the data's maximum of p_i given p_j, from I^-1), whatever the correlation's size (seen:
            # proxy1d at T1, docs/benchmarks/loop_closure.md, the u valley still moving 1.7-3 bounds and the d
            # valley, -0.6 correlated with it, "converged" 3-4 sigma_ML from the data's ML fit)
            # (against the larger of its sigma and its bound: a sigma below the data's bound, e.g. the members' part
            # of split data, would make a shift small against the data's precision read large)
            drag = {j: abs(c[i, j] * out[j]["moved"]) * b[i] / b[j] / max(o["sigma"], b[i]) for j in range(len(out))
                    if j != i and still[j]}
            j = max(drag, key=drag.get, default=None)
            if j is not None and drag[j] > threshold:
                o["moving"] = None
                o["message"] = (f"{o['name']}: not judged: it moved {o['z']:.1f}σ {over} ({e0}-{e1}), but {names[j]} "
                                f"still moves, and at {100 * c[i, j]:+.0f} % correlation in the data's information "
                                f"its movement shifts the data's best {o['name']} by {drag[j]:.1f}σ: {advice}")
    return out
