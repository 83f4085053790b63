"""The proxy 1D environment: the loop-closure test of the SAGIPS paper (section V).

The generator maps noise (dimension 6) to p in [0, 1]^6 (Sigmoid), mapped to physical parameters; the pipeline
samples `events_per_sample` events per parameter set from sigma1 and sigma2 with the inverse-CDF sampler; the
discriminator sees (x1, x2) pairs. A norm loss (MSE of generated vs reference norms) fixes the overall scale.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sagips.config import ConfigError, opt
from sagips.environment import Environment
from sagips.models import ScaledInput, mlp, on_events, start_generator

from . import theory


@dataclass
class Proxy1DConfig:
    """`environment:` section for name=proxy1d. Defaults are the paper's settings."""

    name: str = opt("proxy1d", "registered environment name")
    true_params: list[float] = opt(list(theory.TRUE_PARAMS), "the truth p0..p5 used to make reference data")
    param_min: list[float] = opt(list(theory.PARAM_MIN), "lower bounds of the physical parameters")
    param_max: list[float] = opt(list(theory.PARAM_MAX), "upper bounds of the physical parameters")
    grid_points: int = opt(1000, "x grid points in [x_min, x_max] for the CDF", min=3)
    x_min: float = opt(0.1, "lower end of the x grid", gt=0.0)
    x_max: float = opt(0.99999, "upper end of the x grid", max=0.99999999)
    data_file: str | None = opt(None, "reference HDF5 file (dataset 'events'); null = generate from true_params")
    reference_events: int = opt(1_000_000, "events generated when no data_file is given", min=1)
    param_samples: int = opt(1024, "parameter sets predicted per epoch (paper: 1024)", min=1)
    events_per_sample: int = opt(100, "events sampled per parameter set (paper: 100)", min=1)
    subset_fraction: float = opt(0.5, "fraction of the reference data each rank keeps", gt=0.0, max=1.0)
    noise_dim: int = opt(6, "generator noise dimension", min=1)
    hidden: int = opt(128, "hidden width of both networks", min=1)
    d_hidden: int | None = opt(None, "hidden width of the discriminator alone (null = hidden, the paper's); a "
                               "narrower critic costs less per event, so an epoch can show it more events", min=1)
    layers: int = opt(4, "hidden layers of both networks", min=1)
    loss: str = opt("bce", "adversarial loss: 'bce' (non-saturating GAN) or 'mse' (least squares)",
                    choices=("bce", "mse"))
    norm_weight: float = opt(1.0, "weight of the norm loss in the generator loss", min=0.0)
    d_steps: int = opt(1, "discriminator steps per generator step", min=1)
    d_input: str = opt("x", "what the discriminator sees of an event: 'x' (the paper) or 'log' (log x, which "
                       "spreads out the low-x region where the parameters differ most)", choices=("x", "log"))
    d_scale: str = opt("none", "what the discriminator's input is standardised by: 'none' (the paper: raw events, "
                       "every first-layer kink at 0, outside the events) or 'data' (the mean and spread of the "
                       "reference events the rank holds, the kinks at them, as a ParametricEnvironment's critic; "
                       "with train.lr_g=1e-3 nearer the ML fit at the default truth, but its d valley unfinished at "
                       "2 of 5 truths: docs/benchmarks/loop_closure_notes.md)", choices=("none", "data"))
    g_out_scale: float = opt(1.0, "scale of the generator's output-layer weights at initialisation (1 = Kaiming, "
                             "like the hidden layers; small values start every noise vector near the middle of the "
                             "parameter box instead of at a random, often near-saturated, point)", min=0.0)
    noise_scale: float = opt(1.0, "standard deviation of the generator's Gaussian noise (1 = N(0, 1), the paper); a "
                             "small value makes the generator nearly one point, so that its mean prediction is not "
                             "the mean of a broad mixture over p", min=0.0)
    spread_weight: float = opt(0.0, "weight of a penalty on the generator's spread over noise, "
                               "spread_weight * mean_i Var_noise(p_i) of the [0, 1] outputs, added to the generator "
                               "loss; the truth is one point, and a broad mixture over p biases the mean prediction "
                               "(0 = the paper's loss)", min=0.0)

    def validate(self) -> None:
        for key in ("true_params", "param_min", "param_max"):
            if len(getattr(self, key)) != 6:
                raise ConfigError(f"environment.{key}: expected 6 values, got {len(getattr(self, key))}")
        for i, (lo, hi, t) in enumerate(zip(self.param_min, self.param_max, self.true_params)):
            if not lo < hi:
                raise ConfigError(f"environment.param_min[{i}]: must be < param_max[{i}] ({lo} >= {hi})")
            if not lo <= t <= hi:
                raise ConfigError(f"environment.true_params[{i}]: {t} is outside [{lo}, {hi}]")
            if t == 0:
                raise ConfigError(f"environment.true_params[{i}]: must be non-zero (residuals divide by it)")
        if not self.x_min < self.x_max:
            raise ConfigError(f"environment.x_min: must be < x_max ({self.x_min} >= {self.x_max})")


