"""The optiGAN environment: a conditional WGAN-GP of the optical photons that reach a crystal's photodetector face.

    python -m sagips.run --config configs/optigan-quick.yaml                      # minutes on a CPU
    mpiexec -n 4 python -m sagips.run --config configs/optigan-quick.yaml --mode rma-arar-arar --set comm.inner_size=2
    python -m sagips.run --config configs/optigan.yaml --set environment.data_file=data/optigan.h5 \\
        --set environment.heldout_file=data/optigan_heldout.h5                       # the paper's scale (GPU)

One row of data is one detected photon (X, Y, dX, dY, dZ, EKine: mm, direction cosines, eV) with its condition,
the emission point (x, y, z in mm; see mc.py for the frame). Per epoch (the trainer's loop, sagips.environment):
`n_critic` (3) critic steps, each on a fresh bootstrap batch of real rows and as many generated rows with the same
conditions; then one generator step. Losses (Gulrajani et al. 2017):

    critic     E[D(fake)] - E[D(real)] + gp_lambda * E[(||grad D(x_hat)|| - 1)^2]
    generator  -E[D(fake)]

The networks are opengate's (nets.py), with the data's mean/std folded into buffers (`standardize`), so that the
modules take and return raw units; `export.py` writes the opengate file.

Quality (metrics.jsonl): the JS similarity of generated vs MC photons on held-out emission points (js.py), beside the
MC-vs-MC ceiling with the same sample sizes and bins. The held-out set is, in order: `heldout_file`; the held-out
points simulated together with the reference data (when `data_file` is null); or, failing both, training points
(then `quality_set` says "train").
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sagips.config import ConfigError, opt
from sagips.environment import Environment
from sagips.models import unwrap

from .js import FEATURES, similarity
from .nets import COND_DIM, PHOTON_DIM, OptiGANCritic, OptiGANGenerator, gradient_penalty

LOADERS = ("auto", "device", "host", "dataloader")
#: the fixed seed of the quality noise: the logged figure does not depend on the training stream or on log_every
QUALITY_SEED = 20240613
#: output_bounds: the largest fraction of reference photons outside the bounds (the MC's: 0) before a run is refused
DATA_OUTSIDE_MAX = 0.01


@dataclass
class OptiGANConfig:
    """`environment:` section for name=optigan. Defaults are the optiGAN paper's settings where it gives them."""

    name: str = opt("optigan", "registered environment name")
    data_file: str | None = opt(None, "training HDF5 (datasets photons N x 6, conditions N x 3; see "
                                "`python -m sagips.data optigan`); null = rank 0 runs the MC below on the grid")
    heldout_file: str | None = opt(None, "held-out HDF5 (same format) for the JS quality; null = the held-out points "
                                   "simulated with the reference data, or training points if data_file is set")
    # -- the MC stand-in (used only when data_file is null)
    crystal_length: float = opt(3.0, "crystal length L in mm (back face z=0, photodetector at z=L)", gt=0.0)
    crystal_width: float = opt(3.0, "crystal cross-section side in mm (x, y in [-W/2, W/2])", gt=0.0)
    scintillator: str = opt("BGO", "emission spectrum and refractive index", choices=("BGO", "LYSO"))
    reflectivity: float = opt(0.98, "reflector on the lateral and back faces (where there is no TIR)",
                              min=0.0, max=1.0)
    lambertian: float = opt(0.0, "diffuse (cosine-law) fraction of reflector reflections", min=0.0, max=1.0)
    absorption_length: float = opt(100.0, "bulk absorption length in mm", gt=0.0)
    grid_side: int = opt(7, "grid points along x in the 1/8 cross-section (7 -> 28 points per depth)", min=2)
    grid_depths: int = opt(5, "grid depths (paper: 5 -> 140 points)", min=1)
    photons_per_point: int = opt(30_000, "detected photons per grid point (paper: >= 30,000)", min=1)
    heldout_points: int = opt(100, "random held-out emission points simulated beside the grid (paper: 1000)", min=0)
    heldout_photons: int = opt(6000, "photons per held-out point (two halves: reference and ceiling)", min=2)
    # -- networks and loss
    noise_dim: int = opt(10, "generator noise dimension (opengate: 10)", min=1)
    hidden: int = opt(128, "first hidden width of the generator; then 2x and 4x (opengate: 128)", min=1)
    critic_dropout: float = opt(0.0, "dropout after the critic's first two hidden layers (layout keeps the modules)",
                                min=0.0, max=0.9)
    gp_lambda: float = opt(10.0, "gradient-penalty weight lambda (WGAN-GP default)", min=0.0)
    n_critic: int = opt(3, "critic steps per generator step (paper: 3)", min=1)
    batch_size: int = opt(250_000, "real rows per critic/generator step, and as many generated (paper: 250,000)",
                          min=1)
    standardize: bool = opt(True, "standardise network inputs/outputs with the data's mean/std (buffers, folded "
                            "into the first/last Linear layers on export)")
    output_bounds: str = opt("none", "'reflect': fold the generator's outputs into the crystal's physical bounds by "
                             "mirror reflection (X, Y on the exit face [-W/2, W/2]; dZ in [cos θc, 1] and dX, dY in "
                             "[-sin θc, sin θc] from Snell's law at the exit face, from crystal_width and "
                             "scintillator; EKine free); not in an opengate export; 'none': raw linear output "
                             "(opengate, the paper)", choices=("none", "reflect"))
    energy_bounds: bool = opt(False, "with output_bounds=reflect, also fold EKine into the training data's "
                              "[min, max] (the observed spectrum's support; the same on every rank)")
    unit_direction: bool = opt(False, "with output_bounds=reflect, make each generated direction a unit vector: "
                               "dZ as generated, (dX, dY) rescaled along their azimuth to sqrt(1 - dZ^2); not in "
                               "an opengate export")
    bounds_penalty: float = opt(0.0, "with output_bounds=reflect, weight of a generator-loss penalty on the raw "
                                "network's outputs outside the bounds (mean over photons of the squared excess, "
                                "in standardised units): the network learns to stay inside, so that the fold is "
                                "the identity on almost every photon and the opengate export (the network alone) "
                                "keeps the quality; 0 = off", min=0.0)
    fold_layer: bool = opt(False, "with output_bounds=reflect: train a generator of opengate's first two hidden "
                           "layers and a linear output, so that the export writes the folds exactly into opengate's "
                           "third hidden layer: the file that opengate runs is the folded generator that the run "
                           "scores (docs/optigan.md, 'Export')")
    subset_fraction: float = opt(1.0, "fraction of the reference rows each rank keeps (random subset)",
                                 gt=0.0, max=1.0)
    init_generator: str | None = opt(None, "start from this generator: an opengate optiGAN file (e.g. "
                                     "model_3341.pt) or a SAGIPS checkpoint; null = random init")
    # -- quality
    quality_points: int = opt(20, "held-out emission points used for the logged JS similarity (0 = all)", min=0)
    quality_photons: int = opt(3000, "photons per point and per sample in the JS comparison", min=10)
    js_bins: int = opt(50, "histogram bins per feature for the JS similarity", min=2)
    # -- GPU recipe switches that belong to the environment (docs/optigan.md, "GPU recipe")
    loader: str = opt("auto", "where real batches come from: 'device' (this rank's rows live on the training "
                      "device, one gather per batch), 'host' (rows in host memory, pinned on CUDA, one batch "
                      "gathered and copied per step), 'dataloader' (a torch DataLoader whose loader_workers "
                      "processes gather batches ahead; pinned memory and non_blocking copies on CUDA), 'auto' "
                      "(device if the rows fit in loader_device_fraction of the GPU's free memory, else "
                      "dataloader; on CPU: device, i.e. in memory)", choices=LOADERS)
    loader_device_fraction: float = opt(0.25, "loader=auto: the largest share of the device's free memory the rows "
                                        "may take to be kept there", gt=0.0, max=1.0)
    loader_workers: int = opt(4, "loader=dataloader: worker processes (the paper used 4); 0 = batches are made in "
                              "the training process", min=0)
    prefetch_factor: int = opt(2, "loader=dataloader: batches each worker prepares ahead (with workers > 0)", min=1)
    loader_start: str = opt("forkserver", "loader=dataloader: how worker processes start. 'forkserver' (a clean "
                            "server process, started before any worker, forks them: nothing of the rank's MPI, CUDA "
                            "or threads is copied), 'spawn' (fresh interpreters), or 'fork' (copies of the rank "
                            "after MPI_Init: fastest to start, unsafe with some MPI libraries and with CUDA)",
                            choices=("forkserver", "spawn", "fork"))
    data_on_device: bool | None = opt(None, "deprecated (use loader): true = loader 'device', false = 'host'")

    def validate(self) -> None:
        if self.data_on_device is not None:
            implied = "device" if self.data_on_device else "host"
            if self.loader not in ("auto", implied):
                raise ConfigError(f"environment.data_on_device={str(self.data_on_device).lower()} (deprecated) "
                                  f"contradicts environment.loader={self.loader}; set loader only")
            self.loader = implied
        if self.fold_layer and self.unit_direction:
            raise ConfigError("environment.fold_layer cannot write unit_direction into opengate's layout (it is not "
                              "piecewise linear); drop one of them")
        for key in ("energy_bounds", "unit_direction", "bounds_penalty", "fold_layer"):  # refinements of reflect
            value = getattr(self, key)
            if value and self.output_bounds != "reflect":
                value = str(value).lower() if isinstance(value, bool) else value
                raise ConfigError(f"environment.{key}={value} needs environment.output_bounds=reflect (got "
                                  f"{self.output_bounds!r}); set both, or drop {key}")
        for key in ("heldout_file", "init_generator"):
            path = getattr(self, key)
            if path and not os.path.isfile(path):
                raise ConfigError(f"environment.{key}: no such file {path!r}")


