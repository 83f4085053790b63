"""Broken variants of the example environment examples/toy1d, each with one mistake that a first-epoch check
(sagips.checks) must name. Importable once examples/toy1d is on sys.path (tests/_plugins.py)."""
import torch
from sagips_toy1d import Toy1D

from sagips import ParametricEnvironment
from sagips.models import mlp


class Narrow(Toy1D):
    """A generator with 2 outputs for 3 parameters (a shape error deep in torch without the check)."""

    width = 2

    def build_generator(self):
        return mlp(self.noise_dim, self.width, 8, 1, out_act=torch.nn.Sigmoid())


class Narrow1(Narrow):
    """A generator with 1 output: it broadcasts over the 3 parameters, and without the check nothing fails."""

    width = 1


class Detached(Toy1D):
    """A density that cuts the graph: no gradient reaches the generator."""

    def density(self, p, x):
        return super().density(p.detach(), x)


class NaNAtLargeC(Toy1D):
    """A density that is NaN for c > 1 (inside the bounds, above the truth's 0.9)."""

    def density(self, p, x):
        f = super().density(p, x)
        return torch.where(p[:, 2:3] > 1.0, f * float("nan"), f)


class Flat(Toy1D):
    """A full-protocol override of synthesize that returns flat events (N,) instead of (N, 1)."""

    def synthesize(self, G, real=None):
        return super().synthesize(G, real).reshape(-1)


class Slope(ParametricEnvironment):
    """The simulate form: x = u ** (1 / m) has the density m x^(m-1) on [0, 1]."""

    name = "slope"
    parameters = {"m": (0.5, 3.0)}
    true_params = {"m": 1.5}

    def simulate(self, p, u):
        return u ** (1.0 / p[:, None, :])


class InfSlope(Slope):
    """A simulator that returns infinite events."""

    def simulate(self, p, u):
        return super().simulate(p, u) / torch.zeros_like(u)
