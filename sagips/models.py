"""MLP builders and initialisation. Pure torch: no MPI here (parallelism is applied from outside).

Paper sizes (SAGIPS Table III, section V-A):
    generator     = mlp(6, 6, hidden=128, layers=4, out_act=nn.Sigmoid())  -> 51,206 parameters
    discriminator = mlp(2, 1, hidden=128, layers=4)                        -> 50,049 parameters
"""
from __future__ import annotations

import torch
from torch import nn


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


def n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters() if p.requires_grad)
