"""The optiGAN file as opengate runs it: sample it as opengate does, score it, and make it fold-free (distillation).

    from sagips_environments.optigan.exported import load_plain, sample_like_opengate, score_samples
    plain = load_plain("model.pt")                                    # opengate's WGANGenerator layout, raw units
    gen = sample_like_opengate(plain, points, n_each=3000, seed=0)    # noise N(0, 1) of dim 10, raw condition, raw out
    score_samples(gen, mc_a, mc_b, bins=50, lo=lo, hi=hi)             # JS beside the MC-vs-MC ceiling, outside fraction

How opengate samples (opengate/contrib/optical/optigan.py, `OptiGAN.generate_and_save_optigan_output`): for each
gamma event with n optical photons, noise = torch.randn(n, 10), condition = the gamma's position (x, y, z) in mm
expanded to n rows, input = cat(noise, condition), and the raw output of `WGANGenerator.model` is written to the CSV
as X, Y, dX, dY, dZ, Ekine. There is no scaling and no fold: a network trained with `output_bounds: reflect` relies
on a fold that opengate never applies.

Distillation (`distill`): a plain network (opengate's layout) is fitted to the *folded* generator: a regression of
plain(z, c) onto fold(G(z, c)) over z ~ N(0, 1) and the condition box, starting from G's own weights (identical
wherever the fold is the identity). The result is checked by the JS similarity of its samples, not by the
regression loss (`sagips.export` does both and reports them).
"""
from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .js import FEATURES, similarity
from .nets import COND_DIM, OptiGANGenerator
from .opengate import PlainGenerator, generator_dims


def load_plain(src: str | os.PathLike | dict) -> PlainGenerator:
    """opengate's generator from an opengate file (or its `generator_state_dict`), loaded strictly as opengate does."""
    if isinstance(src, dict):
        state = src.get("generator_state_dict", src)
    else:
        ck = torch.load(src, map_location="cpu", weights_only=True)
        if not isinstance(ck, dict) or "generator_state_dict" not in ck:
            raise ValueError(f"{src}: not an opengate optiGAN file (no 'generator_state_dict')")
        state = ck["generator_state_dict"]
    noise_dim, hidden = generator_dims(state)
    plain = PlainGenerator(noise_dim, hidden)
    plain.load_state_dict(state)  # strict, as opengate's WGANGenerator.load_state_dict
    return plain.eval()


@torch.no_grad()
def sample_like_opengate(plain: torch.nn.Module, conditions: np.ndarray, n_each: int | Sequence[int],
                         seed: int = 0, noise_dim: int = 10) -> list[np.ndarray]:
    """Generated photons per emission point (list of (n_i, 6) float32 arrays), one opengate "event" per point:
    noise N(0, 1) of `noise_dim`, the raw condition expanded to n_i rows, cat(noise, condition), the raw output."""
    conditions = np.asarray(conditions, dtype=np.float32).reshape(-1, COND_DIM)
    counts = [int(n_each)] * len(conditions) if np.isscalar(n_each) else [int(n) for n in n_each]
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for c, n in zip(conditions, counts):
        noise = torch.randn(n, noise_dim, generator=g)
        cond = torch.from_numpy(c).expand(n, COND_DIM)
        out.append(plain(torch.cat((noise, cond), dim=1)).float().numpy())
    return out


