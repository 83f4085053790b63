"""A 3-parameter toy inverse problem for SAGIPS: events x in [0, 1] from f(x) ∝ 1 + b x + a x² exp(-c x)."""
import torch

from sagips import ParametricEnvironment


class Toy1D(ParametricEnvironment):
    name = "toy1d"
    parameters = {"a": (0.5, 3.0), "b": (-1.0, 1.0), "c": (0.1, 2.0)}  # name -> (low, high), in order
    true_params = {"a": 1.7, "b": -0.4, "c": 0.9}  # the truth of generated reference data
    support = (0.0, 1.0)  # the range of x
    presets = {"quick": "quick.yaml"}  # sagips.run --config toy1d:quick

    def density(self, p, x):  # p: (B, 3) physical values, x: (G,) grid -> (B, G), >= 0
        a, b, c = p[:, :1], p[:, 1:2], p[:, 2:3]
        return 1 + b * x + a * x * x * torch.exp(-c * x)
