"""A vectorised numpy optical-photon Monte Carlo: the stand-in for the (unpublished) GATE training data of optiGAN.

    from sagips_environments.optigan.mc import Crystal, simulate_point
    photons, stats = simulate_point(Crystal(), (0.25, 0.0, 0.5), n_detected=30_000, rng=np.random.default_rng(1))

Geometry and coordinates (mm): a W x W x L crystal, x and y in [-W/2, W/2] around the crystal axis, z in [0, L]
from the back face (z = 0) to the exit face (z = L), where the photodetector sits behind optical grease. A condition
(x, y, z) is the emission point in this frame; a detected photon is recorded as

    X, Y        position on the exit face (mm)
    dX, dY, dZ  the photon's direction cosines inside the crystal when it reaches the exit face (dZ >= cos θc)
    EKine       its energy (eV)

Physics (see docs/optigan.md and shared/reference/optigan.md):
- emission: at the condition point, isotropic, energy from the scintillator's spectrum (BGO: N(2.43, 0.36) eV
  truncated to [1.55, 3.87], n = 2.15; LYSO: N(2.94, 0.18) eV truncated to [2.48, 3.54], n = 1.82);
- transport: straight lines, bulk absorption with an exponential free path (`absorption_length`);
- exit face (crystal -> grease, n_out = 1.5): total internal reflection where n sin θ >= n_out; otherwise the photon
  leaves with the unpolarised Fresnel transmission probability T(θ) and is detected, or is reflected specularly;
- lateral and back faces (reflector over an air gap): lossless specular TIR where n sin θ >= 1; otherwise the
  reflector returns the photon with probability `reflectivity` (specularly, or with probability `lambertian` into a
  cosine-law direction about the inward normal), and absorbs it otherwise;
- at most `max_bounces` surface interactions per photon (the rest are counted as lost).

The transport is vectorised over photons: the only Python loop is over bounces, on the shrinking set of live photons.

An exact shortcut: with purely specular surfaces (lambertian = 0) every reflection on an axis-aligned face keeps
|dx|, |dy|, |dz|, so a photon emitted with |dz| < cos θc can never leave through the exit face. Such photons are
counted as emitted-but-lost without being tracked (about 70% of them for BGO), which changes no detected photon's
distribution.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

#: column names of a photon row, as optiGAN and opengate write them
PHOTON_COLUMNS = ("X", "Y", "dX", "dY", "dZ", "EKine")
CONDITION_COLUMNS = ("x", "y", "z")

#: emission spectra: (mean eV, sigma eV, low eV, high eV, refractive index)
SPECTRA = {
    "BGO": (2.43, 0.36, 1.55, 3.87, 2.15),
    "LYSO": (2.94, 0.18, 2.48, 3.54, 1.82),
}


@dataclass(frozen=True)
class Crystal:
    """The simulated detector: geometry (mm), optics and the bounce cap."""

    width: float = 3.0  #: cross-section side W (mm); x, y in [-W/2, W/2]
    length: float = 3.0  #: crystal length L (mm); back face z = 0, exit face z = L
    scintillator: str = "BGO"  #: 'BGO' or 'LYSO' (spectrum and default refractive index)
    n_crystal: float | None = None  #: refractive index; None = the scintillator's (BGO 2.15, LYSO 1.82)
    n_out: float = 1.5  #: optical grease behind the exit face
    reflectivity: float = 0.98  #: reflector on the lateral and back faces (where there is no TIR)
    lambertian: float = 0.0  #: fraction of reflector reflections that are diffuse (cosine law)
    absorption_length: float = 100.0  #: bulk absorption length (mm); math.inf = no absorption
    max_bounces: int = 500  #: surface interactions before a photon is given up (counted as lost)

    def __post_init__(self):
        if self.scintillator not in SPECTRA:
            raise ValueError(f"scintillator: must be one of {sorted(SPECTRA)}, got {self.scintillator!r}")
        if not (self.width > 0 and self.length > 0):
            raise ValueError("width and length must be > 0")
        if not 0.0 <= self.reflectivity <= 1.0 or not 0.0 <= self.lambertian <= 1.0:
            raise ValueError("reflectivity and lambertian must be in [0, 1]")
        if self.n < self.n_out:
            raise ValueError(f"n_crystal ({self.n}) must be >= n_out ({self.n_out}) for an escape cone")

    @property
    def n(self) -> float:
        return self.n_crystal if self.n_crystal is not None else SPECTRA[self.scintillator][4]

    @property
    def cos_critical(self) -> float:
        """cos θc of the exit face: detected photons have dZ >= this (0.716 for BGO into grease)."""
        s = self.n_out / self.n
        return math.sqrt(1.0 - s * s)

    @property
    def energy_range(self) -> tuple[float, float]:
        return SPECTRA[self.scintillator][2:4]

    def with_(self, **kw) -> Crystal:
        return replace(self, **kw)


# ------------------------------------------------------------------------------------------------ sampling helpers
def sample_energy(crystal: Crystal, n: int, rng: np.random.Generator) -> np.ndarray:
    """Photon energies (eV) from the truncated-normal spectrum (rejection; acceptance > 99% for BGO)."""
    mu, sigma, lo, hi, _ = SPECTRA[crystal.scintillator]
    out = np.empty(n)
    filled = 0
    while filled < n:
        k = n - filled
        e = rng.normal(mu, sigma, size=int(k * 1.05) + 16)
        e = e[(e >= lo) & (e <= hi)][:k]
        out[filled:filled + len(e)] = e
        filled += len(e)
    return out


def isotropic(n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors uniform on the sphere, shape (n, 3)."""
    cz = rng.uniform(-1.0, 1.0, n)
    phi = rng.uniform(0.0, 2 * np.pi, n)
    s = np.sqrt(1.0 - cz * cz)
    return np.stack([s * np.cos(phi), s * np.sin(phi), cz], axis=1)


