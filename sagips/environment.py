"""The Environment protocol and its registry.

An environment is the physics side of SAGIPS: it owns the pipeline that turns generator output into events, the
reference data, the two networks and the GAN losses. It never imports mpi4py: parallelism is applied from outside
(`sagips.trainer` + `sagips.comm`).

Environments register through the entry-point group ``sagips.environments`` exactly as a third-party package would::

    [project.entry-points."sagips.environments"]
    proxy1d = "sagips_environments.proxy1d:Proxy1D"

The trainer's epoch loop, in terms of this protocol::

    for k in range(env.n_critic):                      # critic steps
        real = env.real_batch()
        with torch.no_grad(): fake = env.synthesize(G, real)
        loss_d = env.d_loss(D, real, fake)             # backward + D optimizer step
    real = env.real_batch()
    fake = env.synthesize(G, real)                      # differentiable w.r.t. G
    loss_g, extras = env.g_loss(D, real, fake)          # backward, then the gradient exchange, then G step

Around the loop: with a data file (`cfg.data_file`, an HDF5 file with the datasets of `datasets`), `sagips.run`
has rank 0 read its layout only and every rank read its own rows (sagips/io/shard.py), then calls
`attach_subset(arrays, attrs)`; without one, every rank calls `generate_reference(cfg, seed)` (rank 0 alone, and a
broadcast, where `generate_per_rank` is False) and `attach_data(arrays, attrs, rng)`; an environment without
`attach_subset` gets the whole file from rank 0 through `attach_data`. Then `truth()` and
`parameter_names()` for run.json, `quality(G, n)` every `train.log_every` epochs and `combine_quality(per_rank)`
over ranks, `summary_table(q)` at the end; `--resume` restores `gen`, calls `select_subset(idx)` with the saved
`subset_idx` and `load_extra_state(extra_state())`; `sagips.analyze` rebuilds the environment from run.json and
evaluates `params(G, n)` on a shared batch drawn through `noise(n)`. The first epoch of every process is checked
(`sagips.checks`): errors there are one line that names the method to fix.

Most users do not implement this protocol: `sagips.ParametricEnvironment` does it for a few named, bounded
parameters and a density or simulator (docs/environments.md).

Losses that are sums over rows should go through `self.critic_loss(fn, inputs, D)`: on a CPU it runs the critic in
cache-sized row chunks (`train.chunk_rows`, sagips/chunked.py), with the same loss and gradients.
"""
from __future__ import annotations

import abc
from importlib.metadata import entry_points
from typing import Any, ClassVar, Optional

import numpy as np
import torch

from sagips.errors import ConfigError

GROUP = "sagips.environments"


class EnvironmentCheckError(ConfigError):
    """The environment's code broke a contract (found at the first epoch): one line that names the method to fix.
    A ConfigError, so `sagips.run` prints it once and exits with status 2."""


