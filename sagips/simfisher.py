"""The Fisher information of a simulator's events (issue 36): one column per event here, several in `cell_fisher`.

A `ParametricEnvironment` in the simulate form has no density, so its data's Cramér-Rao bound cannot be integrated
as the density form's is. It is estimated from the simulator itself. With x = simulate(p, u) for n fixed uniforms u,
the events are put into B bins and the information per event of the binned data is

    I = sum_b (d mu_b / dp) (d mu_b / dp)^T / mu_b,    mu_b = F(e_b) - F(e_{b-1}),

with F the events' CDF smoothed at each inner edge e_b by a Gaussian kernel of width w_b (half the gap to the
nearest edge), and dF(e)/dp = -E[K_w(x - e) dx/dp] from the events' own derivatives (one backward pass through the
simulator, which training needs to be differentiable anyway): the events move, the uniforms stay.
- The edges sit at levels of F spaced evenly in logit(F), down to TAIL_EVENTS events in each outermost bin: the tails
  carry a scale's information (75 % of smear1d's resolution's lies in the events below F = 1.3 %, half of tau's above
  F = 0.95), which bins of equal probability lose (64 of them lost 20 % of the resolution's).
- The derivatives of two halves of the events are multiplied, d mu_b^(1) d mu_b^(2): one half's squared would add its
  noise, sum_b var(d mu_b) / mu_b ~ B^3 / n, to I (+8 % of tau's at 128 bins and 2^22 events).
- A point mass (WALL_EVENTS or more events stuck at one value with no derivative, as events clipped to a `support`'s
  edge are) gets no edge, and no kernel reaches it: its mass and its derivative sit in the bin beside it, whose other
  edge is a fixed share of the moving events away (without that edge, 3-8 % of a clipped Gaussian's scale
  information was lost, depending on where the clip fell).
Binning only loses information, so the bound errs on the larger side: tests/test_simfisher.py checks a Gaussian's
analytic information (within 2 %), smear1d's from its density (within 3 %) and a Gaussian's clipped at three
points, from its density and point mass (within 5 %, its noise ~1.5 %).
The derivatives must be those of the events' distribution: x continuous in p for almost every u, as a
reparametrised simulator is. A simulator that branches on p (a mixture drawn by `u < f`, accept/reject, sorting)
has derivatives that torch computes but that miss the events that jump, and its estimate is wrong in either
direction. A simulator without a derivative in p (every event stuck), or whose events or derivatives are not
finite, has no estimate (None); an information that is singular (a parameter the events do not depend on) is
returned as it is, for stats.inverse_information to refuse.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

#: defaults of `binned_fisher`: 2^21 events and 64 bins (the bound's noise ~0.1-0.4 %, its loss under 1 % on smear1d)
N_EVENTS = 1 << 21
BINS = 64
CELLS = 4096  #: cells of the grid for events of several columns (64 x 64 for two, 16^3 for three; `cell_fisher`)
MAX_COLUMNS = 3  #: wider events get no estimate: 8 or fewer bins a column lose a fifth of it or more (four columns)
CELL_CHUNK = 1 << 15  #: events per step of `cell_fisher` (their memberships of every cell: 256 MiB in float64)
WIDTH = 0.5  #: the kernel's width at an edge, in gaps to the nearest edge
CUT = 6.0  #: the kernel is cut at this many widths
TAIL_EVENTS = 400  #: events in each outermost bin
WALL_EVENTS = 50  #: events stuck at one value that make a point mass
WALL_BINS = 4  #: the edge beside a wall is 1/(WALL_BINS x bins) of the moving events from it (TAIL_EVENTS at least)
SEED = 20240601  #: the uniforms' own stream: the estimate never moves a training's random numbers
CHUNK = 1 << 18  #: events per simulator call (the events and their derivatives are kept: n x (P + 1) floats)


def binned_fisher(events: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], p, n_uniforms: int,
                  n_events: int = N_EVENTS, bins: int = BINS, seed: int = SEED) -> np.ndarray | None:
    """The information per event (P, P), in float64, of the events of `events(q, u)` at physical parameters p (P,).

    `events` maps parameters q (m, P) and uniforms u (m, 1, n_uniforms) to events (m, 1, W) (every row of q is p, so
    that each event has its own derivative). W > 1 columns: the cells of `cell_fisher`. None where the simulator
    gives no derivative, or a non-finite one."""
    q0 = torch.as_tensor(p, dtype=torch.float32).reshape(1, -1)  # (its device: the simulator's)
    gen = torch.Generator(device=q0.device).manual_seed(seed)
    xs, js = [], []
    for start in range(0, n_events, CHUNK):
        m = min(CHUNK, n_events - start)
        q = q0.expand(m, -1).clone().requires_grad_(True)
        u = torch.rand((m, 1, n_uniforms), generator=gen, device=q0.device)
        with torch.enable_grad():
            x = events(q, u).reshape(m, -1)
            if not x.requires_grad or x.shape[1] > MAX_COLUMNS:  # (wider events: no estimate, see MAX_COLUMNS)
                return None
            jac = [torch.autograd.grad(x[:, c].sum(), q, allow_unused=True, retain_graph=True)[0]
                   for c in range(x.shape[1])]  # dx_c/dp per event and column
        if any(j is None for j in jac):
            return None
        xs.append(x.detach().cpu().double())
        js.append(torch.stack(jac, dim=1).cpu().double())  # (m, W, P)
    x, jac = torch.cat(xs), torch.cat(js)
    if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(jac).all())):
        return None
    if x.shape[1] > 1:  # several columns: decorrelated, those that add nothing dropped
        x, jac = _decorrelated(x, jac)
        if not 0 < x.shape[1] <= MAX_COLUMNS:
            return None
        if x.shape[1] > 1:
            return cell_fisher(x, jac)
    x, jac = x[:, 0], jac[:, 0]
    order = torch.argsort(x)  # sorted once: the quantiles, the bins' counts and the kernels' windows read it
    x, jac, half = x[order], jac[order], order % 2
    edges, width = _edges_and_widths(x, jac, bins)
    if edges is None:
        return None
    # each half's derivatives of the smoothed CDF at the edges; the product of the two halves' derivatives has no
    # noise bias (one half's noise squared would add sum_b var(d mu_b) / mu_b, ~bins^3 / n_events, to I)
    cdf, dcdf = zip(*(_smoothed_cdf(x[half == h], jac[half == h], edges, width) for h in (0, 1)))
    zero = torch.zeros(1, dtype=torch.float64)
    mu = torch.diff(torch.cat((zero, 0.5 * (cdf[0] + cdf[1]), zero + 1)))  # the bins' probabilities
    pad = torch.zeros(1, jac.shape[1], dtype=torch.float64)
    dmu = [torch.diff(torch.cat((pad, d, pad)), dim=0) for d in dcdf]
    keep = mu > 0
    cross = (dmu[0][keep] / mu[keep, None]).T @ dmu[1][keep]
    info = 0.5 * (cross + cross.T)
    return info.numpy() if bool(torch.isfinite(info).all()) else None  # (singular: stats.inverse_information says)


def cell_fisher(x: torch.Tensor, jac: torch.Tensor) -> np.ndarray | None:
    """The information per event (P, P) of events of W > 1 columns, x (n, W) and their derivatives jac (n, W, P), in
    the cells of a grid: each column cut into round(CELLS^(1/W)) bins (edges as one column's, `_inner_edges`, from
    its own events), an event's membership of a column's bin smoothed by the same Gaussian kernels at its edges, and
    a cell's probability mu the mean product of its columns' memberships. d mu/dp = the mean over events of
    sum_c (d membership_c / dx_c) (dx_c/dp) prod_(c' != c) membership_c'; the two halves' derivatives are multiplied,
    as for one column. The information between the columns (a parameter that shifts their correlation) is kept
    where the cells resolve it; coarser cells than one column's bins lose more of it, so the bound errs further on
    the larger side (tests/test_simfisher.py: a correlated bivariate Gaussian). `binned_fisher` decorrelates the
    columns first (`_decorrelated`); a point mass (a column clipped to a support) then lies on a slanted line, where
    no edge avoids it: ~2 % of a clipped column's information is lost (none in the first column, which stays as it
    is)."""
    n, w = x.shape
    per = int(round(CELLS ** (1.0 / w)))
    grid = []
    for c in range(w):
        order = torch.argsort(x[:, c])
        edges, width = _edges_and_widths(x[order, c], jac[order, c], per, moving=False)
        if edges is None:
            return None
        grid.append((edges, width))
    mu, dmu = 0.0, [0.0, 0.0]
    for h in (0, 1):  # the two halves: even and odd events
        xh, jh = x[h::2], jac[h::2]
        for start in range(0, len(xh), CELL_CHUNK):
            sl = slice(start, start + CELL_CHUNK)
            member, slope = zip(*(_memberships(xh[sl, c], *grid[c]) for c in range(w)))
            mu = mu + _cells(member)[:, 0]
            for c in range(w):  # column c's membership differentiated, the others' as they are
                dmu[h] = dmu[h] + _cells([slope[k] if k == c else member[k] for k in range(w)], jh[sl, c].float())
    mu = mu / n
    dmu = [d / len(x[h::2]) for h, d in enumerate(dmu)]
    keep = mu > 0
    cross = (dmu[0][keep] / mu[keep, None]).T @ dmu[1][keep]
    info = 0.5 * (cross + cross.T)
    return info.numpy() if bool(torch.isfinite(info).all()) else None


def _decorrelated(x: torch.Tensor, jac: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns decorrelated, x' = L^-1 (x - mean) with C = L L^T the events' covariance, and dx'/dp = L^-1 dx/dp
    (a fixed linear map keeps the information, and the cells then follow a correlated ridge); a column that is
    constant, or a linear combination of the columns before it (its variance left after them under 1e-6 of its
    own), is dropped: it adds no information, and its rounding noise would be binned as if it did."""
    cov = torch.cov(x.T).reshape(x.shape[1], x.shape[1])
    keep: list[int] = []  # (none: every column constant)
    for c in range(x.shape[1]):
        v = float(cov[c, c])
        if keep:
            k = torch.tensor(keep)
            v -= float(cov[c, k] @ torch.linalg.solve(cov[k][:, k], cov[k, c]))
        if float(cov[c, c]) > 0 and v > 1e-6 * float(cov[c, c]):
            keep.append(c)
    if not keep:
        return x[:, :0], jac[:, :0]
    k = torch.tensor(keep)
    chol = torch.linalg.cholesky(cov[k][:, k])
    xk = torch.linalg.solve_triangular(chol, (x[:, k] - x[:, k].mean(dim=0)).T, upper=False).T
    return xk, torch.einsum("ij,njp->nip", torch.linalg.inv(chol), jac[:, k])


