"""Interoperability with GATE 10's optiGAN (OpenGATE/opengate, `opengate/contrib/optical/optigan.py`).

    from sagips_environments.optigan.opengate import load_opengate, save_opengate
    G = load_opengate("model_3341.pt")                    # an OptiGANGenerator (identity standardisation)
    photons = G(torch.cat([torch.randn(n, 10), cond.expand(n, 3)], 1))
    save_opengate("model.pt", G, D, epoch=1000)           # opengate's keys and layout; loads there unchanged

The file opengate reads is a dict (torch.save) with the keys of `OPENGATE_KEYS` -- note opengate's spelling
`discrminator_optimizer_state_dict` -- whose `generator_state_dict` holds exactly `model.{0,2,4,6}.{weight,bias}`
of a 13 -> 128 -> 256 -> 512 -> 6 ReLU MLP (opengate: `WGANGenerator.load_state_dict`, strict). opengate feeds raw
conditions (mm) and uses the raw outputs, so the standardisation buffers of SAGIPS's modules are folded into the
first and last Linear layers on the way out (`OptiGANGenerator.fold`) and unfolded on the way in.

The optimizer states written are fresh (empty `state`, the run's lr and betas): Adam moments of standardised
parameters do not carry over exactly to the folded ones, and opengate never reads them.
"""
from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import nn

from .nets import COND_DIM, PHOTON_DIM, OptiGANCritic, OptiGANGenerator, critic_sequential, generator_sequential

OPENGATE_KEYS = ("epoch", "generator_state_dict", "discriminator_state_dict", "generator_optimizer_state_dict",
                 "discrminator_optimizer_state_dict", "generator_loss", "discriminator_loss")
GENERATOR_KEYS = tuple(f"model.{i}.{k}" for i in (0, 2, 4, 6) for k in ("weight", "bias"))
CRITIC_KEYS = tuple(f"model.{i}.{k}" for i in (0, 3, 6, 8) for k in ("weight", "bias"))


