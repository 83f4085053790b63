"""Typed run configuration: dataclasses whose defaults are the paper's settings (SAGIPS paper, Table III).

Precedence, lowest first: dataclass defaults -> the environment's `config_defaults` -> `--config FILE` (a preset
YAML, which only overrides; or `ENV:NAME`, a preset that environment ENV ships) ->
`--set a.b=value` (values parsed as YAML) -> the dedicated CLI flags (`--mode`, `--epochs`, `--seed`, ...).

Every error (unknown key, wrong type, value out of range) is a `ConfigError` whose message is one line that names
the key; `sagips.run` turns it into exit status 2 before any work starts.

The `environment` section is typed by the environment itself: `environment.name` picks a registered environment
(see `sagips.environment`) whose `Config` dataclass validates the rest of the section.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import yaml

# ConfigError is re-exported; it is defined apart so that sagips.environment needs no import of this module, which
# imports the environment registry
from sagips.errors import ConfigError  # noqa: F401


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader, but only true/false are booleans (as in YAML 1.2): YAML 1.1 also reads on/off/yes/no as
    booleans, which turned `--set label=yes` into the label 'on'. A boolean key still takes them (`_coerce`)."""


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_BOOL_WORDS = {"on": True, "yes": True, "off": False, "no": False}

MODES = ("ensemble", "allreduce", "arar", "arar-arar", "rma-arar-arar", "hvd")
#: the modes with inner groups and outer epochs (comm.inner_size, comm.outer_every, comm.outer_sync)
GROUPED_MODES = ("arar-arar", "rma-arar-arar")


def _meta(help: str, **checks: Any) -> dict:
    return {"help": help, **checks}


