"""MLP builders and initialisation. Pure torch: no MPI here (parallelism is applied from outside).

Paper sizes (SAGIPS Table III, section V-A):
    generator     = mlp(6, 6, hidden=128, layers=4, out_act=nn.Sigmoid())  -> 51,206 parameters
    discriminator = mlp(2, 1, hidden=128, layers=4)                        -> 50,049 parameters
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def unwrap(G: nn.Module) -> nn.Module:
    """The network itself: the module that DistributedDataParallel wraps (the DDP baseline, sagips.ddp), else G."""
    return G.module if isinstance(G, DistributedDataParallel) else G


def mlp(n_in: int, n_out: int, hidden: int = 128, layers: int = 4, slope: float = 0.2,
        out_act: nn.Module | None = None, dropout: float = 0.0, inplace: bool = True) -> nn.Sequential:
    """`layers` hidden Linear layers of width `hidden`, each followed by LeakyReLU(slope) (and Dropout).

    The activations run in place on the Linear's output (`inplace`): the values are the same, one activation-sized
    tensor per layer is never allocated (105 MB per layer at the paper's critic batch of 204,800 rows), and autograd
    allows it because Linear's backward does not need its output and LeakyReLU's backward (slope > 0) can use its
    result instead of its input.
    """
    mods: list[nn.Module] = []
    width = n_in
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.LeakyReLU(slope, inplace=inplace and slope > 0)]
        if dropout > 0:
            mods.append(nn.Dropout(dropout))
        width = hidden
    mods.append(nn.Linear(width, n_out))
    if out_act is not None:
        mods.append(out_act)
    net = nn.Sequential(*mods)
    kaiming_init(net, slope)
    return net


class ScaledInput(nn.Sequential):
    """An nn.Sequential that standardises its input first: net((x - shift) / scale), per column. Its layers and
    state-dict keys are the wrapped Sequential's (shift and scale are buffers that are not saved: they come from
    the problem, not from training). A critic fed raw events of a wide range (x in [0, 10]) starts with large
    logits and sits at chance for hundreds of steps before it learns (docs/environments.md, "What the base class
    supplies", Networks)."""

    def __init__(self, net: nn.Sequential, shift, scale):
        super().__init__(*net)
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32), persistent=False)
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward((x - self.shift) / self.scale)


#: at most about this many rows (every k-th, a strided view: no copy) set a critic's scale and kinks: a rank's
#: hundreds of millions of events would otherwise be copied to float64 at build time for a 1e-3 change of the scale
SCALE_ROWS = 1_000_000


def _rows(points: torch.Tensor) -> torch.Tensor:
    """Every k-th row of `points` as (n, n_in), n <= 2 * SCALE_ROWS (all of them up to that)."""
    return points.reshape(len(points), -1)[::max(1, len(points) // SCALE_ROWS)]


def event_scale(points: torch.Tensor) -> tuple[list[float], list[float]]:
    """(shift, scale) per column of `points` (N, n_in) that standardise them: their mean and standard deviation, in
    float64 (a constant column gets scale 1), over `_rows`."""
    d = _rows(points).double()
    sd = d.std(dim=0)
    return d.mean(dim=0).tolist(), torch.where(sd > 0, sd, torch.ones_like(sd)).tolist()


def on_events(net: nn.Sequential, points: torch.Tensor) -> ScaledInput:
    """A critic `net` that sees its input standardised by the reference events `points` (N, n_in) (`event_scale`),
    with its first layer's kinks at them (`kinks_at`): where the events are, whatever their units."""
    pts = _rows(points).cpu()
    D = ScaledInput(net, *event_scale(pts))
    kinks_at(D, (pts.float() - D.shift) / D.scale)
    return D


@torch.no_grad()
def kinks_at(net: nn.Sequential, points: torch.Tensor, seed: int = 0) -> nn.Sequential:
    """Put each first-layer unit's kink on a point of `points` (N, n_in): bias_j = -w_j . x_j, the x_j evenly spaced
    quantiles of the points for one column, rows drawn with a generator of its own (`seed`) for several. With zero
    biases (kaiming_init) every kink of a critic's first layer lies at the input's origin; a narrow feature of the
    events far from it (a peak at 5 on [0, 10]) is then invisible to the critic for hundreds of steps, while kinks
    spread over the reference events resolve it at once (tests/test_critic_scale.py)."""
    first = net[0]
    n = first.out_features
    pts = _rows(points).to(first.weight.dtype)  # (torch.quantile's size limit)
    if pts.shape[1] == 1:
        x = torch.quantile(pts[:, 0], (torch.arange(n, dtype=pts.dtype) + 0.5) / n)[:, None]
    else:
        x = pts[torch.randint(len(pts), (n,), generator=torch.Generator().manual_seed(seed))]
    first.bias.copy_(-(first.weight * x).sum(dim=1))
    return net


@torch.no_grad()
def kaiming_init(net: nn.Module, slope: float = 0.2) -> None:
    """Kaiming-normal weights for the leaky-ReLU gain, zero biases, on every Linear layer.

    (The public code of the paper compared against a misspelled activation name, so its intended Kaiming init never
    ran; here the init is applied unconditionally and tested.)
    """
    for m in net.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, a=slope, nonlinearity="leaky_relu")
            nn.init.zeros_(m.bias)


@torch.no_grad()
def start_generator(G: nn.Sequential, out_scale: float = 1.0, start: float = 0.0) -> nn.Sequential:
    """Where a generator that ends in Linear + Sigmoid starts in its unit box: its output layer's weights scaled by
    `out_scale` (small: every noise vector starts near one point), and with `start` in (0, 1) its bias at the logit
    of a random point of the box's middle fraction `start` (torch's global generator: the run's seed), so that
    independent members start at different points and do not all approach the truth along one path; 0 leaves the
    bias at 0, the middle of the box."""
    out = G[-2]  # G[-1] is the Sigmoid, G[-2] the output Linear
    if out_scale != 1.0:
        out.weight.mul_(out_scale)
    if start > 0:
        out.bias.copy_(torch.logit(0.5 + start * (torch.rand(out.bias.shape) - 0.5)))
    return G


def n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters() if p.requires_grad)
