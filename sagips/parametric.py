"""`ParametricEnvironment`: an inverse problem in a few lines, for the common case of a few named, bounded parameters.

    import torch
    from sagips import ParametricEnvironment

    class Toy1D(ParametricEnvironment):
        name = "toy1d"
        parameters = {"a": (0.5, 3.0), "b": (-1.0, 1.0), "c": (0.1, 2.0)}   # name -> (low, high), ordered
        true_params = {"a": 1.7, "b": -0.4, "c": 0.9}                       # default truth for generated data
        support = (0.0, 1.0)                                                # x range of the events
        def density(self, p, x):            # p: (B, n_params) physical values, x: (G,) grid -> (B, G), >= 0
            a, b, c = p[:, :1], p[:, 1:2], p[:, 2:3]
            return 1 + b * x + a * x * x * torch.exp(-c * x)

The user writes the physics, one of two forms:
- `density(self, p, x)`: an unnormalised density of one observable on a grid of `support`; events are drawn from it
  by the differentiable inverse-CDF sampler of `sagips.sampling` (events of width 1);
- `simulate(self, p, u)`: parameters p (B, P) and uniforms u (B, E, n_uniforms) in [0, 1) -> events (B, E,
  event_width), differentiable w.r.t. p. `event_width` (columns of one event, default 1) and `n_uniforms` (uniforms
  per event, default event_width) are class attributes, set beside `parameters`. A `support` set on the class clips
  the simulated events (every column) to [low, high], in training and in the reference data alike.
Reference data and training call the physics in the same dtype, float32.

The class supplies the rest of the `sagips.Environment` protocol: its `Config` (truth, bounds, data file, batch sizes,
networks; errors name the parameter), a generator mlp(noise -> P, Sigmoid) mapped onto the bounds and a
discriminator mlp(event_width -> 1), the non-saturating GAN losses, a per-rank random subset of the reference data
(restored by --resume), `noise`, `params`, `quality` (residuals (p - p^)/p by name), `combine_quality`, `truth`,
`summary_table`, and reference data from the truth (`python -m sagips.data NAME`) or from an HDF5 file (dataset
`events`, N x event_width). Training defaults that converge in minutes come with it (`config_defaults`); a
subclass may ship `presets`. See docs/environments.md.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F

from sagips.config import ConfigError, opt
from sagips.environment import Environment, EnvironmentCheckError
from sagips.models import ScaledInput, event_scale, mlp, on_events, start_generator
from sagips.precondition import FisherPreconditioner
from sagips.sampling import make_grid, normalized_cdf, sample_inverse_cdf
from sagips.simfisher import binned_fisher


#: environment.events_per_sample=auto (issue 36, item 3): the synthetic events of one weight-average window
#: (param_samples x events_per_sample x the window, 1/(1 - train.ema) epochs) are this many times the events a rank
#: keeps. A weak parameter's training noise falls as 1/sqrt(that ratio): on smear1d's resolution, one run of 4 ranks
#: ended 1.25 sigma_ML from the data's ML fit (rms) at a ratio of 2.6 and 0.7 at 10 (coverage.notes.md)
AUTO_EVENTS_RATIO = 10
AUTO_EVENTS_RANGE = (100, 4096)  #: auto never goes under the old default, nor over this bound on one step's batch


def auto_events_per_sample(events_kept: int, param_samples: int, ema: float) -> int:
    """environment.events_per_sample=auto: the events per parameter set that make a weight-average window's
    synthetic events AUTO_EVENTS_RATIO x the `events_kept` of a rank, within AUTO_EVENTS_RANGE (its low end without
    a weight average, ema 0)."""
    low, high = AUTO_EVENTS_RANGE
    if ema <= 0:
        return low
    window = round(1.0 / (1.0 - ema), 6)  # 0.99 -> 100 epochs, not 99.99999999999991
    return int(min(max(math.ceil(AUTO_EVENTS_RATIO * events_kept / (param_samples * window)), low), high))


@dataclass
class ParametricConfig:
    """`environment:` section of a ParametricEnvironment (each subclass gets its own copy with its names and truth)."""

    #: keys a user may try that live elsewhere (config.from_dict names the place in its error)
    unknown_key_hints: ClassVar[dict[str, str]] = {
        "event_width": "event_width is a class attribute of a simulator environment (beside `parameters`), not a "
                       "config key",
        "n_uniforms": "n_uniforms is a class attribute of the environment (beside `parameters`), not a config key",
        "grid_points": "a simulator has no grid (grid_points is a setting of a `density`)"}

    name: str = opt("", "registered environment name")
    true_params: Any = opt({}, "the truth used to make reference data: a mapping name -> value (unnamed parameters "
                           "keep the environment's default) or a list in the parameters' order")
    bounds: Any = opt({}, "bounds of the parameters: a mapping name -> [low, high] (unnamed parameters keep the "
                      "environment's bounds); the generator predicts inside them")
    data_file: str | None = opt(None, "reference HDF5 file (dataset 'events', N x event width); null = generate "
                                "reference_events events from true_params")
    reference_events: int = opt(1_000_000, "events generated when no data_file is given", min=1)
    subset_fraction: float = opt(0.5, "fraction of the reference events each rank keeps", gt=0.0, max=1.0)
    param_samples: int = opt(64, "parameter sets predicted per epoch", min=1)
    events_per_sample: int | Literal["auto"] = opt(
        "auto", "events simulated per parameter set; 'auto' sizes it from the data, so that a weak parameter's "
        f"training noise falls under its statistical error: the events simulated per weight-average window "
        f"(train.ema) are {AUTO_EVENTS_RATIO} x the events each rank keeps, within [{AUTO_EVENTS_RANGE[0]}, "
        f"{AUTO_EVENTS_RANGE[1]}] ({AUTO_EVENTS_RANGE[0]} without a weight average); sagips.run prints and records "
        "the value (docs/environments.md)", min=1)
    noise_dim: int = opt(0, "generator noise dimension (0 = the number of parameters)", min=0)
    noise_scale: float = opt(0.0, "standard deviation of the generator's Gaussian noise; 0: the generator predicts "
                             "one point. Above 0 a trained generator spreads its predictions, and events from a spread "
                             "of locations look like one location with a wider width, so that the mean prediction of a "
                             "width ends low (docs/environments.md)", min=0.0)
    g_out_scale: float = opt(0.1, "scale of the generator's output-layer weights at initialisation (small: every "
                             "noise vector starts near one point, the run's start; see g_start)", min=0.0)
    g_start: float = opt(0.8, "spread of the generator's starting point: s in (0, 1) starts each run at a random "
                         "point of the box's middle fraction s (from its seed), so that independent members (--mode "
                         "ensemble, --ensemble-size) enter a flat, correlated direction at different points and do not "
                         "stop together on one side of it (toy1d: no bias along its valley; smear1d: as good as 0); 0 "
                         "starts every run at the middle of the box (docs/benchmarks/coverage.notes.md)",
                         min=0.0, max=0.99)
    hidden: int = opt(64, "hidden width of both networks (64 x 3: a few parameters and low-dimensional events need "
                      "less than the paper's 128 x 4; on smear1d's weak parameter 64 x 3 ended as near the ML fit, "
                      "6x faster)", min=1)
    layers: int = opt(3, "hidden layers of both networks", min=1)
    d_steps: int = opt(1, "discriminator steps per generator step", min=1)
    loss: str = opt("bce", "adversarial loss: 'bce' (non-saturating GAN) or 'mse' (least squares)",
                    choices=("bce", "mse"))

    #: set on each subclass's copy: name -> (low, high) and name -> truth of the environment class
    env_parameters: ClassVar[dict[str, tuple[float, float]]] = {}
    env_truth: ClassVar[dict[str, float]] = {}

    def _number(self, key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{key}: expected a finite number, got {v!r}")
        return float(v)

    def _by_name(self, key: str, given: Any, default: dict[str, Any]) -> dict[str, Any]:
        names = list(self.env_parameters)
        if given is None:
            return dict(default)
        if isinstance(given, (list, tuple)):
            if len(given) != len(names):
                raise ConfigError(f"{key}: expected {len(names)} values ({', '.join(names)}), got {len(given)}")
            given = dict(zip(names, given))
        if not isinstance(given, dict):
            raise ConfigError(f"{key}: expected a mapping name -> value ({', '.join(names)}), got {given!r}")
        unknown = [k for k in given if k not in names]
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}: unknown parameter (parameters: {', '.join(names)})")
        return {n: given.get(n, default[n]) for n in names}

    def validate(self) -> None:
        bounds = self._by_name("environment.bounds", self.bounds, {n: list(b) for n, b in self.env_parameters.items()})
        for n, b in bounds.items():
            key = f"environment.bounds.{n}"
            if not isinstance(b, (list, tuple)) or len(b) != 2:
                raise ConfigError(f"{key}: expected [low, high], got {b!r}")
            lo, hi = self._number(key, b[0]), self._number(key, b[1])
            if not lo < hi:
                raise ConfigError(f"{key}: low must be < high, got [{lo}, {hi}]")
            bounds[n] = [lo, hi]
        truth = self._by_name("environment.true_params", self.true_params, self.env_truth)
        given = self._by_name("environment.true_params", self.true_params, dict.fromkeys(self.env_truth))
        for n, t in truth.items():
            key = f"environment.true_params.{n}"
            t = truth[n] = self._number(key, t)
            lo, hi = bounds[n]
            if not lo <= t <= hi:
                where = (key if given[n] not in (None, self.env_truth[n]) else  # (else the class's own truth)
                         f"the environment class's true_params[{n!r}] (environment.true_params.{n} not changed)")
                raise ConfigError(f"{where}: {t} is outside the bounds [{lo}, {hi}] of parameter {n}")
            if t == 0:
                raise ConfigError(f"{key}: must be non-zero (the residuals (p - p^)/p divide by it)")
        self.bounds, self.true_params = bounds, truth


@dataclass
class DensityConfig(ParametricConfig):
    """`environment:` section of a ParametricEnvironment with a density (a simulator has no grid)."""

    grid_points: int = opt(1000, "grid points on the support for the density's inverse-CDF sampler", min=3)
    precondition: str = opt("fisher", "'fisher': the generator's gradient w.r.t. the parameters is multiplied by the "
                            "inverse square root of the data's Fisher information per event (in the box's unit "
                            "coordinates), refreshed at every log epoch at the rank's current prediction, so that "
                            "flat, correlated directions of the fit move about as fast as steep ones "
                            "(sagips/precondition.py); 'none': plain gradients", choices=("none", "fisher"))


class ParametricEnvironment(Environment):
    """Base class for environments whose unknowns are a few named, bounded parameters (see the module docstring)."""

    parameters: ClassVar[dict[str, tuple[float, float]]]  #: name -> (low, high), in the generator's output order
    true_params: ClassVar[dict[str, float]]  #: name -> the default truth of generated reference data
    #: the events' range: the density's grid; a simulator's events are clipped to it where the class sets it
    support: ClassVar[tuple[float, float]] = (0.0, 1.0)
    event_width: ClassVar[int] = 1  #: columns of one event (simulate form, a class attribute; the density form has 1)
    n_uniforms: ClassVar[int | None] = None  #: uniforms per event passed to simulate (None = event_width)
    clips_events: ClassVar[bool] = False  #: a simulator whose class sets `support` (set by __init_subclass__)
    SUPPORT_BLOCK: ClassVar[int] = 1 << 18  #: events per block of the reference data's check against `support`
    batch_key = "param_samples"  #: train.split_batch divides it (eq. 10)
    g_loss_reads_real = False  #: the generator loss sees synthetic events only (no real batch is drawn for it)
    keeps_arrays = True  #: attach_subset keeps the events as given (data.share=node: the node's window itself)
    pipeline_method: ClassVar[str] = "density"  #: the user's method, named by the first-epoch checks
    Config: ClassVar[type] = ParametricConfig
    datasets: ClassVar[dict[str, int]] = {"events": 1}
    #: training settings that converge in minutes for a few parameters (beneath any preset; `config_defaults` of
    #: sagips.Environment): large learning rates that decay to 10%, a simulator's generator 3x below the critic (at
    #: equal rates a width fell mid-run in 5 of 12 members of a new user's problem and climbed back too slowly to end
    #: at its floor; coverage.notes.md, thirty-fifth session; a density keeps DENSITY_LR_G), Adam beta2 0.99, frequent
    #: logs, the generator's weight average (train.ema 0.995, ~200 epochs: the checkpoints do not follow the last
    #: steps' swings), and a checkpoint every tenth of the epochs (the convergence diagnostic's last 20 % holds 3)
    config_defaults: ClassVar[dict[str, dict[str, Any]]] = {
        "train": {"epochs": 2000, "lr_g": 3e-4, "lr_d": 1e-3, "lr_final": 0.1, "beta2": 0.99, "ema": 0.995,
                  "log_every": 50, "checkpoint_every": 200, "state_every": 250},
        "comm": {"outer_every": 1},
    }
    #: train.lr_g of the density form (its generator steps through the Fisher preconditioner by default): at 3e-4
    #: toy1d's members stopped short of the bottom of its valley after 2,000 epochs (coverage.notes.md, thirty-fifth
    #: session)
    DENSITY_LR_G: ClassVar[float] = 1e-3

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "parameters", None) is None:
            return  # an intermediate base class (a subclass of an environment is one: its true_params, support...
            # of its own are used, and its Config is derived from its parent's)
        where = f"{cls.__module__}.{cls.__qualname__}"
        params, truth = cls.parameters, getattr(cls, "true_params", None)
        if not isinstance(params, dict) or not params:
            raise TypeError(f"{where}.parameters: expected a mapping name -> (low, high)")
        for attr, ranges in (("parameters", params), ("support", {None: getattr(cls, "support", (0.0, 1.0))})):
            for n, r in ranges.items():  # (a reversed range read as a bad config key or a negative density)
                at = f"{where}.{attr}" + ("" if n is None else f"[{n!r}]")
                ok = isinstance(r, (tuple, list)) and len(r) == 2 and all(
                    isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in r)
                if not ok:
                    raise TypeError(f"{at}: expected (low, high), two finite numbers, got {r!r}")
                if not r[0] < r[1]:
                    raise TypeError(f"{at}: low must be < high, got {tuple(r)}")
        if not isinstance(truth, dict) or list(truth) != list(params):
            raise TypeError(f"{where}.true_params: expected a mapping with the names of `parameters`, in their order "
                            f"({', '.join(params)})")
        if not isinstance(getattr(cls, "name", None), str):
            raise TypeError(f"{where}.name: expected the environment's registered name (a string; a base class "
                            f"that environments share defines no `parameters`, and each environment its own)")
        has_density = cls.density is not ParametricEnvironment.density
        has_simulate = cls.simulate is not ParametricEnvironment.simulate
        if has_density == has_simulate:
            raise TypeError(f"{where}: define exactly one of density(self, p, x) and simulate(self, p, u)")
        cls.pipeline_method = "density" if has_density else "simulate"
        if has_density and cls.config_defaults is ParametricEnvironment.config_defaults:  # (not the class's own)
            base = ParametricEnvironment.config_defaults
            cls.config_defaults = {**base, "train": {**base["train"], "lr_g": cls.DENSITY_LR_G}}
        for attr in ("event_width", "n_uniforms"):
            v = getattr(cls, attr, None)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise TypeError(f"{where}.{attr}: expected a positive integer (a class attribute), got {v!r}")
        if has_density:
            cls.event_width = 1
        cls.clips_events = has_simulate and any("support" in c.__dict__ for c in cls.__mro__[:-1]
                                                if issubclass(c, ParametricEnvironment) and
                                                c is not ParametricEnvironment)
        cls.datasets = {"events": cls.event_width}
        if "Config" not in cls.__dict__:
            base = DensityConfig if has_density else ParametricConfig
            parent = getattr(cls, "Config", None)  # a parent environment's, which may hold settings of its own
            cls.Config = dataclasses.make_dataclass(
                f"{cls.__name__}Config",
                [("name", str, opt(cls.name, "registered environment name")),
                 ("true_params", Any, opt(dict(truth), ParametricConfig.__dataclass_fields__["true_params"]
                                          .metadata["help"])),
                 ("bounds", Any, opt({k: list(v) for k, v in params.items()},
                                     ParametricConfig.__dataclass_fields__["bounds"].metadata["help"]))],
                bases=(parent if isinstance(parent, type) and issubclass(parent, base) else base,),
                namespace={"env_parameters": dict(params), "env_truth": dict(truth), "__module__": cls.__module__,
                           # a parameter's name given as a key: its truth or its bounds were meant
                           "unknown_key_hints": {**base.unknown_key_hints, **{
                               n: f"{n} is a parameter: its truth is environment.true_params.{n} (sagips.data: --set "
                                  f"true_params.{n}=VALUE), its range environment.bounds.{n}" for n in params}}})

    # -- the user's physics (one of the two) --------------------------------------------------------------------
    def density(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Unnormalised density of the events: p (B, P) physical parameters, x (G,) grid -> (B, G), >= 0."""
        raise NotImplementedError

    def simulate(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Events: p (B, P), u (B, E, n_uniforms) uniforms in [0, 1) -> (B, E, event_width), differentiable in p."""
        raise NotImplementedError

    # -- set-up -------------------------------------------------------------------------------------------------
    def __init__(self, cfg: Any, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(cfg, device, seed)
        dev = self.device
        self.names = list(self.parameters)
        self.n_critic = cfg.d_steps
        self.pmin = torch.tensor([cfg.bounds[n][0] for n in self.names], device=dev)
        self.pmax = torch.tensor([cfg.bounds[n][1] for n in self.names], device=dev)
        self.x = make_grid(cfg.grid_points, *self.support, device=dev) if self.pipeline_method == "density" else None
        self.data: torch.Tensor | None = None
        if cfg.events_per_sample == "auto":  # provisional, from the config alone; sagips.run sizes it from the data
            default_ema = self.config_defaults.get("train", {}).get("ema", 0.0)
            self._set_events_per_sample(auto_events_per_sample(
                round(cfg.subset_fraction * cfg.reference_events), cfg.param_samples, default_ema))
        else:
            self._set_events_per_sample(cfg.events_per_sample)
        self._first_call_checked = False
        #: environment.precondition=fisher: the generator's gradient times I^(-1/2) (sagips/precondition.py)
        fisher = self.pipeline_method == "density" and cfg.precondition == "fisher"
        self.preconditioner = FisherPreconditioner(len(self.names), dev) if fisher else None

    #: points of the box of the bounds at which the pipeline is checked before any work: its middle, its corners
    #: 1e-6 of each range inside (up to 2^10; at a bound itself a width of 0 may be no density at all) and this many
    #: others, drawn with a fixed seed (the same on every rank, which then fail alike)
    BOX_POINTS = 256
    _box_checked: ClassVar[set] = set()  #: (class, config, support, dtype) already checked in this process

    #: events per point of the box at which a simulator is checked, from uniforms of a fixed seed
    BOX_EVENTS = 64

    def _check_over_box(self, dtype: torch.dtype) -> None:
        """The pipeline over the whole box of the bounds, once per class and config in a process, at the first call:
        the generator can reach any point of it, and the step reads no device value to check each call. A density's
        shape and sign (a new user's density, negative for |slope| > 1 inside bounds of +-2: rank 0's first call
        passed, later ones sampled from a non-monotonic CDF without a word, and other ranks' first calls failed
        mid-run with a traceback); a simulator's events finite, BOX_EVENTS per point, clipped where the class clips
        (a new user's simulator, NaN for a width below 0.3 inside bounds from 0.2, trained until the generator went
        there, then failed with a traceback that blamed the learning rates)."""
        key = (type(self), repr(self.cfg), tuple(self.support or ()), dtype)  # (the config: bounds, what it reads)
        if key in ParametricEnvironment._box_checked:  # (the reference data build one environment per block)
            return
        P = len(self.names)
        lo, hi = self.pmin.double().cpu(), self.pmax.double().cpu()
        u = torch.rand((self.BOX_POINTS, P), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        pts = [torch.full((1, P), 0.5, dtype=torch.float64), u]
        if P <= 10:  # the corners, 1e-6 of the range inside (a sigmoid reaches 1.0 in float32 from a logit of 17)
            pts.append(1e-6 + (1 - 2e-6) * ((torch.arange(2 ** P)[:, None] >> torch.arange(P)) & 1).double())
        p = (lo + torch.cat(pts) * (hi - lo)).to(dtype).to(self.device)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for start in range(0, len(p), 64):
                pc = p[start:start + 64]
                if self.pipeline_method == "density":
                    self._check_density(self.density(pc, self.x), pc, self.x)
                    continue
                u = torch.rand((len(pc), self.BOX_EVENTS, self.n_uniforms or self.event_width), generator=gen,
                               dtype=dtype).to(self.device)
                ev = self.simulate(pc, u)
                ev = ev.clamp(*self.support) if self.clips_events else ev  # (as training sees them: inf to an edge)
                bad = ~torch.isfinite(ev).reshape(len(pc), -1).all(-1)
                if bool(bad.any()):
                    at = pc[int(bad.nonzero()[0, 0])].tolist()
                    named = ", ".join(f"{n}={v:.4g}" for n, v in zip(self.names, at))
                    raise EnvironmentCheckError(f"simulate: NaN or infinite events at {named} (inside the bounds, "
                                                f"where the generator can go): narrow the bounds (`parameters`, or "
                                                f"environment.bounds) or fix the simulator there")
        ParametricEnvironment._box_checked.add(key)

    def _set_events_per_sample(self, n: int) -> None:
        self.events_per_sample = int(n)
        self._n_fake = self.cfg.param_samples * self.events_per_sample
        self._ones = torch.ones(self._n_fake, 1, device=self.device)
        self._real_fake = torch.cat((self._ones, torch.zeros(self._n_fake, 1, device=self.device)))

    def size_batch(self, events_kept: int, ema: float, requested: int | None = None) -> dict[str, Any] | None:
        """environment.events_per_sample=auto, from the events this rank keeps and train.ema (auto_events_per_sample),
        against the parameter sets of the config (`requested`: before train.split_batch divided them among the ranks
        whose gradients are averaged, so that their synthetic events together are what one rank's would be);
        run.json's record of it (None where the config names a number)."""
        if self.cfg.events_per_sample != "auto":
            return None
        sets = int(requested or self.cfg.param_samples)
        self._set_events_per_sample(auto_events_per_sample(events_kept, sets, ema))
        window = round(1.0 / (1.0 - ema), 6) if ema > 0 else None
        return {"events_per_sample": self.events_per_sample, "events_kept": int(events_kept), "param_samples": sets,
                "window_epochs": window,
                "ratio": (sets * self.events_per_sample * window / events_kept) if window and events_kept else None}

    def _events(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Events (B, E, event_width) for parameters p (B, P) and uniforms u (B, E, n_uniforms)."""
        B, E = u.shape[:2]
        if self.pipeline_method == "density":
            x = self.x.to(p.dtype)
            f = self.density(p, x)
            if not self._first_call_checked:  # (the first call, on every rank alike)
                self._check_density(f, p, x)
                self._check_over_box(self.x.dtype)
            _, cdf = normalized_cdf(f, x)
            return sample_inverse_cdf(cdf, x, u[..., 0])[..., None]
        ev = self.simulate(p, u)
        if torch.is_tensor(ev) and ev.ndim == 2 and self.event_width == 1 and tuple(ev.shape) == (B, E):
            ev = ev[..., None]
        want = (B, E, self.event_width)
        if not torch.is_tensor(ev) or tuple(ev.shape) != want:
            raise EnvironmentCheckError(f"simulate: expected events of shape (B, E, event_width) = {want} for p "
                                        f"{tuple(p.shape)} and u {tuple(u.shape)}, got {self._shape_hint(ev, want)}")
        if not self._first_call_checked:  # (the first call, on every rank alike)
            self._check_over_box(p.dtype)
            self._first_call_checked = True
        if self.clips_events:  # a detector's range: events outside it land on its edges (no gradient there)
            ev = ev.clamp(*self.support)
        return ev

    def _shape_hint(self, ev: Any, want: tuple[int, int, int]) -> str:
        """The shape simulate returned, and what would fix it."""
        if not torch.is_tensor(ev):
            return f"a {type(ev).__name__} (return a torch tensor)"
        got = tuple(ev.shape)
        if ev.numel() == math.prod(want) and (self.event_width == 1 or (ev.ndim == 2 and got[1] == want[2])):
            return (f"{got}: the right number of values, return them as .reshape(u.shape[0], u.shape[1], "
                    f"{self.event_width})")
        if ev.numel() == math.prod(want):  # (a reshape would mix the columns of different events)
            return (f"{got}: the right number of values in another layout: put each event's {self.event_width} "
                    f"columns on the last axis, e.g. torch.stack(columns, dim=-1) of (B, E) tensors or "
                    f"torch.cat(columns, dim=-1) of (B, E, 1) ones")
        if ev.ndim == 3 and got[:2] == want[:2] and got[2] == 0:
            return (f"{got}: no columns per event; does simulate read more uniforms from u than n_uniforms = "
                    f"{self.n_uniforms or self.event_width}? (set the class attribute n_uniforms)")
        if ev.ndim == 3 and got[:2] == want[:2]:
            return (f"{got}: {got[2]} column(s) per event, but event_width = {self.event_width}: return "
                    f"{self.event_width} columns per event, or, if the events have {got[2]}, set the class attribute "
                    f"event_width = {got[2]}")
        return f"{got}"

    def _check_density(self, f: Any, p: torch.Tensor, x: torch.Tensor) -> None:
        """The density's shape and sign (a negative or zero density makes no CDF): at the first call's parameters,
        then over the box (`_check_over_box`)."""
        want = (p.shape[0], x.shape[0])
        if not torch.is_tensor(f) or tuple(f.shape) != want:
            shape = tuple(f.shape) if torch.is_tensor(f) else type(f).__name__
            raise EnvironmentCheckError(f"density: returned {shape} for p {tuple(p.shape)} and x {tuple(x.shape)}; "
                                        f"expected (B, G) = {want} (index parameters as p[:, i:i+1] to broadcast "
                                        f"over x)")
        fd = f.detach()
        bad_rows = ~torch.isfinite(fd).all(-1) | (fd < 0).any(-1) | ~(fd.sum(-1) > 0)
        if bool(bad_rows.any()):
            bad = int(bad_rows.nonzero()[0, 0])
            named = ", ".join(f"{n}={v:.4g}" for n, v in zip(self.names, p[bad].tolist()))
            what = "NaN or infinite" if not bool(torch.isfinite(fd[bad]).all()) else "negative or all-zero"
            raise EnvironmentCheckError(f"density: {what} values at {named} (inside the bounds): a density must be "
                                        f"finite and >= 0 with a positive integral over the support; narrow "
                                        f"the bounds (`parameters`, or environment.bounds) or fix the formula")
        self._first_call_checked = True

    # -- reference data -----------------------------------------------------------------------------------------
    @classmethod
    def generate_reference(cls, cfg: Any, seed: int, n_events: int | None = None
                           ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """reference_events (or n_events) events at cfg.true_params, simulated on the CPU in float32, the dtype of
        training (a simulator's rounding then does not differ between the data and the synthetic events)."""
        n = n_events or cfg.reference_events
        env = cls(cfg, "cpu", seed)
        p = torch.tensor([[cfg.true_params[k] for k in env.names]], dtype=torch.float32)
        gen = torch.Generator().manual_seed(seed)
        out = np.empty((n, cls.event_width), dtype=np.float32)
        chunk = 1 << 20
        with torch.no_grad():
            for start in range(0, n, chunk):  # chunks bound the sampler's memory on huge N
                m = min(chunk, n - start)
                u = torch.rand((1, m, cls.n_uniforms or cls.event_width), generator=gen, dtype=torch.float32)
                out[start:start + m] = env._events(p, u)[0].numpy()
        bad = int((~np.isfinite(out)).reshape(n, -1).any(-1).sum())
        if bad:  # (a NaN only near the truth can slip between the box's points)
            raise EnvironmentCheckError(f"simulate: {bad} of {n} reference events at the truth ("
                                        + ", ".join(f"{k}={cfg.true_params[k]:.4g}" for k in env.names)
                                        + ") are NaN or infinite: fix the simulator there")
        attrs = {"true_params": np.asarray([cfg.true_params[k] for k in env.names], dtype=np.float64),
                 "parameter_names": ",".join(env.names)}
        return {"events": out}, attrs

    def _check_support(self, events: np.ndarray, kept: bool = False) -> None:
        """Reference events must lie in `support` where every synthetic event does (a density's grid, a simulator
        that clips to it): an event outside could never be matched, and the fit would be biased. A one-line
        DataError (a measured file; generated data lie inside)."""
        if not (self.pipeline_method == "density" or self.clips_events) or not len(events):
            return
        lo, hi = (float(v) for v in self.support)
        lo, hi = lo - 1e-6 * (hi - lo), hi + 1e-6 * (hi - lo)  # (float32 rounding at an edge is no event outside)
        n_out, first = 0, None
        for start in range(0, len(events), self.SUPPORT_BLOCK):  # blocks: no temporaries of the whole (shared) array
            blk = events[start:start + self.SUPPORT_BLOCK]
            if blk.min() < lo or blk.max() > hi:
                out = (blk < lo) | (blk > hi)
                n_out += int(out.reshape(len(blk), -1).any(-1).sum())
                first = float(blk[out][0]) if first is None else first
        if n_out:
            from sagips.io.refdata import DataError

            lo, hi = (float(v) for v in self.support)
            of = f"the {len(events)} events this rank keeps" if kept else f"{len(events)} events"
            raise DataError(f"reference data: {n_out} of {of} lie outside {self.name}'s support "
                            f"[{lo:g}, {hi:g}] (e.g. {first:.6g}), where no synthetic event can be: widen the class's "
                            f"`support`, or cut the events to it")

    def attach_data(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any], rng: np.random.Generator) -> None:
        self._check_support(arrays["events"])
        self._events_all = arrays["events"]
        n = len(self._events_all)
        n_keep = max(1, int(round(self.cfg.subset_fraction * n)))
        idx = np.arange(n) if n_keep == n else np.sort(rng.choice(n, size=n_keep, replace=False))
        self.select_subset(idx)

    def attach_subset(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> None:
        """This rank's events, read by the framework (sagips/io/shard.py): kept as they are."""
        self._check_support(arrays["events"], kept=True)
        self._events_all, self.subset_idx = None, None
        self.data = torch.as_tensor(np.ascontiguousarray(arrays["events"], dtype=np.float32), device=self.device)

    def select_subset(self, idx: np.ndarray) -> None:
        """Keep the reference events `idx` (this rank's share) on the device."""
        self.subset_idx = np.asarray(idx, dtype=np.int64)
        self.data = torch.as_tensor(self._events_all[self.subset_idx], device=self.device)

    # -- networks -----------------------------------------------------------------------------------------------
    @property
    def noise_dim(self) -> int:
        return self.cfg.noise_dim or len(self.names)

    def build_generator(self) -> torch.nn.Module:
        c = self.cfg
        G = mlp(self.noise_dim, len(self.names), c.hidden, c.layers, out_act=torch.nn.Sigmoid())
        return start_generator(G, c.g_out_scale, c.g_start).to(self.device)

    def build_discriminator(self) -> torch.nn.Module:
        """The critic, on standardised events (`critic_scale`), its first layer's kinks at reference events
        (`sagips.models.kinks_at`)."""
        net = mlp(self.event_width, 1, self.cfg.hidden, self.cfg.layers)
        data = getattr(self, "data", None)
        if data is not None and len(data) >= 2:
            return on_events(net, data).to(self.device)
        return ScaledInput(net, *self.critic_scale()).to(self.device)

    def critic_scale(self) -> tuple[list[float], list[float]]:
        """(shift, scale) per event column that standardise the events for the critic: the mean and standard
        deviation of the reference events this rank holds (where the events are, not the support's middle: smear1d's
        lie in the first fifth of theirs, and support scaling cost its resolution 27 sigma_ML); before any are
        attached, the support's middle and half-width where the events lie in it (the density form; a simulator
        whose class sets `support`), else no change."""
        w = self.event_width
        data = getattr(self, "data", None)
        if data is not None and len(data) >= 2:
            return event_scale(data)
        if self.pipeline_method == "density" or self.clips_events:
            lo, hi = (float(v) for v in self.support)
            return [(lo + hi) / 2] * w, [(hi - lo) / 2] * w
        return [0.0] * w, [1.0] * w

    # -- one epoch ----------------------------------------------------------------------------------------------
    def noise(self, n: int) -> torch.Tensor:
        z = torch.randn((n, self.noise_dim), generator=self.gen, device=self.device)
        return z if self.cfg.noise_scale == 1.0 else z * self.cfg.noise_scale

    def to_physical(self, unit: torch.Tensor) -> torch.Tensor:
        """Generator outputs in [0, 1]^P -> physical parameters inside the bounds."""
        if unit.ndim != 2 or unit.shape[1] != len(self.names):
            raise EnvironmentCheckError(f"build_generator: the generator outputs shape {tuple(unit.shape)}, but the "
                                        f"environment has {len(self.names)} parameters ({', '.join(self.names)}): "
                                        f"make its last layer {len(self.names)} wide")
        return unit * (self.pmax - self.pmin) + self.pmin

    def params(self, G: torch.nn.Module, n: int) -> torch.Tensor:
        unit = G(self.noise(n))
        return self.to_physical(unit if self.preconditioner is None else self.preconditioner.apply(unit))

    def adapt(self, G: torch.nn.Module) -> None:
        """environment.precondition=fisher: the preconditioner from the Fisher information at G's prediction (on
        the CPU in float64: the density must accept any device and dtype, as in the reference data and analyze)."""
        if self.preconditioner is None:
            return
        try:
            info = self.fisher(self.predict(G, 256))
        except Exception as e:  # noqa: BLE001  (the user's density: any error)
            raise EnvironmentCheckError(f"density: the Fisher preconditioner evaluates it on the CPU in float64 and it "
                                        f"failed there ({type(e).__name__}: {' '.join(str(e).split())[:160]}); make "
                                        f"it work for any device and dtype, or set environment.precondition=none"
                                        ) from None
        self.preconditioner.refresh(info, (self.pmax - self.pmin).tolist())

    def extra_state(self) -> dict[str, Any]:
        return {} if self.preconditioner is None else {"precondition": self.preconditioner.state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.preconditioner is None:
            return
        if "precondition" not in state:
            raise ConfigError("--resume: the saved state holds no Fisher preconditioner (a run that trained with plain "
                              "gradients, from before environment.precondition existed, or an environment whose "
                              "extra_state does not call super()); resume it with --set environment.precondition=none")
        self.preconditioner.load(state["precondition"])

    def real_batch(self) -> torch.Tensor:
        idx = torch.randint(len(self.data), (self._n_fake,), generator=self.gen, device=self.device)
        return self.data[idx]

    def synthesize(self, G: torch.nn.Module, real: Any = None) -> torch.Tensor:
        """Synthetic events (param_samples * events_per_sample, event_width), differentiable w.r.t. G."""
        c = self.cfg
        p = self.params(G, c.param_samples).float()
        u = torch.rand((c.param_samples, self.events_per_sample, self.n_uniforms or self.event_width),
                       generator=self.gen, device=self.device)
        return self._events(p, u).reshape(-1, self.event_width)

    def _adv_sum(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.cfg.loss == "bce":
            return F.binary_cross_entropy_with_logits(logits, target, reduction="sum")
        return F.mse_loss(logits, target, reduction="sum")

    def d_loss(self, D: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        n = len(real)
        return self.critic_loss(lambda x, t: self._adv_sum(D(x), t) / n, (torch.cat((real, fake)), self._real_fake), D)

    def g_loss(self, D: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = len(fake)
        return self.critic_loss(lambda x, t: self._adv_sum(D(x), t) / n, (fake, self._ones[:n]), D), {}

    @property
    def events_per_epoch(self) -> int:
        return self._n_fake

    # -- quality ------------------------------------------------------------------------------------------------
    def truth(self) -> list[float]:
        return [float(self.cfg.true_params[n]) for n in self.names]

    def parameter_names(self) -> list[str]:
        return list(self.names)

    def fisher(self, p: Any) -> np.ndarray | None:
        """The data's Fisher information per event (P, P) at physical parameters p (P,), in float64 (sagips.analyze
        reads the Cramér-Rao bound and strongly correlated parameters from it). The density form: the integral over
        the support of (df/dp)(df/dp)^T / f, f normalised on the sampler's grid (trapezoid weights), where f > 0;
        None where the density is negative or not finite at p. The simulate form: the information of its events in
        64 bins (edges evenly spaced in logit of the CDF), or for events of several columns in the cells of a grid
        of their decorrelated columns (up to simfisher.MAX_COLUMNS), from 2^21 simulated events and their derivatives
        (sagips/simfisher.py); None for wider events, or where the simulator gives no finite derivative."""
        if self.pipeline_method != "density":
            q = torch.as_tensor(np.asarray(p, dtype=np.float64)).float()
            return binned_fisher(self._events, q.to(self.device), self.n_uniforms or 1)
        x = self.x.detach().to("cpu", torch.float64)

        def pdf(q: torch.Tensor) -> torch.Tensor:
            f = self.density(q[None], x)[0]
            return f / torch.trapezoid(f, x)

        q = torch.as_tensor(np.asarray(p, dtype=np.float64))
        with torch.no_grad():
            raw = self.density(q[None], x)[0]
        if not (bool(torch.isfinite(raw).all()) and bool((raw >= 0).all()) and float(raw.sum()) > 0):
            return None
        with torch.enable_grad():
            jac = torch.autograd.functional.jacobian(pdf, q, vectorize=True)  # (G, P)
        f = raw / torch.trapezoid(raw, x)
        if not bool(torch.isfinite(jac).all()):
            return None
        w = torch.zeros_like(x)  # trapezoid weights of the grid
        dx = x[1:] - x[:-1]
        w[1:] += dx / 2
        w[:-1] += dx / 2
        wf = torch.where(f > 0, w / f.clamp_min(torch.finfo(f.dtype).tiny), torch.zeros_like(f))
        return ((jac * wf[:, None]).T @ jac).numpy()

    @torch.no_grad()
    def predict(self, G: torch.nn.Module, n: int) -> list[float]:
        """Mean physical prediction over n noise vectors from a fixed-seed stream of its own (logging never moves
        the training's random stream, and every evaluation sees the same noise)."""
        gen = torch.Generator(device=self.device).manual_seed(20240601)
        z = torch.randn((n, self.noise_dim), generator=gen, device=self.device) * self.cfg.noise_scale
        return self.to_physical(G(z).float()).mean(0).tolist()

    def quality(self, G: torch.nn.Module, n: int) -> dict[str, Any]:
        return self._residuals(self.predict(G, n))

    def _residuals(self, p_hat: list[float]) -> dict[str, Any]:
        """r_i = (p_i - p^_i) / p_i (eq. 6) of a mean prediction p^, in the parameters' order."""
        r = [(t - p) / t for t, p in zip(self.truth(), p_hat)]
        return {"params": list(p_hat), "residuals": r, "max_abs_residual": max(abs(v) for v in r),
                "parameter_names": list(self.names)}

    def combine_quality(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Residuals of the prediction averaged over the ranks' generators (eq. 7 over ranks)."""
        out = self._residuals(np.mean([q["params"] for q in per_rank], axis=0).tolist())
        out["rank_max_abs_residual"] = [q["max_abs_residual"] for q in per_rank]
        out["rank_params"] = [q["params"] for q in per_rank]  # the spread of the ranks (the convergence diagnostic)
        return out

    def progress_fields(self, q: dict[str, Any]) -> dict[str, str]:
        return {"max|r|": f"{q['max_abs_residual']:.3f}"}

    def summary_table(self, q: dict[str, Any]) -> str:
        w = max(9, *(len(n) for n in self.names))
        rows = [f"  {'parameter':{w}s}  {'true':>10s}  {'predicted':>10s}  residual (p-p^)/p", "  " + "-" * (w + 44)]
        for n, t, p, r in zip(self.names, self.truth(), q["params"], q["residuals"]):
            rows.append(f"  {n:{w}s}  {t:+10.5f}  {p:+10.5f}  {r:+10.4f}")
        rows.append(f"  max |r| = {q['max_abs_residual']:.4f}")
        return "\n".join(rows)