class Environment(abc.ABC):
    """Base class of SAGIPS environments. Subclasses set `name`, `Config` and implement the methods below."""

    name: ClassVar[str]
    #: the dataclass of the `environment:` config section (documented fields made with `sagips.config.opt`, an
    #: optional `validate()` raising ConfigError); a field `data_file` (str | None), when present, names a reference
    #: HDF5 file that `sagips.run` reads instead of calling `generate_reference`
    Config: ClassVar[type]
    #: names of the HDF5 datasets of the reference data, with their expected number of columns
    datasets: ClassVar[dict[str, int]]
    #: presets that travel with the environment: name -> a config mapping (the sections of a --config YAML) or a
    #: YAML file name relative to the environment's module; chosen with `sagips.run --config ENV:NAME`
    presets: ClassVar[dict[str, Any]] = {}
    #: config defaults of this environment beneath any preset, e.g. {"train": {"epochs": 2000, "lr_g": 3e-4}}
    #: (without them a new environment starts from the paper's proxy 1D training settings)
    config_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    #: every rank runs `generate_reference` itself (cheap generators); False: rank 0 runs it and broadcasts the data
    generate_per_rank: ClassVar[bool] = True
    #: `attach_subset` keeps the arrays it is given as they are (on a CPU device, no copy; a GPU copy is its own), so
    #: that data.share=node holds one copy of the data per node (they are then views of the node's shared window,
    #: valid until the run ends); False: data.share=node is refused
    keeps_arrays: ClassVar[bool] = False
    #: indices of the reference rows this rank keeps (saved in the training state; --resume restores them through
    #: `select_subset`); None where the environment keeps no subset
    subset_idx: Optional[np.ndarray] = None
    #: the field of the environment's Config that holds the batch per step (what train.split_batch divides by the
    #: ranks whose gradients are averaged, eq. 10 of the paper); None: the environment cannot split its batch
    batch_key: ClassVar[Optional[str]] = None
    n_critic: int = 1  #: critic steps per generator step
    #: whether the generator step's `synthesize` and `g_loss` read the real batch (False: the trainer passes None and
    #: draws none, so no work is thrown away; e.g. proxy1d, whose generator loss sees only synthetic events)
    g_loss_reads_real: bool = True

    def graph_obstacle(self) -> str | None:
        """Why this environment's step cannot be recorded as a CUDA graph (train.cuda_graph), or None. An environment
        whose batches come from the host, or whose pipeline reads device values on the host, says so here; `auto`
        then runs eagerly and says why."""
        return None
    #: rows per chunk of the critic's passes (set by the trainer from train.chunk_rows; 0 = whole batch); see
    #: `critic_loss` and sagips/chunked.py
    chunk_rows: int = 0

    def __init__(self, cfg: Any, device: torch.device, seed: int):
        self.cfg = cfg
        self.device = torch.device(device)
        #: the environment's own random stream on the device (bootstrap indices, noise, sampler uniforms)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)

    # -- reference data (numpy arrays; each rank reads or generates its own: sagips/io/shard.py) --------------
    @classmethod
    @abc.abstractmethod
    def generate_reference(cls, cfg: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Make reference data from the configured truth: (arrays, attributes)."""

    @abc.abstractmethod
    def attach_data(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any], rng: np.random.Generator) -> None:
        """Keep this rank's share of the reference data (e.g. a random subset) on the device. Draw the subset from
        `rng` only (seeded per rank): --resume rebuilds it from the same seed, and the training state keeps no
        indices."""

    def attach_subset(self, arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> None:
        """Keep `arrays`, this rank's rows of the data file already chosen and read by the framework (a random
        fraction `cfg.subset_fraction` of the rows, sagips/io/shard.py), on the device. Optional: without it the
        framework broadcasts the whole file from rank 0 and calls `attach_data`."""
        raise NotImplementedError

    def size_batch(self, events_kept: int, ema: float, requested: int | None = None) -> dict[str, Any] | None:
        """After the data are attached, before the trainer is built: size a batch that the config leaves to the data
        (e.g. ParametricEnvironment's events_per_sample=auto) from the events this rank keeps (nominal: the same on
        every rank) and train.ema; `requested`: the batch (`batch_key`) as the config gives it, before
        train.split_batch divided it among the ranks (None: not divided). run.json's record, or None (nothing
        sized)."""
        return None

    def shared_state(self) -> dict[str, Any]:
        """Values computed from the data that must be equal on every rank (e.g. a standardisation): after
        `attach_subset`, rank 0's are passed to `set_shared_state` on every rank. {} = none."""
        return {}

    def set_shared_state(self, state: dict[str, Any]) -> None:
        """Adopt rank 0's `shared_state()`."""
        return None

    # -- networks -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def build_generator(self) -> torch.nn.Module: ...

    @abc.abstractmethod
    def build_discriminator(self) -> torch.nn.Module: ...

    # -- one epoch ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def real_batch(self) -> Any:
        """A batch of real events, bootstrapped from this rank's data."""

    @abc.abstractmethod
    def synthesize(self, G: torch.nn.Module, real: Any) -> Any:
        """Generator output pushed through the pipeline: synthetic events (differentiable w.r.t. G)."""

    @abc.abstractmethod
    def d_loss(self, D: torch.nn.Module, real: Any, fake: Any) -> torch.Tensor: ...

    @abc.abstractmethod
    def g_loss(self, D: torch.nn.Module, real: Any, fake: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Generator loss, and extra scalar tensors to log (e.g. the norm loss)."""

    def critic_loss(self, fn, inputs, D: torch.nn.Module) -> torch.Tensor:
        """sum over row chunks of fn(*row slices of inputs), differentiable w.r.t. the inputs and D's parameters,
        in chunks of `chunk_rows` (sagips.chunked.chunked_loss): for losses that are sums over rows."""
        from sagips.chunked import chunked_loss

        return chunked_loss(fn, inputs, D.parameters(), self.chunk_rows)

    @property
    @abc.abstractmethod
    def events_per_epoch(self) -> int:
        """Discriminator batch size: synthetic events per critic step (N_disc of eq. 9)."""

    def select_subset(self, idx: np.ndarray) -> None:
        """Keep the reference rows `idx` (this rank's share) and set `subset_idx`; --resume calls it with the
        saved indices. Needed only by environments that set `subset_idx` in `attach_data`."""
        raise NotImplementedError(f"{type(self).__name__} sets subset_idx but does not implement select_subset(idx)")

    # -- parameters (sagips.analyze) -----------------------------------------------------------------------------
    def noise(self, n: int) -> torch.Tensor:
        """n generator inputs, drawn from `self.gen` (sagips.analyze replaces it to share one batch between runs)."""
        raise NotImplementedError(f"{type(self).__name__} has no noise(n)")

    def params(self, G: torch.nn.Module, n: int) -> torch.Tensor:
        """Physical parameter predictions (n, P) of generator G, for noise drawn through `self.noise(n)`."""
        raise NotImplementedError(f"{type(self).__name__} has no params(G, n)")

    def parameter_names(self) -> list[str] | None:
        """Names of the P predicted parameters (tables, analysis); None: not a parameter-predicting environment."""
        return None

    # -- quality -----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def quality(self, G: torch.nn.Module, n: int) -> dict[str, Any]:
        """Convergence measures of generator G for metrics.jsonl, from n noise vectors (train.quality_samples):
        residuals for proxy1d, JS similarity for optigan. JSON-able values; must not draw from `self.gen` (a
        resumed run stays bit-identical)."""

    def combine_quality(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """The run's quality from every rank's (e.g. the prediction averaged over the ranks' generators)."""
        return per_rank[0]

    def adapt(self, G: torch.nn.Module) -> None:
        """Called on every rank after each log epoch's step, on the host, with the generator's evaluation weights:
        update state of the pipeline from the current prediction (ParametricEnvironment: environment.precondition).
        Write it into device tensors in place (a recorded CUDA graph replays them) and return it in `extra_state`.
        Default: nothing."""
        return None

    # -- resume ---------------------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """State beside `gen` that --resume must restore (e.g. a data loader's position); {} = none. A subclass of
        ParametricEnvironment that overrides it (or load_extra_state) calls super() and merges the dicts."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what `extra_state` returned (called after `gen` and the data subset are restored)."""
        return None

    def truth(self) -> list[float] | None:
        """The true parameters, if the environment has them (loop-closure tests; sagips.analyze needs them)."""
        return None

    def progress_fields(self, quality: dict[str, Any]) -> dict[str, str]:
        """Short fields for the rank-0 progress bar."""
        return {}

    def summary_table(self, quality: dict[str, Any]) -> str:
        """A human-readable table printed at the end of a run."""
        return ""


def available() -> dict[str, Any]:
    """name -> entry point of every registered environment (nothing is imported)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _package(ep) -> str:
    dist = getattr(ep, "dist", None)
    return f"package {dist.name!r}" if dist is not None and getattr(dist, "name", None) else "an unknown package"


def load_entry_point(ep) -> type[Environment]:
    """The Environment subclass behind one entry point; a ConfigError of one line (naming the package) otherwise."""
    try:
        cls = ep.load()
    except Exception as e:  # noqa: BLE001  (a third party's import can fail in any way)
        detail = " ".join(str(e).split())[:200]
        raise ConfigError(f"environment {ep.name!r}: its entry point {ep.value!r} from {_package(ep)} cannot be "
                          f"loaded ({type(e).__name__}: {detail}); fix or reinstall that package") from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"environment {ep.name!r}: its entry point {ep.value!r} from {_package(ep)} is not a "
                          f"subclass of sagips.Environment")
    return cls


def get_environment(name: str) -> type[Environment]:
    """The registered environment class called `name`; a ConfigError naming the choices otherwise."""
    eps = available()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none"
        raise ConfigError(f"environment.name: unknown environment {name!r} (registered: {known}); a package of your "
                          f"own registers it with an entry point in the group sagips.environments, once installed "
                          f"(pip install -e YOUR_PACKAGE, or pip install --target DIR with DIR on PYTHONPATH) where "
                          f"sagips runs, and sagips.analyze too (docs/environments.md)")
    return load_entry_point(eps[name])