class Proxy1D(Environment):
    name = "proxy1d"
    batch_key = "param_samples"  #: train.split_batch divides it (eq. 10)
    Config = Proxy1DConfig
    datasets = {"events": 2}
    g_loss_reads_real = False  #: the generator step draws no real batch (its loss compares norms, not events)
    keeps_arrays = True  #: attach_subset keeps the events as given (data.share=node: the node's window itself)

    def __init__(self, cfg: Proxy1DConfig, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(cfg, device, seed)
        self.n_critic = cfg.d_steps
        dev = self.device
        self.x = theory.make_grid(cfg.grid_points, cfg.x_min, cfg.x_max, device=dev)
        self._logs = theory.grid_logs(self.x)  # constants of the run: never recomputed per step
        self.pmin = torch.tensor(cfg.param_min, device=dev)
        self.pmax = torch.tensor(cfg.param_max, device=dev)
        self.true = torch.tensor(cfg.true_params, device=dev)
        self.data: torch.Tensor | None = None
        self.ref_norms: torch.Tensor | None = None
        self._n_fake = cfg.param_samples * cfg.events_per_sample
        # preallocated label tensors for the adversarial losses (no per-step allocation)
        self._ones = torch.ones(self._n_fake, 1, device=dev)
        self._real_fake = torch.cat((self._ones, torch.zeros(self._n_fake, 1, device=dev)))  # d_loss's targets

    # -- reference data ---------------------------------------------------------------------------------------
    @classmethod
    def generate_reference(cls, cfg: Proxy1DConfig, seed: int, n_events: int | None = None
                           ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        n = n_events or cfg.reference_events
        x = theory.make_grid(cfg.grid_points, cfg.x_min, cfg.x_max, dtype=torch.float64)
        p = torch.tensor([cfg.true_params], dtype=torch.float64)
        norms, cdf = theory.norms_and_cdf(p, x)
        gen = torch.Generator().manual_seed(seed)
        out = np.empty((n, 2), dtype=np.float32)
        chunk = 1 << 20
        for start in range(0, n, chunk):  # chunks bound the memory of searchsorted on huge N
            m = min(chunk, n - start)
            u = torch.rand((1, 2, m), generator=gen, dtype=torch.float64)
            out[start:start + m] = theory.sample_inverse_cdf(cdf, x, u)[0].T.numpy()
        attrs = {"true_params": np.asarray(cfg.true_params, dtype=np.float64),
                 "norms": norms[0].numpy().astype(np.float64)}
        return {"events": out}, attrs

    def attach_data(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any], rng: np.random.Generator) -> None:
        self._events = arrays["events"]
        n_keep = max(1, int(round(self.cfg.subset_fraction * len(self._events))))
        if n_keep == len(self._events):  # every event: what a sorted choice of all would give, without the shuffle
            self.select_subset(np.arange(n_keep))
        else:
            self.select_subset(np.sort(rng.choice(len(self._events), size=n_keep, replace=False)))
        self._attach_norms(attrs)

    def attach_subset(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> None:
        """This rank's events, read by the framework (sagips/io/shard.py): kept as they are."""
        self._events, self.subset_idx = None, None
        self.data = torch.as_tensor(np.ascontiguousarray(arrays["events"], dtype=np.float32), device=self.device)
        self._attach_norms(attrs)

    def _attach_norms(self, attrs: dict[str, Any]) -> None:
        if "norms" in attrs:
            self.ref_norms = torch.as_tensor(np.asarray(attrs["norms"], dtype=np.float32), device=self.device)
        else:  # a data file without norms: use the theory's norms at the configured truth
            self.ref_norms = theory.norms_and_cdf(self.true[None], self.x)[0][0]

    def select_subset(self, idx: np.ndarray) -> None:
        """Keep the reference events `idx` (this rank's share) on the device."""
        self.subset_idx = np.asarray(idx, dtype=np.int64)
        self.data = torch.as_tensor(self._events[self.subset_idx], device=self.device)

    # -- networks ------------------------------------------------------------------------------------------------
    def build_generator(self) -> torch.nn.Module:
        c = self.cfg
        G = mlp(c.noise_dim, 6, c.hidden, c.layers, out_act=torch.nn.Sigmoid())
        return start_generator(G, c.g_out_scale).to(self.device)

    def build_discriminator(self) -> torch.nn.Module:
        c = self.cfg
        D = mlp(2, 1, c.d_hidden or c.hidden, c.layers)
        if c.d_scale == "data":
            if self.data is not None and len(self.data) >= 2:
                D = on_events(D, self._view(self.data))
            else:  # no events yet (a bare Trainer): the grid's middle and half-width
                lo, hi = (float(self._view(torch.tensor(v))) for v in (c.x_min, c.x_max))
                D = ScaledInput(D, [(lo + hi) / 2] * 2, [(hi - lo) / 2] * 2)
        return D.to(self.device)

    # -- one epoch ---------------------------------------------------------------------------------------------
    def noise(self, n: int) -> torch.Tensor:
        z = torch.randn((n, self.cfg.noise_dim), generator=self.gen, device=self.device)
        return z if self.cfg.noise_scale == 1.0 else z * self.cfg.noise_scale

    def real_batch(self) -> torch.Tensor:
        idx = torch.randint(len(self.data), (self._n_fake,), generator=self.gen, device=self.device)
        return self.data[idx]

    def params(self, G: torch.nn.Module, n: int) -> torch.Tensor:
        return theory.to_physical(G(self.noise(n)), self.pmin, self.pmax)

    def synthesize(self, G: torch.nn.Module, real: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(events (B * E, 2), norms (B, 2), generator outputs in [0, 1] (B, 6))."""
        unit = G(self.noise(self.cfg.param_samples))
        p = theory.to_physical(unit, self.pmin, self.pmax)
        events, norms = theory.sample_events(p, self.x, self.cfg.events_per_sample, self.gen, self._logs)
        return events, norms, unit

    def _adv_sum(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The adversarial loss summed over rows (callers divide by the row count: a mean over chunks)."""
        if self.cfg.loss == "bce":
            return F.binary_cross_entropy_with_logits(logits, target, reduction="sum")
        return F.mse_loss(logits, target, reduction="sum")

    def _view(self, events: torch.Tensor) -> torch.Tensor:
        """The discriminator's input (a fixed, invertible map of the events)."""
        return torch.log(events) if self.cfg.d_input == "log" else events

    def d_loss(self, D, real, fake) -> torch.Tensor:
        events = fake[0]
        # One critic pass over real and fake rows together: the same two mean losses as D(real) and D(fake) (the
        # critic has no batch statistics), in row chunks that stay in cache (Environment.critic_loss).
        n = len(real)
        return self.critic_loss(lambda x, t: self._adv_sum(D(x), t) / n,
                                (self._view(torch.cat((real, events))), self._real_fake), D)

    @staticmethod
    def spread(unit: torch.Tensor) -> torch.Tensor:
        """mean_i Var_noise(p_i) of the generator's [0, 1] outputs (B, 6) over the batch of noise vectors."""
        return unit.float().var(dim=0, unbiased=False).mean()

    def g_loss(self, D, real, fake) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        events, norms, unit = fake
        n = len(events)
        adv = self.critic_loss(lambda x, t: self._adv_sum(D(x), t) / n, (self._view(events), self._ones), D)
        norm_loss = F.mse_loss(norms, self.ref_norms.expand_as(norms))
        loss = adv + self.cfg.norm_weight * norm_loss
        extras = {"norm_loss": norm_loss}
        if self.cfg.spread_weight > 0:
            spread = self.spread(unit)
            loss = loss + self.cfg.spread_weight * spread
            extras["spread"] = spread
        return loss, extras

    @property
    def events_per_epoch(self) -> int:
        return self._n_fake

    # -- the data's information (sagips.analyze: the Cramér-Rao bound, the correlation check) --------------------
    #: how much sharper than the events the reference's norms count in `fisher` (they are known exactly): the bound
    #: is then the constrained fit's to ~3e-5, and the matrix stays invertible over the box (1e6 did not everywhere)
    NORM_SHARPNESS = 1e4

    def fisher(self, p: Any) -> np.ndarray:
        """The information per event (6, 6) at physical parameters p, in float64 on the CPU.

        An event is two independent draws, x ~ sigma1 and x ~ sigma2, from the sampler's density, which is uniform
        inside each cell of the grid (the inverse of a piecewise-linear CDF). So the cells' probabilities P_kc hold
        all of it: I = sum over both observables and all cells of grad P grad P^T / P (exact, no binning loss).
        The shapes leave the amplitudes' scale open; the reference's two norms fix it (the generator's norm loss,
        and the ML fit's constraints in benchmarks/loop_closure.py). They enter as a measurement NORM_SHARPNESS
        times sharper than the events' information, so that the Cramér-Rao bound is the constrained fit's."""
        cfg = self.cfg
        x = theory.make_grid(cfg.grid_points, cfg.x_min, cfg.x_max, dtype=torch.float64)
        logs = theory.grid_logs(x)
        q = torch.as_tensor(np.asarray(p, dtype=np.float64).reshape(-1))

        def cells(v: torch.Tensor) -> torch.Tensor:
            cdf = theory.norms_and_cdf(v[None], x, logs)[1][0]
            return (cdf[:, 1:] - cdf[:, :-1]).reshape(-1)

        def norms(v: torch.Tensor) -> torch.Tensor:
            n = theory.norms_and_cdf(v[None], x, logs)[0][0]
            return n / n.detach()  # relative: the constraint weighs both norms alike

        prob, grad = cells(q), torch.func.jacfwd(cells)(q)  # forward mode: 6 inputs, 2 x (G - 1) outputs
        keep = prob > 0
        info = (grad[keep].T / prob[keep]) @ grad[keep]
        c = torch.func.jacfwd(norms)(q)
        sharp = self.NORM_SHARPNESS * torch.trace(info) / torch.trace(c.T @ c)
        return (info + sharp * c.T @ c).numpy()

    # -- quality -----------------------------------------------------------------------------------------------
    def truth(self) -> list[float]:
        return list(self.cfg.true_params)

    @torch.no_grad()
    def predict(self, G: torch.nn.Module, n: int) -> torch.Tensor:
        """Mean physical prediction over n noise vectors (shape (6,)).

        The noise comes from its own fixed-seed stream: logging never perturbs the training's random stream
        (a resumed run stays bit-identical), and every evaluation uses the same noise (smooth curves).
        """
        gen = torch.Generator(device=self.device).manual_seed(20240601)
        z = torch.randn((n, self.cfg.noise_dim), generator=gen, device=self.device) * self.cfg.noise_scale
        return theory.to_physical(G(z), self.pmin, self.pmax).mean(0)

    @torch.no_grad()
    def quality(self, G: torch.nn.Module, n: int = 1024) -> dict[str, Any]:
        return self._residuals(self.predict(G, n).tolist())

    def _residuals(self, p_hat: list[float]) -> dict[str, Any]:
        """r_i = (p_i - p^_i) / p_i (eq. 6) of a mean prediction p^."""
        r = [(t - p) / t for t, p in zip(self.cfg.true_params, p_hat)]
        return {"params": list(p_hat), "residuals": r, "max_abs_residual": max(abs(v) for v in r)}

    def combine_quality(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Residuals of the prediction averaged over the ranks' generators (eq. 7 over ranks)."""
        p_hat = np.mean([q["params"] for q in per_rank], axis=0).tolist()
        out = self._residuals(p_hat)
        out["rank_max_abs_residual"] = [q["max_abs_residual"] for q in per_rank]
        out["rank_params"] = [q["params"] for q in per_rank]  # the spread of the ranks (the convergence diagnostic)
        return out

    def progress_fields(self, q: dict[str, Any]) -> dict[str, str]:
        return {"max|r|": f"{q['max_abs_residual']:.3f}"}

    def summary_table(self, q: dict[str, Any]) -> str:
        rows = ["  i   true        predicted   residual (p-p^)/p", "  " + "-" * 46]
        for i, (t, p, r) in enumerate(zip(self.cfg.true_params, q["params"], q["residuals"])):
            rows.append(f"  {i}  {t:+10.5f}  {p:+10.5f}  {r:+10.4f}")
        rows.append(f"  max |r| = {q['max_abs_residual']:.4f}")
        return "\n".join(rows)