def _memberships(xc: torch.Tensor, edges: torch.Tensor, width: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Events' smoothed memberships of one column's bins (m, bins) and their derivatives in the column's value, in
    float32 (the cells' sums over a chunk; the chunks add up in float64)."""
    z = ((edges[None, :] - xc[:, None]) / width[None, :]).float()
    cdf = torch.special.ndtr(z)
    dens = torch.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * width[None, :]).float()  # d cdf / d(-x)
    member, slope = torch.empty(len(xc), len(edges) + 1), torch.empty(len(xc), len(edges) + 1)
    member[:, 0], member[:, 1:-1], member[:, -1] = cdf[:, 0], cdf[:, 1:] - cdf[:, :-1], 1.0 - cdf[:, -1]
    slope[:, 0], slope[:, 1:-1], slope[:, -1] = -dens[:, 0], dens[:, :-1] - dens[:, 1:], dens[:, -1]
    return member, slope


def _cells(parts, weight: torch.Tensor | None = None) -> torch.Tensor:
    """(cells, K): the sum over events of weight (m, K) (none: ones, K = 1) times the outer product of the events'
    rows of `parts` (one (m, bins) per column), flattened; the columns but the last as an outer product per event
    (none for two columns), the last by one matrix product."""
    m = len(parts[0])
    head = parts[0][:, None, :] if weight is None else weight[:, :, None] * parts[0][:, None, :]  # (m, K, b_0)
    for part in parts[1:-1]:
        head = (head[..., None] * part[:, None, None, :]).reshape(m, head.shape[1], -1)
    k = head.shape[1]
    return (head.reshape(m, -1).T @ parts[-1]).reshape(k, -1).T.double()


def _edges_and_widths(xs: torch.Tensor, js: torch.Tensor, bins: int, moving: bool = True
                      ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One column's inner edges (`_inner_edges`, from its events sorted ascending and their derivatives) and the
    kernel's width at each: WIDTH gaps to the nearest edge, and short of any point mass by CUT widths."""
    edges, walls = _inner_edges(xs, js, bins, moving)
    if edges is None:
        return None, walls
    gaps = torch.diff(edges)
    width = WIDTH * torch.minimum(torch.cat((gaps[:1], gaps)), torch.cat((gaps, gaps[-1:])))
    if len(walls):  # no kernel reaches a point mass (events stuck at one value: clipped to a support's edge)
        width = torch.minimum(width, (edges[:, None] - walls[None, :]).abs().min(dim=1).values / CUT)
    return edges, width


def _smoothed_cdf(xs: torch.Tensor, js: torch.Tensor, edges: torch.Tensor, width: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The CDF smoothed by the Gaussian kernel, F(e) = E[Phi((e - x)/w)], and its derivative dF(e)/dp =
    -E[K_w(x - e) dx/dp] at every edge ((edges,), (edges, P)), from events xs sorted ascending and their derivatives
    js. The bins' probabilities and their derivatives come from the same smoothing: a point mass (events clipped to
    a support's edge) within a kernel's reach is then counted alike in both. The kernel is cut at CUT widths (each
    edge's window found by bisection)."""
    lo = torch.searchsorted(xs, edges - CUT * width).tolist()
    hi = torch.searchsorted(xs, edges + CUT * width).tolist()
    cdf = torch.tensor(lo, dtype=torch.float64)
    slope = torch.zeros(len(edges), js.shape[1], dtype=torch.float64)
    for i, (a, b) in enumerate(zip(lo, hi)):
        z = (edges[i] - xs[a:b]) / width[i]
        cdf[i] += torch.special.ndtr(z).sum()
        slope[i] = -(torch.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * width[i])) @ js[a:b]
    return cdf / len(xs), slope / len(xs)


def _inner_edges(xs: torch.Tensor, js: torch.Tensor, bins: int, moving: bool = True
                 ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The inner edges and the point masses ("walls": WALL_EVENTS or more events stuck at one value, as events
    clipped to a support's edge are, with no derivative), from events xs sorted ascending. The edges sit at levels of
    the CDF spaced evenly in logit(F), so that the tails, where a scale's information lies (75 % of a Gaussian
    smearing's in the events below F = 1.3 %), get bins as fine as the middle's, down to TAIL_EVENTS events in each
    outermost bin; none on a wall, no repeats. None for fewer than 2 edges, or (`moving`: one column's events) too few
    events that move with p; a column of several (`cell_fisher`) may not move at all and still count through the
    others."""
    stuck = (js == 0).all(dim=1)
    values, counts = torch.unique(xs[stuck], return_counts=True)
    walls = values[counts >= WALL_EVENTS]
    if moving and int((~stuck).sum()) < bins * TAIL_EVENTS // 8:
        return None, walls
    tail = min(0.01, TAIL_EVENTS / len(xs))  # the outermost bins' probability
    levels = torch.sigmoid(torch.linspace(math.log(tail / (1 - tail)), math.log((1 - tail) / tail), bins - 1,
                                          dtype=torch.float64))
    edges = xs[(levels * (len(xs) - 1)).round().long()]
    moving = xs[~stuck]
    k = max(TAIL_EVENTS, len(moving) // (WALL_BINS * bins))
    for v in walls.tolist():  # an edge k moving events from each side of a wall: the events beside it keep a bin
        i = int(torch.searchsorted(moving, v))
        edges = torch.cat((edges, moving[[j for j in (i - k, i + k - 1) if 0 <= j < len(moving)]]))
    edges = torch.unique(edges)
    edges = edges[~torch.isin(edges, walls)]
    return (edges if len(edges) >= 2 else None), walls