class PlainGenerator(nn.Module):
    """opengate's WGANGenerator as it is (no scaling): `model` = the Sequential, forward = model(x)."""

    def __init__(self, noise_dim: int = 10, hidden: int = 128):
        super().__init__()
        self.model = generator_sequential(noise_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class PlainCritic(nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.model = critic_sequential(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def generator_dims(state: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(noise_dim, hidden) of a `model.*` generator state dict; a ValueError if it is not optiGAN's layout."""
    keys = tuple(k for k in state if k.startswith("model."))
    if sorted(keys) != sorted(GENERATOR_KEYS):
        raise ValueError(f"not an optiGAN generator state dict: keys {sorted(keys)} (expected {list(GENERATOR_KEYS)})")
    hidden, n_in = state["model.0.weight"].shape
    if state["model.6.weight"].shape[0] != PHOTON_DIM or n_in <= COND_DIM:
        raise ValueError(f"optiGAN generator shapes: model.0 {tuple(state['model.0.weight'].shape)}, model.6 "
                         f"{tuple(state['model.6.weight'].shape)} (expected (h, noise+3) and (6, 4h))")
    return n_in - COND_DIM, hidden


def load_opengate(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> OptiGANGenerator:
    """An opengate optiGAN file (e.g. model_3341.pt) as an OptiGANGenerator with identity standardisation."""
    ck = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(ck, dict) or "generator_state_dict" not in ck:
        raise ValueError(f"{path}: not an opengate optiGAN file (no 'generator_state_dict')")
    state = ck["generator_state_dict"]
    noise_dim, hidden = generator_dims(state)
    G = OptiGANGenerator(noise_dim, hidden)
    G.unfold(state)
    return G


def load_weights_into(G: OptiGANGenerator, path: str | os.PathLike) -> None:
    """Initialise G (for fine-tuning) from an opengate file or a SAGIPS checkpoint; G's function becomes the file's.

    An opengate file holds raw-units weights: they are unfolded into G's current standardisation. A SAGIPS
    checkpoint holds `generator` (weights and buffers): it is loaded as it is.
    """
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(ck, dict) and "generator_state_dict" in ck:
        noise_dim, hidden = generator_dims(ck["generator_state_dict"])
        if (noise_dim, hidden) != (G.noise_dim, G.model[0].out_features):
            raise ValueError(f"{path}: generator has noise_dim={noise_dim}, hidden={hidden}; the config asks for "
                             f"noise_dim={G.noise_dim}, hidden={G.model[0].out_features}")
        G.unfold({k: v.to(G.cond_mean.device) for k, v in ck["generator_state_dict"].items()})
    elif isinstance(ck, dict) and "generator" in ck:
        G.load_state_dict(ck["generator"])
    else:
        raise ValueError(f"{path}: neither an opengate optiGAN file nor a SAGIPS checkpoint")


def fresh_adam_state(module: nn.Module, lr: float, betas: tuple[float, float]) -> dict[str, Any]:
    """The state_dict of a new Adam over module's parameters, with the param-group keys of model_3341.pt (written
    out rather than taken from torch.optim.Adam, so the file does not change with the torch version)."""
    n = len(list(module.parameters()))
    group = {"lr": float(lr), "betas": (float(betas[0]), float(betas[1])), "eps": 1e-08, "weight_decay": 0,
             "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
             "fused": False, "params": list(range(n))}
    return {"state": {}, "param_groups": [group]}


def opengate_checkpoint(G: OptiGANGenerator, D: OptiGANCritic | None = None, epoch: int = 0,
                        generator_loss: float = math.nan, discriminator_loss: float = math.nan,
                        lr: float | tuple[float, float] = 5e-5, betas: tuple[float, float] = (0.5, 0.9)
                        ) -> dict[str, Any]:
    """The dict opengate loads: folded (raw-units) state dicts, fresh optimizer states (lr: one rate, or the
    generator's and the critic's), the epoch and losses.

    Without `D` an untrained critic of the right layout is written (SAGIPS checkpoints hold the generator only).
    """
    lr_g, lr_d = (lr, lr) if isinstance(lr, (int, float)) else lr
    g_state = G.fold()
    if D is None:
        D = OptiGANCritic()
    d_state = D.fold()
    plain_g = PlainGenerator(G.noise_dim, G.model[0].out_features)
    plain_g.load_state_dict(g_state)
    plain_d = PlainCritic()
    plain_d.load_state_dict(d_state)
    return {
        "epoch": int(epoch),
        "generator_state_dict": g_state,
        "discriminator_state_dict": d_state,
        "generator_optimizer_state_dict": fresh_adam_state(plain_g, lr_g, betas),
        "discrminator_optimizer_state_dict": fresh_adam_state(plain_d, lr_d, betas),  # (sic): opengate's key
        "generator_loss": float(generator_loss),
        "discriminator_loss": float(discriminator_loss),
    }


def save_opengate(path: str | os.PathLike, G: OptiGANGenerator, D: OptiGANCritic | None = None, **kw: Any) -> None:
    """Write `opengate_checkpoint(G, D, **kw)` atomically."""
    from sagips.io.atomic import atomic_open

    payload = opengate_checkpoint(G, D, **kw)
    with atomic_open(path, "wb") as fh:
        torch.save(payload, fh)


def shift_frame(state: dict[str, torch.Tensor], noise_dim: int, origin) -> dict[str, torch.Tensor]:
    """A raw-units generator state dict in a frame where the SAGIPS origin lies at `origin` (mm): it takes
    conditions and gives the photon positions X, Y in that frame, plain'(z, c) = plain(z, c - origin) + (origin_x,
    origin_y, 0, 0, 0, 0). Exact, in the biases: the first layer's b0 <- b0 - W0[:, conditions] @ origin, the last
    layer's b[X, Y] += origin[:2]. (Directions and energy do not depend on the frame; the crystal's axis stays z.)"""
    o = torch.as_tensor(origin, dtype=torch.float64).reshape(COND_DIM)
    out = dict(state)
    w = state["model.0.weight"].double()[:, noise_dim:]
    out["model.0.bias"] = (state["model.0.bias"].double() - w @ o).float().contiguous()
    last = max((k for k in state if k.startswith("model.") and k.endswith(".bias")), key=lambda k: int(k.split(".")[1]))
    b = state[last].double().clone()
    b[:2] += o[:2]  # (outputs X, Y, dX, dY, dZ, EKine)
    out[last] = b.float().contiguous()
    return out