def fresnel_transmission(cos_i: np.ndarray, n1: float, n2: float) -> np.ndarray:
    """Unpolarised Fresnel transmission probability from n1 into n2 at incidence cos θi (0 beyond θc)."""
    sin_t = (n1 / n2) * np.sqrt(np.clip(1.0 - cos_i * cos_i, 0.0, 1.0))
    ok = sin_t < 1.0
    cos_t = np.sqrt(np.clip(1.0 - sin_t * sin_t, 0.0, 1.0))
    rs = (n1 * cos_i - n2 * cos_t) / (n1 * cos_i + n2 * cos_t)
    rp = (n2 * cos_i - n1 * cos_t) / (n2 * cos_i + n1 * cos_t)
    return np.where(ok, 1.0 - 0.5 * (rs * rs + rp * rp), 0.0)


def _lambertian(axis: np.ndarray, inward_sign: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cosine-law directions about the inward normal of the face hit (normal = ±e_axis), shape (n, 3)."""
    n = len(axis)
    cos_t = np.sqrt(rng.uniform(0.0, 1.0, n))
    sin_t = np.sqrt(1.0 - cos_t * cos_t)
    phi = rng.uniform(0.0, 2 * np.pi, n)
    d = np.empty((n, 3))
    rows = np.arange(n)
    a1 = (axis + 1) % 3
    a2 = (axis + 2) % 3
    d[rows, axis] = inward_sign * cos_t
    d[rows, a1] = sin_t * np.cos(phi)
    d[rows, a2] = sin_t * np.sin(phi)
    return d


# ------------------------------------------------------------------------------------------------ transport
@dataclass
class TransportStats:
    """Where the emitted photons went (counts)."""

    emitted: int = 0
    detected: int = 0
    absorbed_bulk: int = 0
    absorbed_reflector: int = 0
    trapped: int = 0  #: outside the escape cone with specular surfaces: can never be detected (not tracked)
    bounce_cap: int = 0

    def add(self, other: TransportStats) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))

    @property
    def detected_fraction(self) -> float:
        return self.detected / self.emitted if self.emitted else float("nan")


def transport(crystal: Crystal, origin: np.ndarray, n_emit: int, rng: np.random.Generator,
              skip_trapped: bool = True) -> tuple[np.ndarray, TransportStats]:
    """Emit `n_emit` photons at `origin` (3,) and track them; returns (detected photons (k, 6), stats).

    `skip_trapped=False` tracks even the photons that the exact shortcut (module docstring) would drop: they then
    end at the bounce cap or absorbed (used by the tests to check the shortcut).
    """
    c = crystal
    origin = np.asarray(origin, dtype=np.float64)
    half = 0.5 * c.width
    lo = np.array([-half, -half, 0.0])
    hi = np.array([half, half, c.length])
    if np.any(origin < lo) or np.any(origin > hi):
        raise ValueError(f"emission point {origin.tolist()} is outside the crystal [{lo.tolist()}, {hi.tolist()}]")
    n1, n_out, cos_c = c.n, c.n_out, c.cos_critical
    sin_tir_air = 1.0 / n1  # lateral/back faces: TIR where sin θ >= 1/n
    stats = TransportStats(emitted=n_emit)

    d = isotropic(n_emit, rng)
    energy = sample_energy(c, n_emit, rng)
    if skip_trapped and c.lambertian == 0.0:  # the exact shortcut of the module docstring
        keep = np.abs(d[:, 2]) >= cos_c
        stats.trapped = int(n_emit - keep.sum())
        d, energy = d[keep], energy[keep]
    n = len(d)
    p = np.broadcast_to(origin, (n, 3)).copy()
    free_path = rng.exponential(c.absorption_length, n) if math.isfinite(c.absorption_length) else np.full(n, np.inf)
    out_rows: list[np.ndarray] = []

    for _ in range(c.max_bounces):
        if n == 0:
            break
        rows = np.arange(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(d > 0, (hi - p) / d, np.where(d < 0, (lo - p) / d, np.inf))
        axis = np.argmin(t, axis=1)
        step = np.maximum(t[rows, axis], 0.0)
        # bulk absorption before the next surface
        alive = step < free_path
        stats.absorbed_bulk += int(n - alive.sum())
        free_path = free_path - step
        p = p + d * step[:, None]
        d_ax = d[rows, axis]
        # snap onto the face hit (no drift through the walls after many bounces)
        p[rows, axis] = np.where(d_ax > 0, hi[axis], lo[axis])
        cos_i = np.abs(d_ax)
        sin_i = np.sqrt(np.clip(1.0 - cos_i * cos_i, 0.0, 1.0))
        u = rng.uniform(0.0, 1.0, n)

        on_exit = alive & (axis == 2) & (d_ax > 0)
        # exit face: TIR (T = 0 there) or Fresnel
        T = np.zeros(n)
        T[on_exit] = fresnel_transmission(cos_i[on_exit], n1, n_out)
        detected = on_exit & (u < T)
        if detected.any():
            out_rows.append(np.column_stack([p[detected, 0], p[detected, 1], d[detected], energy[detected]]))
            stats.detected += int(detected.sum())
        # other faces: TIR where n sin θ >= 1, else the reflector
        other = alive & ~on_exit
        tir = other & (sin_i >= sin_tir_air)
        reflector = other & ~tir
        lost = reflector & (u >= c.reflectivity)
        stats.absorbed_reflector += int(lost.sum())
        survive = alive & ~detected & ~lost
        # specular reflection for everyone who survives; then the diffuse fraction of reflector reflections
        d[rows, axis] = -d_ax
        if c.lambertian > 0.0:
            diffuse = reflector & ~lost & (rng.uniform(0.0, 1.0, n) < c.lambertian)
            if diffuse.any():
                ax = axis[diffuse]
                inward = np.where(d_ax[diffuse] > 0, -1.0, 1.0)
                d[diffuse] = _lambertian(ax, inward, rng)
        p, d, energy, free_path = p[survive], d[survive], energy[survive], free_path[survive]
        n = len(p)
    stats.bounce_cap += n
    photons = np.concatenate(out_rows) if out_rows else np.empty((0, 6))
    # the exit-face position is exactly z = L: only X, Y are recorded
    return photons, stats


def simulate_point(crystal: Crystal, origin: Sequence[float], n_detected: int, rng: np.random.Generator,
                   max_emit: int = 200_000_000) -> tuple[np.ndarray, TransportStats]:
    """Exactly `n_detected` detected photons (float64, (n, 6)) emitted at `origin`, and the transport stats.

    Photons are emitted in batches sized from the running detected fraction; the rows are shuffled and the
    surplus is dropped (the photons are i.i.d., so a random subset biases nothing).
    """
    stats = TransportStats()
    parts: list[np.ndarray] = []
    have = 0
    frac = 0.9 * (1.0 - crystal.cos_critical)  # about right for BGO with R = 0.98; corrected after each batch
    while have < n_detected:
        if stats.emitted >= max_emit:
            raise RuntimeError(f"emission point {list(origin)}: only {have} of {n_detected} photons detected after "
                               f"{stats.emitted} emitted (is the reflectivity or absorption length too small?)")
        need = n_detected - have
        batch = int(min(max_emit - stats.emitted, max(1024, 1.05 * need / max(frac, 1e-3))))
        ph, st = transport(crystal, origin, batch, rng)
        stats.add(st)
        parts.append(ph)
        have += len(ph)
        frac = max(stats.detected_fraction, 1e-3)
    # rows come out grouped by bounce number (direct photons first): shuffle before truncating, so that any
    # prefix of the rows (the truncation here, a split into halves later) is an unbiased sample
    photons = np.concatenate(parts)
    photons = photons[rng.permutation(len(photons))[:n_detected]]
    return photons, stats


# ------------------------------------------------------------------------------------------------ emission points
def paper_grid(crystal: Crystal = Crystal(), n_side: int = 7, depths: int = 5, margin: float = 0.05) -> np.ndarray:
    """The paper's training grid: 1/8 of the cross-section (0 <= y <= x <= W/2 - margin) x `depths` depths.

    For the 3 x 3 x 3 crystal this is x, y in {0, 0.25, ..., 1.25, 1.45} with y <= x (28 points) at
    z in {0.5, 1.0, 1.5, 2.0, 2.5}: 140 points, as in the optiGAN papers' figure 2. Shape (n, 3), mm.
    """
    half = 0.5 * crystal.width
    step = half / (n_side - 1)
    xs = np.append(np.arange(n_side - 1) * step, half - margin)
    zs = crystal.length * np.arange(1, depths + 1) / (depths + 1)
    pts = [(x, y, z) for z in zs for i, x in enumerate(xs) for y in xs[: i + 1]]
    return np.asarray(pts, dtype=np.float64)


def random_points(grid: np.ndarray, n: int, rng: np.random.Generator, min_distance: float = 0.05) -> np.ndarray:
    """`n` random emission points inside the grid's region (0 <= y <= x <= max x, z between the grid's depths),
    each at least `min_distance` mm from every grid point: held-out conditions that interpolate, not extrapolate."""
    xmax = grid[:, 0].max()
    zmin, zmax = grid[:, 2].min(), grid[:, 2].max()
    out: list[np.ndarray] = []
    have = 0
    while have < n:
        k = 2 * (n - have) + 16
        x = rng.uniform(0.0, xmax, k)
        y = rng.uniform(0.0, xmax, k)
        x, y = np.maximum(x, y), np.minimum(x, y)  # fold into the triangle y <= x (uniform there)
        z = rng.uniform(zmin, zmax, k)
        pts = np.column_stack([x, y, z])
        dist = np.sqrt(((pts[:, None, :] - grid[None, :, :]) ** 2).sum(-1)).min(1)
        pts = pts[dist >= min_distance][: n - have]
        out.append(pts)
        have += len(pts)
    return np.concatenate(out)


def simulate_points(crystal: Crystal, points: np.ndarray, n_detected: int, seed: int | Sequence[int]
                    ) -> tuple[np.ndarray, np.ndarray, TransportStats]:
    """Photons (N, 6) and conditions (N, 3) for every emission point, `n_detected` photons each (float32).

    Point i draws from its own random stream (the i-th child of SeedSequence(seed)): the output is reproducible, and
    a point's photons do not depend on how many photons the other points needed.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    streams = np.random.SeedSequence(seed).spawn(len(points))
    photons = np.empty((len(points) * n_detected, 6), dtype=np.float32)
    conds = np.empty((len(points) * n_detected, 3), dtype=np.float32)
    total = TransportStats()
    for i, (pt, ss) in enumerate(zip(points, streams)):
        ph, st = simulate_point(crystal, pt, n_detected, np.random.default_rng(ss))
        photons[i * n_detected:(i + 1) * n_detected] = ph
        conds[i * n_detected:(i + 1) * n_detected] = pt
        total.add(st)
    return photons, conds, total