def opt(default: Any, help: str, **checks: Any) -> Any:
    """A documented dataclass field. `checks`: min, max, gt (exclusive minimum), choices."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=_meta(help, **checks))
    return field(default=default, metadata=_meta(help, **checks))


@dataclass
class TrainConfig:
    """The per-rank epoch loop (paper Table III and section V-A)."""

    epochs: int = opt(100_000, "number of training epochs (one generator step each)", min=1)
    lr_g: float = opt(1e-5, "generator learning rate (Adam)", gt=0.0)
    lr_d: float = opt(1e-4, "discriminator learning rate (Adam)", gt=0.0)
    lr_final: float = opt(1.0, "learning rates decay exponentially to this fraction of their start value at the "
                          "last epoch (1 = constant, as in the paper)", gt=0.0, max=1.0)
    lr_d_final: float | None = opt(None, "the discriminator's own lr_final (null: lr_final). Above lr_final, the "
                                   "critic keeps learning late in the run while the generator's steps shrink (a "
                                   "two-time-scale schedule, at no cost per epoch)", gt=0.0, max=1.0)
    beta1: float = opt(0.5, "Adam beta1 for both networks", min=0.0, max=0.999999)
    beta2: float = opt(0.999, "Adam beta2 for both networks", min=0.0, max=0.999999)
    log_every: int = opt(100, "epochs between metrics.jsonl records (losses + quality)", min=1)
    checkpoint_every: int = opt(5000, "epochs between generator checkpoints (also at epoch 1 and at the end)", min=1)
    state_every: int = opt(1000, "epochs between full training states (for --resume); also written on SIGTERM",
                           min=1)
    max_bad_steps: int = opt(10, "stop after this many generator steps in a row with NaN/Inf gradients (counted on "
                             "the device, read every max_bad_steps epochs: the run stops within that many epochs of "
                             "the last of them)", min=1)
    quality_samples: int = opt(1024, "noise vectors used for the logged mean prediction", min=1)
    device: str = opt("auto", "'auto' (cuda:(local_rank % device_count) if CUDA is present, else cpu), 'cpu' or 'cuda'",
                      choices=("auto", "cpu", "cuda"))
    threads: int = opt(0, "torch intra-op threads per rank; 0 = the rank's own cores where the launcher pinned each "
                       "rank (e.g. --cpu-bind depth), else the host's cores / the ranks that share them", min=0)
    progress: bool = opt(True, "show a progress bar on rank 0 (member 0's in a job of several members); into a log "
                         "or mpiexec's pipe it updates every 10 s")
    amp: str = opt("none", "mixed precision of the network passes: 'none', 'bf16' (CPU or GPU autocast), "
                   "'fp16' (CUDA, with a GradScaler), 'auto' (CUDA: bf16 where the GPU has it, else fp16; CPU: bf16 "
                   "only where native and measured faster at start-up, else none; sagips/precision.py); the pipeline "
                   "always runs in float32",
                   choices=("none", "bf16", "fp16", "auto"))
    ema: float = opt(0.0, "decay of an exponential moving average of the generator's weights (e.g. 0.999), kept on "
                     "each rank; when on, the logged quality and the checkpoints use the averaged generator and the "
                     "training states keep both; 0 = off (the paper)", min=0.0, max=0.999999)
    split_batch: bool = opt(False, "eq. 10 of the paper: divide the environment's batch (Environment.batch_key: "
                            "proxy1d's param_samples, optiGAN's batch_size) by the ranks whose gradients are averaged "
                            "(the world size in every mode but ensemble), so that the effective batch stays that of "
                            "one rank; run.json records both")
    fused_adam: bool = opt(True, "use the fused Adam kernel where torch has one for the device (CUDA; CPU since "
                           "torch 2.4), else the default Adam")
    chunk_rows: int = opt(-1, "critic passes in chunks of this many rows, each chunk's forward and backward back to "
                          "back while its activations are in cache (the same loss and gradients up to float "
                          "rounding; sagips/chunked.py); 0 = the whole batch at once; -1 = auto (0 on CUDA, on CPU "
                          "the rows whose critic activations fill 8 MiB per thread)", min=-1)
    cuda_graph: str = opt("auto", "record the epoch's device work as CUDA graphs and replay them (sagips/graph.py): "
                          "'auto' (on CUDA where nothing stands in the way, else eager, saying why), 'on' (an error "
                          "where it cannot), 'off'; run.json records what was used", choices=("auto", "on", "off"))
    cuda_graph_warmup: int = opt(3, "eager epochs before the step is recorded (optimizer state and allocator settle)",
                                 min=1)
    profile: bool = opt(False, "named profiler ranges (sagips/epoch, critic, generator, data, exchange, log): NVTX on "
                        "CUDA (for nsys) and torch.profiler.record_function everywhere; off = no cost")


@dataclass
class CommConfig:
    """How generator gradients travel between ranks (paper section IV-B)."""

    inner_size: int = opt(0, "ranks per inner group; 0 = the ranks of one node (MPI COMM_TYPE_SHARED)", min=0)
    allow_cross_node_rma: bool = opt(False, "rma-arar-arar: accept an inner_size whose groups span nodes, so that "
                                     "their one-sided MPI crosses the network, where Cray MPICH on Slingshot has "
                                     "known hangs (pmodels/mpich#7118, #7830; docs/polaris.md); false = such a size "
                                     "is refused at start-up")
    outer_every: int = opt(1000, "h: the leaders' (outer) ring runs every h epochs", min=1)
    ring: str = opt("whole", "'whole' (paper: N-1 hops of the full buffer) or 'chunked' (reduce-scatter + all-gather)",
                    choices=("whole", "chunked"))
    exchange_bias: bool = opt(False, "also exchange bias gradients (the paper exchanges weight gradients only; "
                              "mode hvd averages every parameter of both networks)")
    outer_sync: str = opt("gradients", "what an outer epoch of the grouped modes shares: 'gradients' (the paper: the "
                          "leaders' ring of the inner means, one shared step) or 'weights' (the generator's weights "
                          "and Adam moments averaged over all ranks after the step, as torch's "
                          "HierarchicalModelAverager and DiLoCo do: the groups' generators become identical again)",
                          choices=("gradients", "weights"))
    max_staleness: int = opt(10, "RMA: drop a contribution older than this many epochs", min=0)
    timeout_s: float = opt(300.0, "watchdog: abort the job if a rank waits longer than this in an exchange (0 = never)",
                           min=0.0)


@dataclass
class PipelineConfig:
    """Straggler knob: a fixed sleep in the pipeline of chosen ranks, every epoch (the paper's motivating case); and a
    fault drill: an error in the pipeline of chosen ranks at one epoch."""

    delay_s: float = opt(0.0, "seconds of sleep added to the pipeline of each rank in delay_ranks", min=0.0)
    delay_ranks: list[int] = opt([], "ranks (in the run's communicator) whose pipeline is slowed")
    fail_epoch: int = opt(0, "fault drill: at this epoch the pipeline of each rank in fail_ranks raises an error, "
                          "to check that a job on this machine ends at once, naming the rank (0 = off)", min=0)
    fail_ranks: list[int] = opt([], "ranks (in the run's communicator) that fail at pipeline.fail_epoch")


@dataclass
class EnsembleConfig:
    """Ensembles of independent runs inside one mpiexec."""

    members: int = opt(1, "split the world into this many independent runs (member{m:03d}/ subdirectories)", min=1)
    data: str = opt("shared", "how the members get their reference data: 'shared' (each rank keeps its random "
                    "environment.subset_fraction of the whole data set, so the members' subsets overlap) or 'split' "
                    "(the data set is dealt out in disjoint parts, by data.subset's blocks or rows in a random order "
                    "from the seed: one part per member, or per rank in --mode ensemble, whose ranks are independent; "
                    "each rank keeps its subset_fraction of its part). Split members are independent estimates: "
                    "sagips.analyze's sigma is then their standard error s/sqrt(M), exact for the statistical and "
                    "the training noise alike (docs/analysis.md); set environment.subset_fraction=1 to use every "
                    "event once", choices=("shared", "split"))
    analyze: bool = opt(True, "at the end of a job of several members, the member that ends last runs sagips.analyze "
                        "on the job (OUTPUT_DIR/analysis/) and prints p-hat +- sigma per parameter, the number to "
                        "quote (sagips/analysis/job.py); so does rank 0 of a --mode ensemble run of several ranks, "
                        "whose ranks are independent members; false skips it (python -m sagips.analyze OUTPUT_DIR "
                        "gives the same at any time)")


@dataclass
class AnalysisConfig:
    """How sagips.analyze turns the members into p-hat +- sigma (docs/analysis.md)."""

    nonclosure: float | dict[str, float] = opt(
        0.0, "a systematic error of the GAN, in units of the data's Cramer-Rao bound, added in quadrature to sigma and "
        "named in the output: the training bias that a calibration on data sets of known truth measured beyond sigma "
        "(python -m sagips.closure, benchmarks/coverage.py); one number for every parameter, or a mapping of "
        "parameter names to numbers ({tau: 0, resolution: 2.5}; a parameter left out: 0); 0: none. Needs the bound "
        "(density and simulator environments)", min=0.0)


@dataclass
class DataConfig:
    """How each rank takes its share of a reference data file (docs/environments.md, "Reference data at scale")."""

    subset: str = opt("blocks", "with environment.data_file: 'blocks' (each rank reads whole blocks of rows, in a "
                      "seeded random order, straight from the file: for large files; rows ordered by run or time "
                      "give each rank whole stretches of them) or 'rows' (a uniform random choice of rows; each rank "
                      "reads the whole file once, in blocks: for small files); without a file, the same choice from "
                      "the file that `python -m sagips.data` would write with the run's seed, of which each rank "
                      "generates only the blocks it keeps", choices=("blocks", "rows"))
    share: str = opt("rank", "with environment.data_file: 'rank' (every rank holds its own random subset) or 'node' "
                     "(the ranks of one node hold one subset of subset_fraction x N rows, chosen per node, in one "
                     "MPI shared-memory window, and each rank bootstraps its batches from it: ranks-per-node times "
                     "less memory, e.g. 4x on Polaris; for large files)", choices=("rank", "node"))


@dataclass
class Config:
    """A whole run. Defaults reproduce the paper's proxy 1D settings."""

    mode: str = opt("ensemble", "gradient exchange mode", choices=MODES)
    seed: int = opt(1234, "base random seed; every rank derives its own from it", min=0)
    output_dir: str = opt("runs/default", "where run.json, metrics.jsonl and checkpoints/ go")
    label: str = opt("", "free-text label carried into run.json (used by sagips.analyze --group-by label)")
    environment: Any = None  # the environment's own Config dataclass, filled in by `build_config`
    train: TrainConfig = field(default_factory=TrainConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)


# --------------------------------------------------------------------------------------------- validation
def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:  # the named values: 'auto'
        return " or ".join(repr(v) for v in get_args(tp))
    if get_origin(tp) is dict:
        return "a mapping of names to numbers"
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(tp) or getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; return it (ints are accepted where floats are expected)."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(key, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}: must be one of {list(get_args(tp))}, got {value!r}")
        return value
    if origin is dict:  # a mapping of names to values (analysis.nonclosure per parameter)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        _, item_tp = get_args(tp) or (str, Any)
        return {str(k): _coerce(f"{key}.{k}", v, item_tp) for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:  # YAML 1.1's booleans, read as strings here
            value = _BOOL_WORDS[value.lower()]
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, (str, float)) and not isinstance(value, bool):
            # a whole number written as 1e6 or 1.6e7 (YAML 1.1 reads `1e6` as a string): what the user means
            try:
                whole = float(value)
            except ValueError:
                whole = float("nan")
            if whole.is_integer():
                value = int(whole)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            # PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string; users mean a number
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            value = float(value)  # an int beyond float's range (1e309 written out) overflows
        except OverflowError:
            raise ConfigError(f"{key}: must be a finite number, got an integer of {len(str(value))} digits") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return value
    if tp is str:
        if isinstance(value, bool):  # `true`/`false` where a string is expected (e.g. `train.cuda_graph: true`)
            value = "on" if value else "off"
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # pragma: no cover - a programming error


