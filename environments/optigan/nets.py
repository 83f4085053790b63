"""optiGAN's two networks, laid out exactly as opengate builds them, plus an optional standardisation in buffers.

Generator: input cat(noise[10] ~ N(0, 1), condition[3] = emission point x, y, z in mm) -> Linear 128 -> ReLU ->
256 -> ReLU -> 512 -> ReLU -> 6 (X, Y, dX, dY, dZ, EKine in raw units), an `nn.Sequential` named `model`
(state-dict keys model.0, model.2, model.4, model.6), as `opengate/contrib/optical/optigan.py: WGANGenerator`.

Critic: input cat(photon[6], condition[3]) = 9 -> 512 -> LeakyReLU(0.2) -> Dropout -> 256 -> LeakyReLU -> Dropout
-> 128 -> LeakyReLU -> 1 (keys model.0, model.3, model.6, model.8), the layout of model_3341.pt's critic.

Standardisation. Both modules can hold affine maps in *buffers* (so a state_dict, and so every SAGIPS checkpoint,
is self-contained): the generator sees (condition - cond_mean) / cond_std and returns out_mean + out_std * model(.),
the critic sees (input - in_mean) / in_std. Training works in well-scaled units, while the modules' inputs and
outputs stay in the raw units that opengate uses. opengate applies no scaling, so `fold()` writes the maps into the
first and last Linear layers (an exact identity up to float rounding) and returns a plain `model.*` state dict;
`unfold()` is its inverse, used to load a raw-units (opengate) model into a standardised module.
"""
from __future__ import annotations

import torch
from torch import nn

NOISE_DIM = 10  #: opengate's gan_arguments["noise_dimension"]
COND_DIM = 3  #: labels_length
PHOTON_DIM = 6  #: output_dimension
HIDDEN = 128  #: hidden_dimension (layers are 128, 256, 512 wide)
FOLD_REFLECTIONS = 16  #: fold_layer: reflections written out on each side of a bound (the file's exact range)


def generator_sequential(noise_dim: int = NOISE_DIM, hidden: int = HIDDEN, fold_layer: bool = False
                         ) -> nn.Sequential:
    """opengate's WGANGenerator.model, layer for layer; fold_layer: its first two hidden layers and a linear output
    (the third hidden layer is the fold's, written by `OptiGANGenerator.fold`)."""
    if fold_layer:
        return nn.Sequential(nn.Linear(noise_dim + COND_DIM, hidden), nn.ReLU(),
                             nn.Linear(hidden, 2 * hidden), nn.ReLU(),
                             nn.Linear(2 * hidden, PHOTON_DIM))
    return nn.Sequential(
        nn.Linear(noise_dim + COND_DIM, hidden), nn.ReLU(),
        nn.Linear(hidden, 2 * hidden), nn.ReLU(),
        nn.Linear(2 * hidden, 4 * hidden), nn.ReLU(),
        nn.Linear(4 * hidden, PHOTON_DIM),
    )


def critic_sequential(dropout: float = 0.0, slope: float = 0.2) -> nn.Sequential:
    """The critic of model_3341.pt: parameter-free modules at indices 1, 2, 4, 5, 7."""
    return nn.Sequential(
        nn.Linear(PHOTON_DIM + COND_DIM, 512), nn.LeakyReLU(slope), nn.Dropout(dropout),
        nn.Linear(512, 256), nn.LeakyReLU(slope), nn.Dropout(dropout),
        nn.Linear(256, 128), nn.LeakyReLU(slope),
        nn.Linear(128, 1),
    )


def _ones(n: int) -> torch.Tensor:
    return torch.ones(n)


