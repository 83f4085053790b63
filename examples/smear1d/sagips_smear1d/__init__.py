"""A simulator with a weak parameter: decay times t ~ Exp(tau), seen by a detector of Gaussian resolution."""
import math

import torch

from sagips import ParametricEnvironment


class Smear1D(ParametricEnvironment):
    name = "smear1d"
    parameters = {"tau": (0.5, 2.0), "resolution": (0.05, 0.5)}  # name -> (low, high), in order
    true_params = {"tau": 1.0, "resolution": 0.2}  # tau is strong; the resolution is seen only at the rising edge
    support = (-2.0, 12.0)  # the detector's range: simulated events outside it are clipped to its edges
    n_uniforms = 2  # uniforms per event: one for the decay, one for the smearing (event_width stays 1)
    presets = {"quick": "quick.yaml"}  # sagips.run --config smear1d:quick

    def simulate(self, p, u):  # p: (B, 2) physical values, u: (B, E, 2) uniforms in [0, 1) -> (B, E, 1)
        tau, resolution = p[:, None, 0:1], p[:, None, 1:2]
        t = -tau * torch.log1p(-u[..., 0:1])  # Exp(tau): finite for u in [0, 1)
        z = math.sqrt(2.0) * torch.erfinv(2.0 * u[..., 1:2].clamp(1e-7, 1 - 1e-7) - 1.0)  # N(0, 1)
        return t + resolution * z