class OptiGAN(Environment):
    name = "optigan"
    batch_key = "batch_size"  #: train.split_batch divides it (eq. 10)
    Config = OptiGANConfig
    datasets = {"photons": PHOTON_DIM, "conditions": COND_DIM}
    #: attach_subset joins photons and conditions into one (N, 9) table, a copy: data.share=node would save nothing
    keeps_arrays = False
    generate_per_rank = False  #: the MC is too costly to run on every rank: rank 0 runs it and broadcasts the data

    def __init__(self, cfg: OptiGANConfig, device: torch.device | str = "cpu", seed: int = 0):
        super().__init__(cfg, device, seed)
        self.n_critic = cfg.n_critic
        self.data: torch.Tensor | None = None  # (N, 9): photon | condition, this rank's rows
        self.subset_idx: np.ndarray | None = None  # rows of the reference data this rank keeps (empty: all)
        self._table: np.ndarray | None = None
        self._std: dict[str, np.ndarray] | None = None
        self._energy_range: tuple[float, float] | None = None
        self._quality_set: dict[str, Any] | None = None
        self._heldout: tuple[np.ndarray, np.ndarray] | None = None  #: (photons, conditions) of the held-out set
        self._last: dict[str, torch.Tensor] = {}
        self._seed = int(seed)
        self.loader: str | None = None  #: cfg.loader resolved by select_subset ('auto' -> 'device' / 'dataloader')
        self._batches = 0  #: batches taken from the DataLoader so far (its position, saved for --resume)
        self._loader_iter = None

    # -- reference data ---------------------------------------------------------------------------------------
    @staticmethod
    def crystal(cfg: OptiGANConfig):
        from .mc import Crystal

        return Crystal(width=cfg.crystal_width, length=cfg.crystal_length, scintillator=cfg.scintillator,
                       reflectivity=cfg.reflectivity, lambertian=cfg.lambertian,
                       absorption_length=cfg.absorption_length)

    @classmethod
    def generate_reference(cls, cfg: OptiGANConfig, seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The MC on the grid; the held-out points ride along as `heldout_photons` / `heldout_conditions`."""
        from .data import build_dataset

        train, held, attrs, _ = build_dataset(cls.crystal(cfg), cfg.photons_per_point, cfg.heldout_points,
                                              cfg.heldout_photons, seed, cfg.grid_side, cfg.grid_depths)
        arrays = dict(train)
        if held is not None:
            arrays["heldout_photons"] = held["photons"]
            arrays["heldout_conditions"] = held["conditions"]
        return arrays, attrs

    def attach_data(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any], rng: np.random.Generator) -> None:
        photons = np.asarray(arrays["photons"], dtype=np.float32)
        self._attach_rows(arrays)
        n_keep = max(1, round(self.cfg.subset_fraction * len(photons)))
        full = n_keep >= len(photons)
        self.select_subset(None if full else np.sort(rng.choice(len(photons), size=n_keep, replace=False)))

    def attach_subset(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> None:
        """This rank's rows, read by the framework (sagips/io/shard.py). The standardisation and energy range come
        from them; `sagips.run` then gives every rank rank 0's (`shared_state`), so that the replicas agree. With
        subset_fraction < 1 they are estimates from rank 0's random fraction, not the whole file's figures."""
        self._attach_rows(arrays)
        self.select_subset(None)
        self.subset_idx = None

    def shared_state(self) -> dict[str, Any]:
        return {"std": self._std, "energy_range": self._energy_range}

    def set_shared_state(self, state: dict[str, Any]) -> None:
        self._std, self._energy_range = state["std"], state["energy_range"]

    def _attach_rows(self, arrays: dict[str, np.ndarray]) -> None:
        c = self.cfg
        photons = np.asarray(arrays["photons"], dtype=np.float32)
        conds = np.asarray(arrays["conditions"], dtype=np.float32)
        # standardisation from the rows given, identical on every rank (attach_data: the whole data; attach_subset:
        # rank 0's, shared by sagips.run)
        self._std = {"cond_mean": conds.mean(0, dtype=np.float64), "cond_std": _safe_std(conds),
                     "out_mean": photons.mean(0, dtype=np.float64), "out_std": _safe_std(photons)}
        self._energy_range = (float(photons[:, 5].min()), float(photons[:, 5].max())) if len(photons) else None
        if c.output_bounds != "none" and len(photons):
            self._check_inside(photons)
        # the held-out (or training) points of the quality figure, and their MC-vs-MC ceiling, computed once
        if c.heldout_file:
            from sagips.io.refdata import read_reference

            held, _ = read_reference(c.heldout_file, self.datasets)
            self._heldout = (held["photons"], held["conditions"])
        elif "heldout_photons" in arrays:
            self._heldout = (np.asarray(arrays["heldout_photons"]), np.asarray(arrays["heldout_conditions"]))
        if self._heldout is not None:
            self._quality_set = self._make_quality_set(*self._heldout, "heldout")
        else:
            self._quality_set = self._make_quality_set(photons, conds, "train")
        self._table = np.concatenate([photons, conds], axis=1)

    def _check_inside(self, photons: np.ndarray) -> None:
        """The reference photons must lie inside the bounds that output_bounds folds the generator into, which could
        never produce the others: the MC's all do; real data whose frame, units or directions (after the exit face's
        refraction, not inside the crystal) differ do not."""
        lo, hi = self.bounds()
        out = (photons < lo) | (photons > hi)
        frac = float(out.any(1).mean())
        if frac > DATA_OUTSIDE_MAX:
            per = ", ".join(f"{f} {100 * v:.1f}%" for f, v in zip(FEATURES, out.mean(0)) if v > 0)
            raise ConfigError(
                f"environment.output_bounds={self.cfg.output_bounds}: {100 * frac:.1f}% of the reference photons lie "
                f"outside the crystal's bounds it folds into ({per}), which the generator could never produce; check "
                f"the data's frame and units (python -m sagips.data --gate-origin; EKine in eV; directions inside "
                f"the crystal), or set environment.output_bounds=none")

    def select_subset(self, idx: np.ndarray | None) -> None:
        """Keep the reference rows `idx` (this rank's share; None or empty = all rows, recorded as an empty
        `subset_idx` so that the trainer's saved states stay small) where `loader` says."""
        self.subset_idx = np.zeros(0, dtype=np.int64) if idx is None else np.asarray(idx, dtype=np.int64)
        full = self.subset_idx.size == 0
        data = torch.from_numpy(np.ascontiguousarray(self._table if full else self._table[self.subset_idx]))
        self.loader = resolve_loader(self.cfg.loader, self.device, data.nbytes, self.cfg.loader_device_fraction)
        self._loader_iter = None  # a DataLoader over the previous rows stops (its workers exit)
        if self.loader == "device":
            self.data = data.to(self.device)
        elif self.loader == "host":  # host memory (pinned when a GPU reads it): one batch travels per step
            self.data = data.pin_memory() if self.device.type == "cuda" else data
        else:  # dataloader: the workers read the rows from host memory (shared with them by fork)
            self.data = data

    def heldout_set(self, n_points: int = 0) -> dict[str, Any]:
        """The held-out quality set on `n_points` held-out emission points (0 = all): {"points", "a" (reference
        halves), "b" (independent MC halves), "ceiling", "kind"}; a ValueError without a held-out set."""
        if self._heldout is None:
            raise ValueError("no held-out set: set environment.heldout_file, or heldout_points > 0 with the MC")
        return self._make_quality_set(*self._heldout, "heldout", n_points)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of X, Y, dX, dY, dZ, EKine that output_bounds=reflect folds into (EKine: the training data's
        [min, max] with energy_bounds, else unbounded), whatever output_bounds is set to."""
        lo, hi = output_bounds(self.crystal(self.cfg))
        if self.cfg.energy_bounds and self._energy_range is not None and self._energy_range[1] > self._energy_range[0]:
            lo[5], hi[5] = self._energy_range
        return lo, hi

    def condition_box(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo, hi, points): the box of the training conditions and the distinct training points (mm)."""
        conds = self._table[:, PHOTON_DIM:] if self._table is not None else np.zeros((1, COND_DIM), np.float32)
        points = np.unique(conds, axis=0)
        return points.min(0), points.max(0), points

    def _make_quality_set(self, photons: np.ndarray, conds: np.ndarray, kind: str,
                          n_points: int | None = None) -> dict[str, Any]:
        c = self.cfg
        points, groups = group_by_condition(conds)
        n_points = c.quality_points if n_points is None else n_points
        k = len(points) if n_points == 0 else min(n_points, len(points))
        pick = np.unique(np.linspace(0, len(points) - 1, k).round().astype(int))
        shuffle = np.random.default_rng(QUALITY_SEED)
        ref_a, ref_b = [], []
        for i in pick:
            rows = groups[i][shuffle.permutation(len(groups[i]))]
            m = min(c.quality_photons, len(rows) // 2)
            if m < 1:
                why = (f" (the {kind} data hold {len(points)} distinct conditions for {len(conds)} photons: a "
                       f"condition per photon, e.g. from TrackVertexPosition, gives no point to compare; give one "
                       f"condition per GATE run, FILE.root:x,y,z)" if len(points) > len(conds) // 2 else "")
                raise ConfigError(f"environment: quality point {points[i].tolist()} has {len(rows)} photon(s); "
                                  f"at least 2 are needed for the JS comparison{why}")
            ref_a.append(photons[rows[:m]])
            ref_b.append(photons[rows[m:2 * m]])
        ceiling = similarity(ref_b, ref_a, c.js_bins)
        return {"kind": kind, "points": points[pick], "a": ref_a, "b": ref_b, "ceiling": ceiling}

    # -- networks ------------------------------------------------------------------------------------------------
    def build_generator(self) -> torch.nn.Module:
        c = self.cfg
        G = OptiGANGenerator(c.noise_dim, c.hidden, fold_layer=c.fold_layer)
        if c.standardize and self._std is not None:
            G.set_standardisation(**{k: v.astype(np.float32) for k, v in self._std.items()})
        if c.output_bounds == "reflect":
            G.set_bounds(*self.bounds())
            G.set_unit_direction(c.unit_direction)
            G.track_excess = c.bounds_penalty > 0
        if c.init_generator:
            from .opengate import load_weights_into

            load_weights_into(G, c.init_generator)
        return G.to(self.device)

    def build_discriminator(self) -> torch.nn.Module:
        c = self.cfg
        D = OptiGANCritic(c.critic_dropout)
        if c.standardize and self._std is not None:
            s = self._std
            D.set_standardisation(np.concatenate([s["out_mean"], s["cond_mean"]]).astype(np.float32),
                                  np.concatenate([s["out_std"], s["cond_std"]]).astype(np.float32))
        return D.to(self.device)

    # -- one epoch ---------------------------------------------------------------------------------------------
    def graph_obstacle(self) -> str | None:
        """Why the step cannot be recorded as a CUDA graph (sagips/graph.py), or None: batches that come from the
        host (a DataLoader's or a host gather's) would be recorded once and replayed as the same batch."""
        if self.loader == "device":
            return None
        return f"environment.loader={self.loader}: batches come from the host and cannot be replayed"

    def real_batch(self) -> torch.Tensor:
        """(batch_size, 9) real rows: photon (6) | condition (3), bootstrapped from this rank's rows."""
        if self.loader == "dataloader":
            if self._loader_iter is None:
                self._loader_iter = iter(self._dataloader())
            batch = next(self._loader_iter)
            self._batches += 1
            return batch.to(self.device, non_blocking=True)
        idx = torch.randint(len(self.data), (self.cfg.batch_size,), generator=self.gen, device=self.device)
        if self.data.device == self.device:
            return self.data[idx]
        return self.data[idx.to(self.data.device)].to(self.device, non_blocking=True)

    def _dataloader(self) -> torch.utils.data.DataLoader:
        """Batch i = BootstrapBatches(...)[i] for i = self._batches, self._batches + 1, ...: the same batches
        whatever the number of workers, and a resumed run continues at the saved position."""
        c = self.cfg
        workers = c.loader_workers
        return torch.utils.data.DataLoader(
            BootstrapBatches(self.data, c.batch_size, self._seed), batch_size=None,
            sampler=CountFrom(self._batches), num_workers=workers, pin_memory=self.device.type == "cuda",
            prefetch_factor=c.prefetch_factor if workers else None, persistent_workers=workers > 0,
            # the rank called MPI_Init (and may hold a CUDA context): its workers must not be forks of it
            multiprocessing_context=c.loader_start if workers else None,
            # its own generator: creating the iterator must not consume the global torch stream (resume)
            generator=torch.Generator().manual_seed(0))

    def extra_state(self) -> dict[str, Any]:
        """The DataLoader's stream and position (also saved, unused, by the other loaders)."""
        return {"loader_seed": self._seed, "loader_batches": self._batches}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        seed, batches = int(state.get("loader_seed", self._seed)), int(state.get("loader_batches", 0))
        if (seed, batches) != (self._seed, self._batches):
            self._seed, self._batches = seed, batches
            self._loader_iter = None  # restart the DataLoader at the saved position

    def synthesize(self, G: torch.nn.Module, real: torch.Tensor) -> torch.Tensor:
        """(batch_size, 9) generated rows with the real batch's conditions (differentiable w.r.t. G)."""
        cond = real[:, PHOTON_DIM:]
        noise = torch.randn((len(real), self.cfg.noise_dim), generator=self.gen, device=self.device)
        fake = G(torch.cat([noise, cond], dim=1))
        if self.cfg.bounds_penalty > 0:  # for g_loss: the raw outputs' excess over the bounds, from this forward
            m = unwrap(G)  # (the DDP baseline wraps G)
            self._excess, m.excess = m.excess, None  # taken, so that no module holds a graph
        return torch.cat([fake.float(), cond], dim=1)

    def d_loss(self, D, real, fake) -> torch.Tensor:
        # under the trainer's train.amp the forwards run in bf16/fp16; the gradient penalty always runs in fp32
        n = len(real)
        scale = D.in_std[:PHOTON_DIM] if isinstance(D, OptiGANCritic) else None
        eps = torch.rand((n, 1), generator=self.gen, device=real.device, dtype=torch.float32)
        parts = []  # per chunk: (E[D(real)] - E[D(fake)], penalty) contributions, for the log

        def rows(r, f, e):  # every term is a sum over rows / n: the chunks add up to the batch's means
            v = D(torch.cat((r, f))).float()  # one critic pass over real and generated rows (no batch statistics)
            w_dist = (v[:len(r)].sum() - v[len(r):].sum()) / n
            gp = gradient_penalty(D, r[:, :PHOTON_DIM], f[:, :PHOTON_DIM], self.cfg.gp_lambda,
                                  cond=r[:, PHOTON_DIM:], scale=scale, eps=e, rows=n)
            parts.append(torch.stack((w_dist.detach(), gp.detach())))
            return gp - w_dist

        loss = self.critic_loss(rows, (real, fake, eps), D)
        w_dist, gp = torch.stack(parts).sum(0)
        self._last = {"w_dist": w_dist, "gp": gp}
        return loss

    def g_loss(self, D, real, fake) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = len(fake)
        loss = self.critic_loss(lambda f: -D(f).float().sum() / n, (fake,), D)
        if self.cfg.bounds_penalty > 0:
            return loss + self.cfg.bounds_penalty * self._excess, {**self._last, "excess": self._excess.detach()}
        return loss, dict(self._last)

    @property
    def events_per_epoch(self) -> int:
        return self.cfg.batch_size

    # -- quality -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, G: torch.nn.Module, conditions: np.ndarray, n_each: int | list[int],
               seed: int = QUALITY_SEED) -> list[np.ndarray]:
        """Generated photons, `n_each` per emission point (list of (n_i, 6) float32 arrays), fixed-seed noise."""
        conditions = np.asarray(conditions, dtype=np.float32).reshape(-1, COND_DIM)
        counts = [n_each] * len(conditions) if isinstance(n_each, int) else list(n_each)
        cond = torch.from_numpy(np.repeat(conditions, counts, axis=0))
        noise = torch.randn((len(cond), self.cfg.noise_dim), generator=torch.Generator().manual_seed(seed))
        x = torch.cat([noise, cond], dim=1).to(self.device)
        out = torch.cat([G(chunk).float().cpu() for chunk in x.split(1 << 16)]).numpy()
        return np.split(out, np.cumsum(counts)[:-1])

    @torch.no_grad()
    def quality(self, G: torch.nn.Module, n: int | None = None) -> dict[str, Any]:
        """JS similarity (percent) of G vs MC on the quality points, beside the MC-vs-MC ceiling.

        `n` (the trainer's train.quality_samples) is not used: the sample size is `quality_photons` per point,
        fixed so that the ceiling stays comparable.
        """
        qs = self._quality_set
        if qs is None:
            return {}
        counts = [len(b) for b in qs["b"]]
        gen = self.sample(G, qs["points"], counts)
        sim = similarity(gen, qs["a"], self.cfg.js_bins)
        ceil = qs["ceiling"]
        out = {"js": sim["mean"], "js_ceiling": ceil["mean"], "js_gap": ceil["mean"] - sim["mean"],
               "js_features": sim["features"], "js_ceiling_features": ceil["features"],
               "quality_set": qs["kind"], "quality_points": len(qs["points"])}
        if isinstance(G, OptiGANGenerator) and G.fold_layer:
            out["export_exact"] = True  # the opengate file holds the folds exactly: this is the file's figure too
        elif isinstance(G, OptiGANGenerator) and (G.bounded or G.unit_direction):
            # the same generator without its folds: the network alone, as an opengate export without distillation
            # runs it (sagips.export distils the folds into the file and reports that file's own figure)
            with unfolded(G):
                raw = self.sample(G, qs["points"], counts)
            sim_raw = similarity(raw, qs["a"], self.cfg.js_bins)
            lo, hi = self.bounds()
            outside = np.concatenate(raw)
            outside = ((outside < lo) | (outside > hi)).any(1).mean()
            out.update({"js_unfolded": sim_raw["mean"], "js_unfolded_features": sim_raw["features"],
                        "unfolded_outside": float(outside)})
        return out

    def combine_quality(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """The mean over the ranks' generators of their JS similarity (the ceiling is the same on every rank)."""
        per_rank = [q for q in per_rank if q]
        if not per_rank:
            return {}
        out = dict(per_rank[0])
        out["js"] = float(np.mean([q["js"] for q in per_rank]))
        out["js_gap"] = out["js_ceiling"] - out["js"]
        out["js_features"] = {f: float(np.mean([q["js_features"][f] for q in per_rank])) for f in FEATURES}
        out["rank_js"] = [q["js"] for q in per_rank]
        if all("js_unfolded" in q for q in per_rank):
            out["js_unfolded"] = float(np.mean([q["js_unfolded"] for q in per_rank]))
            out["js_unfolded_features"] = {f: float(np.mean([q["js_unfolded_features"][f] for q in per_rank]))
                                           for f in FEATURES}
            out["unfolded_outside"] = float(np.mean([q["unfolded_outside"] for q in per_rank]))
        return out

    def progress_fields(self, q: dict[str, Any]) -> dict[str, str]:
        if not q:
            return {}
        return {"JS": f"{q['js']:.1f}%", "MC": f"{q['js_ceiling']:.1f}%"}

    def summary_table(self, q: dict[str, Any]) -> str:
        if not q:
            return ""
        if "js_unfolded" not in q:
            rows = [f"  JS similarity on {q['quality_points']} {q['quality_set']} point(s), percent",
                    "  feature   GAN vs MC   MC vs MC (ceiling)", "  " + "-" * 40]
            for f in FEATURES:
                rows.append(f"  {f:8s}  {q['js_features'][f]:9.2f}   {q['js_ceiling_features'][f]:9.2f}")
            rows.append(f"  mean      {q['js']:9.2f}   {q['js_ceiling']:9.2f}   (gap {q['js_gap']:.2f} points)")
            if q.get("export_exact"):
                rows.append("  the opengate file (`python -m sagips.export`) holds the folds exactly (fold_layer): "
                            "this is its figure too")
            return "\n".join(rows)
        rows = [f"  JS similarity on {q['quality_points']} {q['quality_set']} point(s), percent",
                "  feature   folded (trained)   network alone   MC vs MC (ceiling)", "  " + "-" * 60]
        for f in FEATURES:
            rows.append(f"  {f:8s}  {q['js_features'][f]:16.2f}   {q['js_unfolded_features'][f]:13.2f}   "
                        f"{q['js_ceiling_features'][f]:9.2f}")
        rows.append(f"  mean      {q['js']:16.2f}   {q['js_unfolded']:13.2f}   {q['js_ceiling']:9.2f}   "
                    f"(gap {q['js_gap']:.2f} points folded, {q['js_ceiling'] - q['js_unfolded']:.2f} alone)")
        rows.append(f"  the network alone puts {100 * q['unfolded_outside']:.1f}% of its photons outside the bounds; "
                    f"opengate runs the network alone: `python -m sagips.export` distils the folds into the file and "
                    f"prints that file's figure beside this one")
        return "\n".join(rows)


# ------------------------------------------------------------------------------------------------ data loading
def resolve_loader(mode: str, device: torch.device, nbytes: int, fraction: float) -> str:
    """environment.loader with 'auto' resolved: on CUDA, 'device' when the rows take at most `fraction` of the
    device's free memory, else 'dataloader'; on CPU the device *is* host memory: 'device'."""
    if mode != "auto":
        return mode
    if device.type != "cuda":
        return "device"
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if nbytes <= fraction * free else "dataloader"


def batch_seed(seed: int, i: int) -> int:
    """The seed of bootstrap batch `i` of a stream `seed`: independent streams for every (seed, i)."""
    return int(np.random.SeedSequence([seed, i]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


class BootstrapBatches(torch.utils.data.Dataset):
    """Item i: `batch_size` rows drawn with replacement from `rows` (a CPU tensor), with a generator seeded by
    (seed, i) alone, so that a batch does not depend on which worker makes it, or when."""

    def __init__(self, rows: torch.Tensor, batch_size: int, seed: int):
        self.rows, self.batch_size, self.seed = rows, batch_size, seed

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(batch_seed(self.seed, i))
        idx = torch.randint(len(self.rows), (self.batch_size,), generator=g)
        return self.rows.index_select(0, idx)


class CountFrom(torch.utils.data.Sampler):
    """The endless batch numbers start, start + 1, ... (one training run never runs out of batches)."""

    def __init__(self, start: int = 0):
        self.start = start

    def __iter__(self):
        return itertools.count(self.start)


# ------------------------------------------------------------------------------------------------ helpers
class unfolded:
    """`with unfolded(G):` G's folds (output_bounds, unit_direction) are off inside the block, restored after."""

    def __init__(self, G: OptiGANGenerator):
        self.G = G

    def __enter__(self) -> OptiGANGenerator:
        self.saved = (self.G.bounded, self.G.unit_direction)
        self.G.bounded, self.G.unit_direction = False, False
        return self.G

    def __exit__(self, *exc) -> None:
        self.G.bounded, self.G.unit_direction = self.saved


def output_bounds(crystal) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of X, Y, dX, dY, dZ, EKine for a detected photon: the exit face, and the escape cone
    dZ >= cos θc (so |dX|, |dY| <= sin θc); the energy is left unbounded (+-inf)."""
    half, cos_c = crystal.width / 2, crystal.cos_critical
    sin_c = float(np.sqrt(1.0 - cos_c * cos_c))
    lo = np.array([-half, -half, -sin_c, -sin_c, cos_c, -np.inf], dtype=np.float32)
    hi = np.array([half, half, sin_c, sin_c, 1.0, np.inf], dtype=np.float32)
    return lo, hi


def _safe_std(a: np.ndarray) -> np.ndarray:
    s = a.std(0, dtype=np.float64)
    return np.where(s > 1e-6, s, 1.0)


def group_by_condition(conds: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(unique emission points (k, 3), row indices of each), points in lexicographic order."""
    points, inverse = np.unique(np.asarray(conds), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(points) + 1))
    return points, [order[bounds[i]:bounds[i + 1]] for i in range(len(points))]