def _check_range(key: str, value: Any, meta: dict) -> None:
    if value is None:
        return
    vals = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
    for v in vals:
        if "choices" in meta and v not in meta["choices"]:
            raise ConfigError(f"{key}: must be one of {list(meta['choices'])}, got {v!r}")
        if isinstance(v, str):  # a named choice of a numeric field (e.g. 'auto'): its type admitted it
            continue
        if "min" in meta and v < meta["min"]:
            raise ConfigError(f"{key}: must be >= {meta['min']}, got {v!r}")
        if "max" in meta and v > meta["max"]:
            raise ConfigError(f"{key}: must be <= {meta['max']}, got {v!r}")
        if "gt" in meta and not v > meta["gt"]:
            raise ConfigError(f"{key}: must be > {meta['gt']}, got {v!r}")


def from_dict(cls: type, data: dict | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a (possibly partial) dict, validating every key, type and range."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)  # YAML keys may be ints, null, ...
    if unknown:
        hint = getattr(cls, "unknown_key_hints", {}).get(unknown[0])  # a section may say where a key really lives
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'{f': {hint}' if hint else ''} (known keys in "
                          f"'{prefix.rstrip('.') or 'top level'}': {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        key = prefix + name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(tp, data[name], key + ".")
        else:
            value = _coerce(key, data[name], tp)
            _check_range(key, value, f.metadata)
            kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check is not None:
        check()
    return obj


def to_dict(obj: Any) -> Any:
    """A JSON/YAML-able dict of a (nested) config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(key, default, help) for every documented field; used by `sagips.run --help-config`."""
    rows = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, prefix + f.name + ".")
        elif "help" in f.metadata:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((prefix + f.name, default, f.metadata["help"]))
    return rows


