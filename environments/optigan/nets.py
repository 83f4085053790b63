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


def generator_sequential(noise_dim: int = NOISE_DIM, hidden: int = HIDDEN) -> nn.Sequential:
    """opengate's WGANGenerator.model, layer for layer."""
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
    """x = cat(noise (B, noise_dim), condition (B, 3)) -> photons (B, 6) in raw units."""

    def __init__(self, noise_dim: int = NOISE_DIM, hidden: int = HIDDEN):
        super().__init__()
        self.noise_dim = noise_dim
        self.model = generator_sequential(noise_dim, hidden)
        self.register_buffer("cond_mean", torch.zeros(COND_DIM))
        self.register_buffer("cond_std", _ones(COND_DIM))
        self.register_buffer("out_mean", torch.zeros(PHOTON_DIM))
        self.register_buffer("out_std", _ones(PHOTON_DIM))
        # optional physical bounds of the outputs (set_bounds): not persistent, so that the state dict keeps
        # opengate's keys plus the standardisation; the environment sets them from its config
        self.register_buffer("out_lo", torch.full((PHOTON_DIM,), -torch.inf), persistent=False)
        self.register_buffer("out_hi", torch.full((PHOTON_DIM,), torch.inf), persistent=False)
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
            out = reflect_into(out, self.out_lo, self.out_hi)
        return onto_unit_sphere(out) if self.unit_direction else out

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

    @torch.no_grad()
    def fold(self) -> dict[str, torch.Tensor]:
        """A raw-units `model.*` state dict (opengate's layout) computing the same function as this module."""
        sd = {k: v.detach().clone().double() for k, v in self.model.state_dict().items()}
        m, s = self.cond_mean.double(), self.cond_std.double()
        w0 = sd["0.weight"]
        wc = w0[:, self.noise_dim:]
        sd["0.bias"] = sd["0.bias"] - wc @ (m / s)
        w0[:, self.noise_dim:] = wc / s
        om, os_ = self.out_mean.double(), self.out_std.double()
        sd["6.bias"] = os_ * sd["6.bias"] + om
        sd["6.weight"] = os_[:, None] * sd["6.weight"]
        return {f"model.{k}": v.float().contiguous() for k, v in sd.items()}

    @torch.no_grad()
    def unfold(self, raw: dict[str, torch.Tensor]) -> None:
        """Load a raw-units `model.*` state dict (e.g. opengate's) so that this module computes the same function
        with its current standardisation buffers."""
        sd = {k[len("model."):]: v.detach().clone().double() for k, v in raw.items()}
        m, s = self.cond_mean.double(), self.cond_std.double()
        w0 = sd["0.weight"]
        w0[:, self.noise_dim:] = w0[:, self.noise_dim:] * s  # W_c = W'_c * s
        sd["0.bias"] = sd["0.bias"] + w0[:, self.noise_dim:] @ (m / s)
        om, os_ = self.out_mean.double(), self.out_std.double()
        sd["6.weight"] = sd["6.weight"] / os_[:, None]
        sd["6.bias"] = (sd["6.bias"] - om) / os_
        self.model.load_state_dict({k: v.float() for k, v in sd.items()})


def reflect_into(y: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Columns of `y` with finite bounds folded into [lo, hi] by mirror reflection (a triangle wave of period
    2 (hi - lo), the method of images: for a crystal with specular lateral faces a straight track unfolded across a
    face exits at exactly this reflected position). Identity inside [lo, hi]; other columns pass through."""
    finite = torch.isfinite(lo) & torch.isfinite(hi)
    lo_f = torch.where(finite, lo, torch.zeros_like(lo))
    w = torch.where(finite, hi - lo, torch.ones_like(lo))
    t = torch.remainder(y - lo_f, 2.0 * w)
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