def outside_fraction(samples: Sequence[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    """The fraction of rows with at least one output outside [lo, hi] (`any`), and per feature (`features`).
    Infinite bounds never count."""
    rows = np.concatenate(list(samples))
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    out = (rows < lo) | (rows > hi)
    return {"any": float(out.any(1).mean()),
            "features": {f: float(v) for f, v in zip(FEATURES, out.mean(0))}}


def score_samples(generated: Sequence[np.ndarray], mc_a: Sequence[np.ndarray], mc_b: Sequence[np.ndarray],
                  bins: int = 50, lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> dict[str, Any]:
    """JS similarity (percent) of `generated` vs the MC reference halves `mc_a`, beside the MC-vs-MC ceiling
    (`mc_b` vs `mc_a`, same sizes and bins), per feature; with bounds, the fraction of generated rows outside."""
    sim = similarity(generated, mc_a, bins)
    ceil = similarity(mc_b, mc_a, bins)
    out = {"js": sim["mean"], "js_ceiling": ceil["mean"], "js_gap": ceil["mean"] - sim["mean"],
           "js_features": sim["features"], "js_ceiling_features": ceil["features"], "points": len(mc_a)}
    if lo is not None and hi is not None:
        o = outside_fraction(generated, lo, hi)
        out["outside"], out["outside_features"] = o["any"], o["features"]
    return out


def folded_teacher(G: OptiGANGenerator) -> OptiGANGenerator:
    """A frozen copy of G (with its folds), in eval mode."""
    T = copy.deepcopy(G).cpu().eval()
    for p in T.parameters():
        p.requires_grad_(False)
    return T


def sample_conditions(box_lo: np.ndarray, box_hi: np.ndarray, points: np.ndarray | None, n: int,
                      g: torch.Generator) -> torch.Tensor:
    """(n, 3) conditions: half uniform in the box [box_lo, box_hi], half at the training points (when given),
    each jittered uniformly by +-half a grid step, so the fit covers the points and what lies between them."""
    lo = torch.as_tensor(box_lo, dtype=torch.float32)
    hi = torch.as_tensor(box_hi, dtype=torch.float32)
    c = lo + (hi - lo) * torch.rand(n, COND_DIM, generator=g)
    if points is not None and len(points):
        pts = torch.as_tensor(np.asarray(points), dtype=torch.float32)
        k = n // 2
        pick = pts[torch.randint(len(pts), (k,), generator=g)]
        step = (hi - lo) / max(1.0, round(len(pts) ** (1 / 3)))
        c[:k] = torch.minimum(torch.maximum(pick + (torch.rand(k, COND_DIM, generator=g) - 0.5) * step, lo), hi)
    return c


def distill(G: OptiGANGenerator, box_lo: np.ndarray, box_hi: np.ndarray, points: np.ndarray | None = None,
            steps: int = 3000, batch: int = 2048, lr: float = 1e-4, seed: int = 0, log=None) -> dict[str, Any]:
    """Fit a fold-free copy of G (same layout and standardisation, no folds) to fold(G(z, c)).

    Regression in standardised output units (MSE of (student - teacher) / out_std), Adam at `lr` with a cosine
    decay to zero over `steps` steps of `batch` rows; z ~ N(0, 1), c from `sample_conditions`. Returns
    {"student": the fitted OptiGANGenerator (folds off), "mse": final mean loss, "mse_start": first, "steps",
    "seconds"}. Deterministic for a given seed on one thread.
    """
    teacher = folded_teacher(G)
    student = copy.deepcopy(teacher)
    student.bounded = False
    student.unit_direction = False
    for p in student.parameters():
        p.requires_grad_(True)
    student.train()
    g = torch.Generator().manual_seed(int(seed))
    opt = torch.optim.Adam(student.model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1.0 + math.cos(math.pi * min(k, steps) / steps)))
    inv_std = 1.0 / teacher.out_std
    t0 = time.perf_counter()
    first = last = math.nan
    window: list[float] = []
    for k in range(steps):
        z = torch.randn(batch, G.noise_dim, generator=g)
        c = sample_conditions(box_lo, box_hi, points, batch, g)
        x = torch.cat([z, c], dim=1)
        with torch.no_grad():
            target = teacher(x)
        loss = (((student(x) - target) * inv_std) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        v = float(loss.detach())
        if k == 0:
            first = v
        window.append(v)
        if len(window) > 100:
            window.pop(0)
        last = float(np.mean(window))
        if log is not None and (k + 1) % max(1, steps // 10) == 0:
            log(f"distill: step {k + 1}/{steps}, mse {last:.3g} (standardised units), {time.perf_counter() - t0:.0f} s")
    student.eval()
    for p in student.parameters():
        p.requires_grad_(False)
    return {"student": student, "mse": last, "mse_start": first, "steps": steps, "batch": batch,
            "seconds": time.perf_counter() - t0}


def environment_for_config(config: dict, seed: int | None = None):
    """(env, cfg): the optigan environment of a run's resolved config (run.json's `config`), with the reference
    data made again as the run made it (the MC from the run's seed, or its data_file / heldout_file), so that its
    held-out set, bounds and standardisation are the run's."""
    from sagips.config import load

    from .env import OptiGAN

    # the export's generator is the checkpoint's: the run's starting point is not needed, and its path (relative to
    # where the run started, or moved since) must not fail the export
    config = {**config, "environment": {**(config.get("environment") or {}), "init_generator": None}}
    cfg = load(None, base=config)
    if cfg.environment.name != "optigan":
        raise ValueError(f"a run of environment {cfg.environment.name!r}, not optigan")
    s = cfg.seed if seed is None else seed
    if cfg.environment.data_file:
        from sagips.io.refdata import read_reference

        arrays, attrs = read_reference(cfg.environment.data_file, OptiGAN.datasets)
    else:
        arrays, attrs = OptiGAN.generate_reference(cfg.environment, s)
    env = OptiGAN(cfg.environment, "cpu", seed=s)
    env.attach_data(arrays, attrs, np.random.default_rng(s))
    return env, cfg


def folded_generator(env, state: dict) -> OptiGANGenerator:
    """The run's generator (with its folds, as the run scored it) from a SAGIPS `generator` state dict."""
    G = env.build_generator().cpu()
    G.load_state_dict(state)
    return G.eval()