# --------------------------------------------------------------------------------------------- loading
def parse_set(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (['a', 'b'], yaml-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set train.lr_g=1e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
    except Exception as e:  # YAMLError, and what PyYAML lets through: ValueError (date 2001-13-45), KeyError (!!bool x)
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({detail})") from None
    return key.split("."), value


def load_yaml(path: str) -> dict:
    try:
        with open(path) as fh:
            data = yaml.load(fh, Loader=_Loader)  # a SafeLoader (above)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except OSError as e:  # a directory, no permission, ...
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    except Exception as e:  # YAMLError, and what PyYAML lets through: ValueError (date 2001-13-45, bad UTF-8), KeyError
        raise ConfigError(f"--config {path}: not valid YAML ({' '.join(str(e).split())[:200]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping of sections")
    return data


def merge(base: dict, path: list[str], value: Any) -> None:
    node = base
    for i, part in enumerate(path[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {'.'.join(path)}: '{'.'.join(path[:i + 1])}' is not a section")
        node = nxt
    node[path[-1]] = value


DEFAULT_ENVIRONMENT = "proxy1d"


def build_config(raw: dict) -> Config:
    """Validate a raw nested dict into a Config, including the environment's own section.

    The environment's `config_defaults` (e.g. its `train:` settings) lie beneath what `raw` says."""
    from sagips.environment import get_environment  # local: the registry imports torch

    raw = dict(raw)
    env_raw = raw.pop("environment", None) or {}
    if not isinstance(env_raw, dict):
        raise ConfigError(f"environment: expected a mapping with at least 'name', got {env_raw!r}")
    env_raw = dict(env_raw)
    named = "name" in env_raw
    name = env_raw.pop("name", DEFAULT_ENVIRONMENT)
    if not isinstance(name, str):
        raise ConfigError(f"environment.name: expected the name of a registered environment, got {name!r}")
    env_cls = get_environment(name)
    for section, defaults in (getattr(env_cls, "config_defaults", None) or {}).items():
        given = raw.get(section)
        if given is None or isinstance(given, dict):  # anything else is reported by from_dict below
            raw[section] = {**defaults, **(given or {})}
    cfg = from_dict(Config, raw)
    try:
        cfg.environment = from_dict(env_cls.Config, env_raw, "environment.")
    except ConfigError as e:
        if named:
            raise
        raise ConfigError(f"environment keys without environment.name were read as {DEFAULT_ENVIRONMENT}'s ({e}); "
                          f"set environment.name to your environment") from None
    cfg.environment.name = name
    if cfg.comm.outer_sync != "gradients" and cfg.mode not in GROUPED_MODES:
        raise ConfigError(f"comm.outer_sync={cfg.comm.outer_sync} needs a mode with outer epochs "
                          f"({' or '.join(GROUPED_MODES)}), not {cfg.mode}")
    return cfg


def preset(spec: str) -> dict:
    """`ENV:NAME`: the preset NAME that environment ENV ships (Environment.presets), as a raw config dict."""
    import copy
    import os
    import sys

    from sagips.environment import get_environment

    env_name, name = spec.split(":", 1)
    env_cls = get_environment(env_name)
    presets = getattr(env_cls, "presets", None) or {}
    if name not in presets:
        known = ", ".join(f"{env_name}:{k}" for k in sorted(presets)) or "none"
        raise ConfigError(f"--config {spec}: environment {env_name!r} ships no preset {name!r} (its presets: {known})")
    value = presets[name]
    if isinstance(value, str):  # a YAML file beside the environment's module
        module = sys.modules.get(env_cls.__module__)
        base = os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "."))
        raw = load_yaml(os.path.join(base, value))
    elif isinstance(value, dict):
        raw = copy.deepcopy(value)
    else:
        raise ConfigError(f"--config {spec}: the preset must be a mapping or a YAML file name, "
                          f"got {type(value).__name__}")
    env = raw.get("environment")
    if env is None:
        env = raw["environment"] = {}
    if not isinstance(env, dict):
        raise ConfigError(f"--config {spec}: the preset's environment section must be a mapping")
    if env.setdefault("name", env_name) != env_name:
        raise ConfigError(f"--config {spec}: the preset names environment {env['name']!r}, not {env_name!r}")
    return raw


def is_preset(config_file: str) -> bool:
    """`ENV:NAME` (no such file, one colon, no path separators): a preset shipped by an environment."""
    import os

    return not os.path.exists(config_file) and re.fullmatch(r"[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+", config_file) is not None


def config_to_dict(cfg: Config) -> dict:
    d = to_dict(cfg)
    env = dict(d.pop("environment") or {})
    env = {"name": getattr(cfg.environment, "name", DEFAULT_ENVIRONMENT),
           **{k: v for k, v in env.items() if k != "name"}}
    return {"mode": d.pop("mode"), "environment": env, **d}


def load(config_file: str | None, sets: list[str] = (), flags: dict | None = None, base: dict | None = None) -> Config:
    """Defaults <- YAML preset (or `base`, e.g. the config saved in a run.json) <- --set overrides <- CLI flags."""
    import copy

    if config_file and is_preset(config_file):
        raw: dict = preset(config_file)
    else:
        raw = load_yaml(config_file) if config_file else copy.deepcopy(base or {})
    for item in sets:
        path, value = parse_set(item)
        merge(raw, path, value)
    for dotted, value in (flags or {}).items():
        if value is not None:
            merge(raw, dotted.split("."), value)
    return build_config(raw)