class OptiGANGenerator(nn.Module):
    """x = cat(noise (B, noise_dim), condition (B, 3)) -> photons (B, 6) in raw units.

    `fold_layer=True` (config environment.fold_layer, issue 24): the network is opengate's first two hidden layers and
    a linear output, and the reflect fold comes after it. A fold is piecewise linear, so `fold()` writes it exactly
    into opengate's third hidden layer (ReLU hinges at the bounds and their images) and last Linear: the exported
    file computes this generator *with* its folds, for raw outputs within FOLD_REFLECTIONS widths of the bounds. The
    bounds are then part of the state dict (`out_lo`, `out_hi`), so that a checkpoint exports on its own."""

    def __init__(self, noise_dim: int = NOISE_DIM, hidden: int = HIDDEN, fold_layer: bool = False):
        super().__init__()
        self.noise_dim = noise_dim
        self.fold_layer = bool(fold_layer)
        self.model = generator_sequential(noise_dim, hidden, fold_layer)
        self.register_buffer("cond_mean", torch.zeros(COND_DIM))
        self.register_buffer("cond_std", _ones(COND_DIM))
        self.register_buffer("out_mean", torch.zeros(PHOTON_DIM))
        self.register_buffer("out_std", _ones(PHOTON_DIM))
        # optional physical bounds of the outputs (set_bounds): not persistent, so that the state dict keeps
        # opengate's keys plus the standardisation; the environment sets them from its config (fold_layer: kept)
        self.register_buffer("out_lo", torch.full((PHOTON_DIM,), -torch.inf), persistent=self.fold_layer)
        self.register_buffer("out_hi", torch.full((PHOTON_DIM,), torch.inf), persistent=self.fold_layer)
        self.bounded = False
        self.track_excess = False  #: forward sets `excess` (the environment's bounds_penalty takes it)
        self.excess: torch.Tensor | None = None
        self.unit_direction = False  #: set_unit_direction: (dX, dY, dZ) put on the unit sphere

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise, cond = x[:, :self.noise_dim], x[:, self.noise_dim:]
        h = torch.cat([noise, (cond - self.cond_mean) / self.cond_std], dim=1)
        out = torch.addcmul(self.out_mean, self.model(h), self.out_std)
        if self.bounded:
            # the raw outputs' squared excess over the bounds (standardised, mean over rows), in the generator
            # step's forward only: the critic steps and the quality run without grad and do not need it
            if self.track_excess and torch.is_grad_enabled():
                over = torch.relu(self.out_lo - out) + torch.relu(out - self.out_hi)
                self.excess = (over / self.out_std).pow(2).sum(1).mean()
            out = reflect_into(out, self.out_lo, self.out_hi, self._reflect_constants())
        return onto_unit_sphere(out) if self.unit_direction else out

    def _reflect_constants(self) -> tuple[torch.Tensor, ...]:
        """reflect_constants of the bounds, made again only where the bounds changed (set_bounds, a state dict
        load, a move to another device: their version counters or storage differ), never per forward."""
        lo, hi = self.out_lo, self.out_hi
        key = (lo._version, hi._version, lo.data_ptr(), hi.data_ptr())
        cached = self.__dict__.get("_reflect_cache")
        if cached is None or cached[0] != key:
            cached = (key, reflect_constants(lo, hi))
            self.__dict__["_reflect_cache"] = cached
        return cached[1]

    def set_unit_direction(self, on: bool = True) -> None:
        """Make every generated direction a unit vector: dZ as generated, dX and dY rescaled along their own
        azimuth to sqrt(1 - dZ^2) (a detected photon's direction is a unit vector; the critic sees that exactly)."""
        self.unit_direction = bool(on)

    @torch.no_grad()
    def set_bounds(self, lo, hi) -> None:
        """Fold each output into [lo, hi] by reflection at the bounds (+-inf: that output is left alone)."""
        self.out_lo.copy_(torch.as_tensor(lo, dtype=torch.float32))
        self.out_hi.copy_(torch.as_tensor(hi, dtype=torch.float32))
        if not bool((self.out_hi > self.out_lo).all()):
            raise ValueError("set_bounds: every upper bound must exceed its lower bound")
        self.bounded = bool((torch.isfinite(self.out_lo) & torch.isfinite(self.out_hi)).any())

    @torch.no_grad()
    def set_standardisation(self, cond_mean, cond_std, out_mean, out_std) -> None:
        for name, v in (("cond_mean", cond_mean), ("cond_std", cond_std), ("out_mean", out_mean),
                        ("out_std", out_std)):
            getattr(self, name).copy_(torch.as_tensor(v, dtype=torch.float32))

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> "OptiGANGenerator":
        """A generator of the layout of a SAGIPS `generator` state dict (plain, or fold_layer), loaded from it."""
        hidden, n_in = state["model.0.weight"].shape
        G = cls(n_in - COND_DIM, hidden, fold_layer="model.6.weight" not in state)
        G.load_state_dict(state)
        if G.fold_layer:
            G.set_bounds(G.out_lo.clone(), G.out_hi.clone())
        return G

    @torch.no_grad()
    def fold(self) -> dict[str, torch.Tensor]:
        """A raw-units `model.*` state dict (opengate's layout) computing the same function as this module (with a
        fold_layer network: the folded function, see `_fold_layer`)."""
        sd = {k: v.detach().clone().double() for k, v in self.model.state_dict().items()}
        if self.fold_layer:
            sd.update(self._fold_layer(sd.pop("4.weight"), sd.pop("4.bias")))
        m, s = self.cond_mean.double(), self.cond_std.double()
        w0 = sd["0.weight"]
        wc = w0[:, self.noise_dim:]
        sd["0.bias"] = sd["0.bias"] - wc @ (m / s)
        w0[:, self.noise_dim:] = wc / s
        om, os_ = self.out_mean.double(), self.out_std.double()
        sd["6.bias"] = os_ * sd["6.bias"] + om
        sd["6.weight"] = os_[:, None] * sd["6.weight"]
        return {f"model.{k}": v.float().contiguous() for k, v in sd.items()}

    def _fold_layer(self, w: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        """opengate's last two layers ("4.*", "6.*", float64, output standardisation still applied by `fold`)
        computing reflect_into(y) of y = w h + b exactly (unit_direction cannot be written this way).

        A bounded output j (w_j = hi - lo) is the sum lo + relu(y - lo) - 2 relu(y - hi) + 2 relu(y - hi - w_j)
        ... (K + 1 hinges upwards) + relu(lo - y) - 2 relu(lo - w_j - y) + ... (K + 1 downwards): the triangle wave
        for y in [lo - K w_j, hi + K w_j]. Inside [lo, hi] one hinge is active, so the file is as exact as the plain
        network there. An unbounded output is relu(y) - relu(-y). Unused hinges are zero rows."""
        if self.unit_direction:
            raise ValueError("fold_layer cannot write unit_direction into opengate's layout; train without it")
        om, os_ = self.out_mean.double(), self.out_std.double()
        lo, hi = self.out_lo.double(), self.out_hi.double()
        width = 4 * self.model[0].out_features
        w3 = torch.zeros(width, w.shape[1], dtype=torch.float64)
        b3 = torch.zeros(width, dtype=torch.float64)
        w4 = torch.zeros(PHOTON_DIM, width, dtype=torch.float64)
        b4 = torch.zeros(PHOTON_DIM, dtype=torch.float64)
        u = 0
        K = FOLD_REFLECTIONS
        for j in range(PHOTON_DIM):
            # y_j in raw units is om_j + os_j (w_j h + b_j); a hinge relu(sign (y_j - t)) is one unit
            if torch.isfinite(lo[j]) and torch.isfinite(hi[j]):
                wd = float(hi[j] - lo[j])
                hinges = [(1.0, float(lo[j]) + k * wd, 1.0 if k == 0 else 2.0 * (-1) ** k) for k in range(K + 2)]
                hinges += [(-1.0, float(lo[j]) - k * wd, 1.0 if k == 0 else 2.0 * (-1) ** k) for k in range(K + 1)]
                b4[j] = lo[j]
            else:
                hinges = [(1.0, 0.0, 1.0), (-1.0, 0.0, -1.0)]
            if u + len(hinges) > width:
                raise ValueError(f"fold_layer: {u + len(hinges)} hinges do not fit in {width} units")
            for sign, t, coef in hinges:
                w3[u] = sign * os_[j] * w[j]
                b3[u] = sign * (om[j] + os_[j] * b[j] - t)
                w4[j, u] = coef
                u += 1
        # `fold` applies the output standardisation to "6.*": undo it here, so that it leaves these as they are
        return {"4.weight": w3, "4.bias": b3, "6.weight": w4 / os_[:, None], "6.bias": (b4 - om) / os_}

    def fold_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fold_layer: the raw outputs within which the exported file computes the fold exactly."""
        wd = self.out_hi - self.out_lo
        return self.out_lo - FOLD_REFLECTIONS * wd, self.out_hi + FOLD_REFLECTIONS * wd

    @torch.no_grad()
    def unfold(self, raw: dict[str, torch.Tensor]) -> None:
        """Load a raw-units `model.*` state dict (e.g. opengate's) so that this module computes the same function
        with its current standardisation buffers."""
        if self.fold_layer:
            raise ValueError("an opengate file cannot be loaded into a fold_layer generator (its third layer is the "
                             "fold's); set environment.fold_layer=false to start from it")
        sd = {k[len("model."):]: v.detach().clone().double() for k, v in raw.items()}
        m, s = self.cond_mean.double(), self.cond_std.double()
        w0 = sd["0.weight"]
        w0[:, self.noise_dim:] = w0[:, self.noise_dim:] * s  # W_c = W'_c * s
        sd["0.bias"] = sd["0.bias"] + w0[:, self.noise_dim:] @ (m / s)
        om, os_ = self.out_mean.double(), self.out_std.double()
        sd["6.weight"] = sd["6.weight"] / os_[:, None]
        sd["6.bias"] = (sd["6.bias"] - om) / os_
        self.model.load_state_dict({k: v.float() for k, v in sd.items()})


def reflect_constants(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What reflect_into needs of the bounds alone: (finite columns, lower bound (0 where not finite), width (1 where
    not finite), twice the width). Constants of a run: OptiGANGenerator computes them once per set of bounds."""
    finite = torch.isfinite(lo) & torch.isfinite(hi)
    lo_f = torch.where(finite, lo, torch.zeros_like(lo))
    w = torch.where(finite, hi - lo, torch.ones_like(lo))
    return finite, lo_f, w, 2.0 * w


def reflect_into(y: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                 constants: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Columns of `y` with finite bounds folded into [lo, hi] by mirror reflection (a triangle wave of period
    2 (hi - lo), the method of images: for a crystal with specular lateral faces a straight track unfolded across a
    face exits at exactly this reflected position). Identity inside [lo, hi]; other columns pass through.
    `constants`: reflect_constants(lo, hi), where the caller keeps them."""
    finite, lo_f, w, w2 = reflect_constants(lo, hi) if constants is None else constants
    t = torch.remainder(y - lo_f, w2)
    folded = lo_f + w - (t - w).abs()
    return torch.where(finite, folded, y)


def onto_unit_sphere(y: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Rows (X, Y, dX, dY, dZ, EKine) with (dX, dY) replaced by sqrt(1 - dZ^2) times their unit azimuth vector,
    so that dX^2 + dY^2 + dZ^2 = 1 and dZ, the azimuth and the other columns are kept (|dZ| is clamped to 1)."""
    a, dz = y[:, 2:4], y[:, 4:5].clamp(-1.0, 1.0)
    sin_t = (1.0 - dz * dz).clamp_min(eps).sqrt()
    azimuth = a * torch.rsqrt((a * a).sum(1, keepdim=True) + eps)
    return torch.cat([y[:, :2], azimuth * sin_t, y[:, 4:]], dim=1)


class OptiGANCritic(nn.Module):
    """x = cat(photons (B, 6), condition (B, 3)) in raw units -> critic value (B, 1)."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.model = critic_sequential(dropout)
        self.register_buffer("in_mean", torch.zeros(PHOTON_DIM + COND_DIM))
        self.register_buffer("in_std", _ones(PHOTON_DIM + COND_DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.in_mean) / self.in_std)

    @torch.no_grad()
    def set_standardisation(self, in_mean, in_std) -> None:
        self.in_mean.copy_(torch.as_tensor(in_mean, dtype=torch.float32))
        self.in_std.copy_(torch.as_tensor(in_std, dtype=torch.float32))

    @torch.no_grad()
    def fold(self) -> dict[str, torch.Tensor]:
        sd = {k: v.detach().clone().double() for k, v in self.model.state_dict().items()}
        m, s = self.in_mean.double(), self.in_std.double()
        sd["0.bias"] = sd["0.bias"] - sd["0.weight"] @ (m / s)
        sd["0.weight"] = sd["0.weight"] / s
        return {f"model.{k}": v.float().contiguous() for k, v in sd.items()}

    @torch.no_grad()
    def unfold(self, raw: dict[str, torch.Tensor]) -> None:
        sd = {k[len("model."):]: v.detach().clone().double() for k, v in raw.items()}
        m, s = self.in_mean.double(), self.in_std.double()
        sd["0.bias"] = sd["0.bias"] + sd["0.weight"] @ m
        sd["0.weight"] = sd["0.weight"] * s
        self.model.load_state_dict({k: v.float() for k, v in sd.items()})


def gradient_penalty(critic, real: torch.Tensor, fake: torch.Tensor, lam: float = 10.0,
                     cond: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                     generator: torch.Generator | None = None, eps: torch.Tensor | None = None,
                     rows: int | None = None) -> torch.Tensor:
    """WGAN-GP (Gulrajani et al. 2017): lam * E[(||grad_x D(x_hat)||_2 - 1)^2] on x_hat = eps real + (1-eps) fake.

    `real`, `fake`: (B, k) samples; `cond` (B, c): the conditions, concatenated after x_hat and held fixed (the
    penalty is on the gradient with respect to the photon only). `scale` (k,): measure the gradient in the
    coordinates x / scale, i.e. multiply it by scale (the critic's input standard deviations: the penalty is then
    the one of a critic fed with standardised inputs, as the networks see them). For a linear critic
    D(x) = w . x the penalty is exactly lam * (|w * scale| - 1)^2. `eps` (B, 1): the interpolation weights (default:
    drawn U(0, 1) from `generator`). `rows`: divide the sum over the B rows by this count instead of B (a chunk of
    a larger batch: the chunks' values then add up to the batch's mean).
    """
    real, fake = real.detach().float(), fake.detach().float()
    if eps is None:
        eps = torch.rand((real.shape[0], 1), generator=generator, device=real.device, dtype=real.dtype)
    x_hat = torch.lerp(fake, real, eps).requires_grad_(True)
    inp = x_hat if cond is None else torch.cat([x_hat, cond.float()], dim=1)
    # float32 even inside the trainer's autocast: the inner gradient of an fp16 pass could underflow, and it is
    # not covered by the GradScaler's loss scale (the scale applies to the outer backward only)
    with torch.autocast(real.device.type, enabled=False):
        out = critic(inp)
        (grad,) = torch.autograd.grad(out.sum(), x_hat, create_graph=True)
    if scale is not None:
        grad = grad * scale
    return lam * ((grad.norm(2, dim=1) - 1.0) ** 2).sum() / (rows or real.shape[0])
