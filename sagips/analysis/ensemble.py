"""Load `sagips.run` outputs and turn their generator checkpoints into parameter predictions.

A *run* is one output directory of `sagips.run` (run.json + checkpoints/rank{R:04d}/epoch{E:07d}.pt). A directory
that holds member{m:03d}/ subdirectories (an ensemble launched in one job with --ensemble-size) expands to them.

A run's prediction for a noise vector n is the average over its ranks' generators, mapped to physical parameters
(the paper, section VI-A: "we simply average over the predictions from all generators"). The runs of a group form
the ensemble of eqs. 7-8; every generator of every run sees the same batch of K noise vectors.

Everything here raises `AnalysisError` (one line, naming the file) on bad input; `sagips.analyze` turns it into
exit status 2. Checkpoints are only ever loaded with `torch.load(..., weights_only=True)`.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sagips.analysis import stats
from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.simfisher import MAX_COLUMNS

GROUP_KEYS = ("mode", "world_size", "label")
_MEMBER = re.compile(r"^member\d{3}$")

#: (generator, noise (K, noise_dim)) -> physical parameters (K, P)
ToPhysical = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


class AnalysisError(Exception):
    """Bad input for the analysis; the message is one line that names the offending run or file."""


# ------------------------------------------------------------------------------------------- generators -> numbers

def _raw_outputs(G: torch.nn.Module, noise: torch.Tensor) -> torch.Tensor:
    return G(noise)


@torch.no_grad()
def generator_outputs(generators: Sequence[torch.nn.Module], noise: torch.Tensor,
                      to_physical: ToPhysical | None = None) -> np.ndarray:
    """Predictions of every generator for the SAME noise batch: an array (M, K, P) (float64).

    `to_physical(G, noise)` maps a generator and the noise to physical parameters; by default the raw G(noise).
    """
    f = to_physical or _raw_outputs
    return np.stack([f(G, noise).detach().cpu().double().numpy() for G in generators])


def ensemble_from_generators(generators: Sequence[torch.nn.Module], noise: torch.Tensor, truth: Sequence[float],
                             to_physical: ToPhysical | None = None) -> stats.EnsembleResult:
    """Eqs. 6-8 for M generators evaluated on the same K noise vectors (each generator is one ensemble member)."""
    return stats.ensemble(generator_outputs(generators, noise, to_physical), truth)


# ------------------------------------------------------------------------------------------------ runs on disk
@dataclass
class Run:
    """One `sagips.run` output directory, validated."""

    path: Path
    info: dict[str, Any]                   #: run.json
    checkpoints: dict[int, dict[int, Path]]  #: {rank: {epoch: path}}
    truth: np.ndarray = field(repr=False)  #: (P,)

    @property
    def environment(self) -> str:
        return self.info["environment"]

    @property
    def mode(self) -> str:
        return str(self.info.get("mode", "?"))

    @property
    def world_size(self) -> int:
        return int(self.info.get("world_size", len(self.checkpoints)))

    @property
    def label(self) -> str:
        return str(self.info.get("label") or "")

    def group_key(self, by: str) -> str:
        if by == "mode":
            return self.mode
        if by == "world_size":
            return f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        if by == "label":
            return self.label or "(no label)"
        raise ValueError(f"unknown grouping {by!r} (choose from {', '.join(GROUP_KEYS)})")

    def epochs(self) -> list[int]:
        """Checkpoint epochs present for every rank of the run."""
        sets = [set(e) for e in self.checkpoints.values()]
        return sorted(set.intersection(*sets)) if sets else []

    def rate(self) -> float | None:
        """Eq. 9 of this run (None when run.json has no timings yet)."""
        return stats.run_analysis_rate(self.info)


def expand_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """RUN_DIR arguments -> run directories: a directory with member{m:03d}/ subdirectories expands to them."""
    out: list[Path] = []
    for p in map(Path, paths):
        try:
            if not p.is_dir():
                raise AnalysisError(f"{p}: no such directory")
            members = sorted(d for d in p.iterdir() if d.is_dir() and _MEMBER.match(d.name))
            is_run = (p / "run.json").is_file()
        except OSError as e:
            raise AnalysisError(f"{p}: cannot read it ({e.strerror})") from None
        if is_run and members:
            raise AnalysisError(f"{p}: holds both a run (run.json) and ensemble members ({members[0].name}, ...); "
                                f"name the run directories you mean explicitly")
        if is_run:
            out.append(p)
        elif members:
            out.extend(members)
        else:
            raise AnalysisError(f"{p}: not a sagips.run output directory (no run.json and no member*/ "
                                f"subdirectories)")
    seen, unique = set(), []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def load_run(path: str | Path) -> Run:
    """Read and check run.json and the checkpoint listing of one run (no checkpoint is loaded here)."""
    path = Path(path)
    try:
        info = json.loads((path / "run.json").read_text())
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no run.json (not a sagips.run output directory)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise AnalysisError(f"{path / 'run.json'}: unreadable ({' '.join(str(e).split())})") from None
    if not isinstance(info, dict):
        raise AnalysisError(f"{path / 'run.json'}: not a JSON object")
    for key in ("environment", "config", "world_size"):
        if key not in info:
            raise AnalysisError(f"{path / 'run.json'}: missing '{key}'")
    truth = info.get("truth")
    if not truth:
        raise AnalysisError(f"{path}: run.json has no truth (environment {info['environment']!r}); residuals "
                            f"(p - p^)/p need the true parameters")
    truth = np.asarray(truth, dtype=np.float64)
    if truth.ndim != 1 or np.any(truth == 0) or not np.all(np.isfinite(truth)):
        raise AnalysisError(f"{path}: run.json truth must be finite, non-zero numbers, got {info['truth']!r}")
    try:
        ck = list_checkpoints(path)
    except OSError as e:
        raise AnalysisError(f"{e.filename or path}: cannot read it ({e.strerror})") from None
    if not ck:
        raise AnalysisError(f"{path}: no checkpoints (expected checkpoints/rank0000/epoch0000001.pt and so on)")
    missing = sorted(set(range(int(info["world_size"]))) - set(ck))
    if missing:
        raise AnalysisError(f"{path}: no checkpoints for rank(s) {missing} of a {info['world_size']}-rank run")
    run = Run(path, info, ck, truth)
    if not run.epochs():
        raise AnalysisError(f"{path}: the ranks share no checkpoint epoch")
    return run


def check_runs(runs: Sequence[Run]) -> None:
    """All runs must come from one environment (the table rows are its parameters)."""
    envs = {}
    for r in runs:
        envs.setdefault(r.environment, r)
    if len(envs) > 1:
        (a, ra), (b, rb) = list(envs.items())[:2]
        raise AnalysisError(f"runs from different environments cannot be analysed together: {ra.path} is {a!r}, "
                            f"{rb.path} is {b!r}")


def truth_known(groups: Sequence[dict[str, Any]]) -> bool:
    """Do all groups of a summary name their data's truth (else it is the environment's placeholder: measured data,
    sagips.run's truth_known), so that residuals and pulls against it mean something?"""
    return all(g.get("truth_known", True) for g in groups)


def group_runs(runs: Sequence[Run], by: str) -> dict[str, list[Run]]:
    """Runs grouped by run.json[by], in the order of first appearance; truths must agree within a group."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.group_key(by), []).append(r)
    for name, members in groups.items():
        ref = members[0]
        for r in members[1:]:
            if (r.info.get("truth_known") is False) != (ref.info.get("truth_known") is False):
                known, measured = (ref, r) if r.info.get("truth_known") is False else (r, ref)
                raise AnalysisError(f"group {name!r}: {known.path} ran on data of known truth, {measured.path} on "
                                    f"measured data (its file names no truth): they fit different data; analyse "
                                    f"them apart")
            if r.truth.shape != ref.truth.shape or not np.allclose(r.truth, ref.truth, rtol=1e-12, atol=0.0):
                raise AnalysisError(f"group {name!r}: mismatched truths: {ref.path} has {ref.truth.tolist()} but "
                                    f"{r.path} has {r.truth.tolist()}")
    return groups


def per_data_set(runs: Sequence[Run], values: np.ndarray, seen: list[float | None]
                 ) -> tuple[np.ndarray, list[float | None], str | None]:
    """Members (`_members`) of several data sets, some shared by several members (e.g. 5 seeds x a 4-member job):
    the members of a data set share its statistical error, so they are not independent estimates; each data set's
    members are averaged into one, and sigma's members part is the spread of the D data sets' means, s/sqrt(D)
    (exact for independent data sets). Else unchanged, and no note."""
    ident = [data_identity(r) for r in runs for _ in range(len(r.checkpoints) if independent_ranks(r) else 1)]
    if len(ident) != len(values):  # (the members' own order: `_members`)
        raise AssertionError(f"{len(ident)} data sets for {len(values)} members")
    sets: dict[Any, list[int]] = {}
    for i, k in enumerate(ident):
        sets.setdefault(k, []).append(i)
    by_run: dict[Any, list[Run]] = {}
    for r in runs:
        by_run.setdefault(data_identity(r), []).append(r)
    if len(sets) < 2 or len(sets) == len(ident) or all(disjoint_parts(rs) for rs in by_run.values()):
        return values, seen, None  # (disjoint parts of each data set: every member is an independent estimate)
    means = np.stack([values[idx].mean(axis=0) for idx in sets.values()])
    sizes = sorted({len(idx) for idx in sets.values()})
    each = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return means, [None] * len(sets), (
        f"the {len(values)} members learned from {len(sets)} data sets, {each} members each: a data set's members "
        f"share its statistical error, so each data set's mean is one member here, and σ's members part is the "
        f"spread of the {len(sets)} means, s/√{len(sets)}")


# ------------------------------------------------------------------------------------------------ predictions
class RunPredictor:
    """Rebuilds a run's environment and generator (on CPU) and evaluates its checkpoints on a shared noise batch."""

    def __init__(self, run: Run, noise_seed: int):
        from sagips.config import ConfigError, from_dict
        from sagips.environment import Environment, get_environment

        self.run = run
        env_raw = dict((run.info.get("config") or {}).get("environment") or {})
        name = env_raw.pop("name", run.environment)
        if name != run.environment:
            raise AnalysisError(f"{run.path}: run.json names environment {run.environment!r} but its config "
                                f"says {name!r}")
        try:
            env_cls = get_environment(name)
            env_cfg = from_dict(env_cls.Config, env_raw, "environment.")
        except ConfigError as e:
            raise AnalysisError(f"{run.path}: cannot rebuild the environment from run.json: {e}") from None
        env_cfg.name = name
        # The environment's random stream is seeded with noise_seed and nothing else draws from it before
        # noise(K): every run built with the same seed (and noise size) gets the same noise batch.
        self.env = env_cls(env_cfg, "cpu", noise_seed)
        for attr in ("noise", "params"):
            if getattr(type(self.env), attr, None) is getattr(Environment, attr):
                raise AnalysisError(f"{run.path}: environment {name!r} has no {attr}() method; the ensemble analysis "
                                    f"needs parameter predictions p = params(G, n) from noise(n)")
        self.G = self.env.build_generator().eval()
        #: trained with environment.precondition=fisher (a run.json from before the option trained without it)
        self.preconditioned = (getattr(self.env, "preconditioner", None) is not None
                               and env_raw.get("precondition") == "fisher")
        self.names = self.env.parameter_names()  #: the parameters' names, or None (tables then say r_0, r_1, ...)

    def noise(self, k: int) -> torch.Tensor:
        return self.env.noise(k).detach().clone()

    def to_physical(self, G: torch.nn.Module, noise: torch.Tensor) -> torch.Tensor:
        """The environment's own params(G, n), fed with the given noise batch instead of fresh noise."""
        env = self.env
        env.noise = lambda n: noise  # shadows the method on this instance only; params() draws through it
        try:
            return env.params(G, len(noise))
        finally:
            del env.noise

    def load(self, rank: int, epoch: int) -> float:
        """Load the generator of (rank, epoch) into self.G; returns the checkpoint's time_s."""
        path = self.run.checkpoints[rank][epoch]
        try:
            ck = load_checkpoint(path)
        except Exception as e:  # noqa: BLE001  (torn or foreign file, or one weights_only refuses: many types)
            why = " ".join(str(e).split())
            why = why if len(why) <= 200 else why[:199] + "…"
            raise AnalysisError(f"{path}: cannot load checkpoint ({why}): the file is damaged or not a checkpoint; "
                                f"move it away to analyse the run without it (at an earlier checkpoint)") from None
        if not isinstance(ck, dict) or "generator" not in ck or "time_s" not in ck:
            raise AnalysisError(f"{path}: not a SAGIPS checkpoint (needs 'generator' and 'time_s')")
        env_name = ck.get("environment", self.run.environment)
        if env_name != self.run.environment:
            raise AnalysisError(f"{path}: checkpoint from environment {env_name!r} in a run of environment "
                                f"{self.run.environment!r}")
        try:
            self.G.load_state_dict(ck["generator"])
        except (RuntimeError, KeyError, TypeError) as e:
            raise AnalysisError(f"{path}: generator weights do not fit the run's environment "
                                f"({' '.join(str(e).split())[:200]})") from None
        return float(ck["time_s"])

    @torch.no_grad()
    def predict(self, epoch: int, noise: torch.Tensor) -> tuple[np.ndarray, list[float], np.ndarray]:
        """The run's prediction at `epoch`: the mean over its ranks of the physical parameters, per noise vector,
        shape (K, P); every rank's time_s; and every rank's prediction averaged over the noise, (R, P)."""
        acc, times, per_rank = None, [], []
        for rank in sorted(self.run.checkpoints):
            times.append(self.load(rank, epoch))
            try:
                p = generator_outputs([self.G], noise, self.to_physical)[0]
            except RuntimeError as e:  # e.g. a noise size that differs from the group's first run
                raise AnalysisError(f"{self.run.path}: its generator cannot take the group's noise batch "
                                    f"{tuple(noise.shape)} ({' '.join(str(e).split())[:160]})") from None
            acc = p if acc is None else acc + p
            per_rank.append(p.mean(axis=0))
        return acc / len(times), times, np.stack(per_rank)


@dataclass
class GroupSeries:
    """The predictions of one group of runs at the checkpoint epochs they all share."""

    name: str
    runs: list[Run]
    truth: np.ndarray     #: (P,)
    epochs: np.ndarray    #: (T,)
    time_s: np.ndarray    #: (T,) mean accumulated training seconds over all runs' ranks at each epoch
    preds: np.ndarray     #: (T, N, K, P) every run's rank-averaged prediction per noise vector
    names: list[str] | None = None  #: the parameters' names (Environment.parameter_names), None: unnamed
    rank_preds: list[np.ndarray] = field(default_factory=list)  #: per run, (T, R, P): each rank's noise-averaged

    def at(self, t: int, members: Sequence[int] | None = None) -> stats.EnsembleResult:
        """Eqs. 6-8 at time step t, for all runs or the given subset."""
        p = self.preds[t] if members is None else self.preds[t][list(members)]
        return stats.ensemble(p, self.truth)


def predict_group(name: str, runs: Sequence[Run], noise_samples: int, noise_seed: int,
                  progress: Callable[[str], None] | None = None) -> GroupSeries:
    """Evaluate every run of a group at the epochs all of them have; the noise batch is drawn once and shared."""
    common = sorted(set.intersection(*(set(r.epochs()) for r in runs)))
    if not common:
        raise AnalysisError(f"group {name!r}: the runs share no checkpoint epoch "
                            f"({'; '.join(f'{r.path}: {r.epochs()[:3]}...' for r in runs[:2])})")
    predictors = [RunPredictor(r, noise_seed) for r in runs]
    noise = predictors[0].noise(noise_samples)
    preds, times, ranks = [], [], [[] for _ in predictors]
    for t, epoch in enumerate(common):
        row, tt = [], []
        for j, pr in enumerate(predictors):
            p, ts, per_rank = pr.predict(epoch, noise)
            if p.shape[-1] != len(pr.run.truth):
                raise AnalysisError(f"{pr.run.path}: the generator predicts {p.shape[-1]} parameters but the truth "
                                    f"has {len(pr.run.truth)}")
            row.append(p)
            tt.extend(ts)
            ranks[j].append(per_rank)
        preds.append(np.stack(row))
        times.append(float(np.mean(tt)))
        if progress is not None:
            progress(f"group {name}: epoch {epoch} ({t + 1}/{len(common)})")
    return GroupSeries(name, list(runs), runs[0].truth.copy(), np.asarray(common), np.asarray(times),
                       np.stack(preds), predictors[0].names, [np.stack(r) for r in ranks])


# ------------------------------------------------------------------------------------------------ p^ +- sigma
def independent_ranks(run: Run) -> bool:
    """The ranks of `--mode ensemble` train independent GANs (no exchange): each rank is a member of its own."""
    return run.mode == "ensemble"


def split_part(info: dict[str, Any]) -> tuple[int, int] | None:
    """(index, parts): the run's part of the data under ensemble.data=split (its rank 0's; the ranks of a --mode
    ensemble run hold index .. index + ranks - 1), from run.json; None where the data were not split."""
    if ((info.get("config") or {}).get("ensemble") or {}).get("data") != "split":
        return None
    sp = (info.get("reference_data") or {}).get("split")
    return (int(sp[0]), int(sp[1])) if isinstance(sp, list) and len(sp) == 2 else None


def disjoint_parts(runs: Sequence[Run]) -> bool:
    """Did the runs' members learn from disjoint parts of one data set, i.e. are they independent estimates? Only
    where every run is a part of one split: the same data and seed, the same number of parts (> 1), no part twice.
    (Separate split jobs deal their parts apart, so parts of two jobs overlap; one part of one is the whole set.)"""
    parts = [split_part(r.info) for r in runs]
    if any(p is None for p in parts) or len({p[1] for p in parts}) != 1 or parts[0][1] < 2:
        return False
    if len({data_identity(r) for r in runs}) != 1 or len({(r.info.get("config") or {}).get("seed") for r in runs}) > 1:
        return False
    taken = [i + k for r, (i, _) in zip(runs, parts)
             for k in range(len(r.checkpoints) if independent_ranks(r) else 1)]
    return len(taken) == len(set(taken))


def data_identity(run: Run) -> Any:
    """What makes two runs' reference data the same set: the file, or the seed and truth it was generated from."""
    env = (run.info.get("config") or {}).get("environment") or {}
    if env.get("data_file"):  # (its absolute path where run.json has it: a relative one names the launch's cwd)
        return ("file", (run.info.get("reference_data") or {}).get("file") or env["data_file"])
    return ("generated", (run.info.get("config") or {}).get("seed"), env.get("reference_events"),
            tuple(run.truth.tolist()))


def members_at(g: GroupSeries, t: int) -> tuple[np.ndarray, list[float | None]]:
    """The independent members of a group at time step t, (M, P), each averaged over the noise: every rank of a
    `--mode ensemble` run, every other run as one member (its ranks exchange, so they are one estimate); and the
    fraction of the data each member learns from (None: unknown)."""
    return _members(g.runs, [rp[t] for rp in g.rank_preds])


def _members(runs: Sequence[Run], rank_rows: Sequence[np.ndarray]) -> tuple[np.ndarray, list[float | None]]:
    rows, seen = [], []
    for run, rp in zip(runs, rank_rows):
        # what the ranks really kept (hvd trains every rank on all the data whatever the config says)
        f = run.info.get("reference_fraction",
                         ((run.info.get("config") or {}).get("environment") or {}).get("subset_fraction"))
        part = split_part(run.info)
        if f is not None and part is not None:
            f = f / part[1]  # a rank keeps f of its part: f / parts of the whole data set
        if independent_ranks(run):
            rows.extend(rp)
            seen.extend([None if f is None else stats.seen_fraction(f, 1)] * len(rp))
        else:
            rows.append(rp.mean(axis=0))
            seen.append(None if f is None else stats.seen_fraction(f, len(rp)))
    return np.stack(rows), seen


def rank_spread(g: GroupSeries, t: int) -> tuple[np.ndarray, int]:
    """The spread inside a run: the pooled sample standard deviation over each run's ranks at time step t (P,)
    (NaN when no run has two ranks), and the typical number of ranks per run."""
    return _rank_spread(g.truth, [rp[t] for rp in g.rank_preds])


def _rank_spread(truth: np.ndarray, rank_rows: Sequence[np.ndarray]) -> tuple[np.ndarray, int]:
    var = [rp.var(axis=0, ddof=1) for rp in rank_rows if len(rp) >= 2]
    n = int(round(np.mean([len(rp) for rp in rank_rows])))
    if not var:
        return np.full(truth.shape, np.nan), n
    return np.sqrt(np.mean(var, axis=0)), n


@dataclass
class FinalPrediction:
    """The group's last checkpoint evaluated on a larger noise batch than its series: the quoted p^ +- sigma."""

    epoch: int
    noise_samples: int
    rank_preds: list[np.ndarray]  #: per run, (R, P): each rank's prediction averaged over the noise
    sampling: np.ndarray          #: (P,) the Monte-Carlo error of p^ (stats.noise_sampling_error)
    fisher: np.ndarray | str | None = None  #: (P, P) the data's information per event at p^ (density
    #: environments), or why it could not be computed
    preconditioned: bool = False  #: the runs trained with environment.precondition=fisher
    options: bool = True  #: the environment has environment.precondition and g_start (stats.correlated_pairs)


def predict_final(g: GroupSeries, noise_samples: int, noise_seed: int) -> FinalPrediction:
    """Every run of the group at its last common epoch on `noise_samples` shared noise vectors, one run at a time
    (memory: one (K, P) array, whatever the number of runs)."""
    if noise_samples < 2:
        raise AnalysisError(f"--final-noise-samples {noise_samples}: at least 2 noise vectors are needed to estimate "
                            f"the Monte-Carlo error of p^")
    predictors = [RunPredictor(r, noise_seed) for r in g.runs]
    noise = predictors[0].noise(noise_samples)
    epoch, acc, ranks, weight = int(g.epochs[-1]), None, [], 0
    for pr in predictors:
        p, _, per_rank = pr.predict(epoch, noise)  # p: (K, P), the run's rank-averaged prediction per noise vector
        w = len(per_rank) if independent_ranks(pr.run) else 1  # p^ weighs members alike (`_members`)
        acc = w * p.astype(np.float64) if acc is None else acc + w * p
        weight += w
        ranks.append(per_rank)
    p_hat = (acc / weight).mean(axis=0)
    return FinalPrediction(epoch, noise_samples, ranks, stats.noise_sampling_error((acc / weight)[None]),
                           _fisher_at(predictors[0].env, p_hat), all(pr.preconditioned for pr in predictors),
                           hasattr(getattr(predictors[0].env, "cfg", None), "precondition"))


def _fisher_at(env, p: np.ndarray) -> np.ndarray | str | None:
    """The environment's per-event Fisher information at p (ParametricEnvironment's density form, or its simulator);
    None for an environment without one; a note where it could not be had (the check is advice only)."""
    fisher = getattr(env, "fisher", None)
    if not callable(fisher):
        return None
    if getattr(env, "pipeline_method", "density") == "density":
        skipped = ("the correlation check of the data's information was skipped: the density could not be "
                   "differentiated at p^, or is negative or not finite there")
    elif getattr(env, "event_width", 1) > MAX_COLUMNS:
        return (f"the data's information is estimated for events of up to {MAX_COLUMNS} columns, and this "
                f"simulator's have {env.event_width}: no correlation check and no Cramér-Rao bound, so σ has no floor "
                f"from the data (docs/analysis.md, \"What σ contains\")")
    else:
        skipped = ("the correlation check of the data's information was skipped: the simulator's events have no "
                   "finite derivative in p at p^, or are not finite there")
    try:
        f = fisher(p)
    except Exception:  # noqa: BLE001
        return skipped
    return skipped if f is None else f


def unfinished_status(info: dict, path: Path | None = None) -> str:
    """What run.json says of a run that did not complete, in a few words; for one still "running" (a kill from
    outside leaves that), how long ago it last wrote run.json or metrics.jsonl, for the user to judge."""
    status = info.get("status")
    if status == "stopped":
        return f"stopped at epoch {info.get('stopped_at_epoch')}: --resume continues it"
    if status == "failed":
        return f"failed: {info.get('error') or 'see its log'}"
    said = f"status {status}: still training, or killed"
    times = [f.stat().st_mtime for f in (Path(path) / "run.json", Path(path) / "metrics.jsonl")
             if f.is_file()] if path is not None else []
    if not times:
        return said
    age = max(0.0, time.time() - max(times))
    ago = f"{age:.0f} s" if age < 120 else f"{age / 60:.0f} min" if age < 7200 else f"{age / 3600:.1f} h"
    return f"{said}; its last record was written {ago} ago"


def group_uncertainty(g: GroupSeries, fraction: float = stats.DRIFT_FRACTION, final: FinalPrediction | None = None,
                      nonclosure: float | None = None) -> tuple[stats.Uncertainty, list[dict[str, Any]]]:
    """p^ +- sigma with its parts at the group's last checkpoint, and the convergence diagnostic (per parameter).
    With `final` (predict_final), p^, the members, the ranks and the noise's Monte-Carlo error come from its larger
    noise batch; the drift always comes from the series (one noise batch at every epoch, so its Monte-Carlo error
    does not move). `nonclosure` (bounds; None: the runs' analysis.nonclosure, `runs_nonclosure`) adds a systematic
    of the training to sigma (stats.nonclosure_part)."""
    t_last = len(g.epochs) - 1
    rows = final.rank_preds if final is not None else [rp[t_last] for rp in g.rank_preds]
    sampling = final.sampling if final is not None else stats.noise_sampling_error(g.preds[t_last])
    values, seen = _members(g.runs, rows)
    known = [f for f in seen if f is not None]
    f = float(np.mean(known)) if len(known) == len(seen) else None
    # one data set, in overlapping subsets; disjoint parts of it (every run split) are independent data
    split = disjoint_parts(g.runs)
    shared = len({data_identity(r) for r in g.runs}) == 1 and not split
    by_set = None
    if not shared and not split:  # several data sets: one member per data set
        values, seen, by_set = per_data_set(g.runs, values, seen)

    def p_hat_at(t: int) -> np.ndarray:  # p^ at time step t, as at the end (data sets of unequal members alike)
        v, sn = members_at(g, t)
        return (per_data_set(g.runs, v, sn)[0] if by_set else v).mean(axis=0)

    series = np.stack([p_hat_at(t) for t in range(len(g.epochs))])
    moved, _, _ = stats.drift(g.epochs, series, fraction)
    ranks, n_ranks = _rank_spread(g.truth, rows)
    names = g.names if g.names and len(g.names) == len(g.truth) else [f"r_{i}" for i in range(len(g.truth))]
    bound, notes = None, []
    if final is not None and isinstance(final.fisher, str):
        notes.append(final.fisher)
    elif final is not None and final.fisher is not None:
        notes.extend(stats.correlated_pairs(final.fisher, names, preconditioned=final.preconditioned,
                                            options=final.options))
        sizes = {(r.info.get("reference_data") or {}).get("events") for r in g.runs}
        n_events = sizes.pop() if len(sizes) == 1 and len(set(map(data_identity, g.runs))) == 1 else None
        bound = None if n_events is None else stats.cramer_rao(final.fisher, int(n_events))
    try:
        u = stats.uncertainty(values, ranks, n_ranks, moved, f, shared, sampling, bound=bound,
                              nonclosure=runs_nonclosure(g.runs) if nonclosure is None else nonclosure,
                              nonclosure_from="the runs' analysis.nonclosure" if nonclosure is None
                              else "--nonclosure", names=names)
    except ValueError as e:  # a non-closure that names a parameter this environment does not have
        raise AnalysisError(str(e)) from None
    u.notes.extend(notes + ([by_set] if by_set else []))
    if (u.cramer_rao is not None and u.spread_from == "members"
            and not (shared and (f is None or f >= 1.0))):  # members whose scatter holds the data's error
        # (the scatter's own estimate of the members' part, s x factor: with the bound in it, it is never below)
        u.notes.extend(stats.below_cramer_rao(names, u.scatter * u.factor, u.cramer_rao, u.n_members,
                                              options=final is None or final.options))
    if u.cramer_rao is not None and u.spread_from == "members":  # a spread of members far beyond the data's error
        # (the members' own sigma: a non-closure is not their spread)
        own = np.sqrt(np.maximum(u.sigma ** 2 - u.nonclosure ** 2, 0.0))
        u.notes.extend(stats.above_cramer_rao(names, own, u.cramer_rao))
    later = [r for r in g.runs if r.epochs() and r.epochs()[-1] > g.epochs[-1]]
    if later:  # runs of unequal length: all are taken at the last epoch they share (its later checkpoints unused)
        u.notes.append(f"p̂ ± σ is at epoch {int(g.epochs[-1])}, the last checkpoint all {len(g.runs)} runs share: "
                       + ", ".join(f"{r.path} (to epoch {r.epochs()[-1]})" for r in later[:3])
                       + (f" and {len(later) - 3} more" if len(later) > 3 else "")
                       + " trained longer, and their later checkpoints are not used here (analyse them apart)")
    unfinished = [r for r in g.runs if r.info.get("status") not in (None, "complete")]
    if unfinished:  # (sagips.run's statuses: running, stopped, failed, complete)
        u.notes.append(", ".join(f"{r.path} ({unfinished_status(r.info, r.path)})" for r in unfinished[:3])
                       + (f" and {len(unfinished) - 3} more" if len(unfinished) > 3 else "")
                       + f" did not complete: p̂ ± σ is at epoch {int(g.epochs[-1])}, not at the end of training")
    if u.spread_from == "members" and split:
        u.notes.append("the members learned from disjoint parts of one data set (ensemble.data=split): independent "
                       "estimates, so members = s/√M holds their statistical error and training noise exactly")
    # one run: its ranks' spread and the data's bound are weighed apart (the larger judges, stats.convergence)
    spread = u.ranks / np.sqrt(max(1, n_ranks)) if u.spread_from == "ranks" else u.spread
    corr = (stats.information_correlation(final.fisher) if final is not None and isinstance(final.fisher, np.ndarray)
            else None)
    return u, stats.convergence(names, g.epochs, series, spread, fraction, lower_bound=u.spread_from == "ranks",
                                floor=u.cramer_rao, correlation=corr,
                                advice=stats.drift_advice([r.info for r in g.runs]))


def job_uncertainty(run_dirs: Sequence[str | Path], noise_samples: int = 1024, final_noise_samples: int = 16384,
                    noise_seed: int = 0, nonclosure: float | None = None
                    ) -> tuple[GroupSeries, FinalPrediction, stats.Uncertainty, list[dict[str, Any]]]:
    """What `sagips.analyze RUN_DIR...` computes for its p^ +- sigma section, without the figures and the table: the
    runs (a job directory expands to its members) as one group, p^ +- sigma at the last common checkpoint on
    max(final_noise_samples, noise_samples) noise vectors, and the convergence diagnostic."""
    g = predict_group("job", [load_run(d) for d in expand_run_dirs(run_dirs)], noise_samples, noise_seed)
    final = predict_final(g, max(final_noise_samples, noise_samples), noise_seed)
    u, conv = group_uncertainty(g, final=final, nonclosure=nonclosure)
    return g, final, u, conv


def runs_nonclosure(runs: Sequence[Run]) -> float | dict[str, float]:
    """The runs' analysis.nonclosure (a number, or a mapping of parameter names to numbers; 0 for runs from before
    the option); one value, or AnalysisError."""
    given = [((r.info.get("config") or {}).get("analysis") or {}).get("nonclosure") for r in runs]
    values = {json.dumps(stats.nonclosure_normal(v), sort_keys=True) for v in given}
    if len(values) > 1:
        shown = "; ".join(stats.nonclosure_text(json.loads(v)) for v in sorted(values))
        raise AnalysisError(f"the runs of one ensemble were made with different analysis.nonclosure ({shown}): "
                            "give the one to apply with --nonclosure")
    return json.loads(values.pop()) if values else 0.0


#: the run end's series: metrics.jsonl's records (stats.convergence's `records`)
LOG_RECORDS = ("log records", "train.log_every")


def run_end_convergence(out_dir: str | Path, info: dict[str, Any], final_quality: dict[str, Any] | None,
                        names: Sequence[str] | None, env: Any = None) -> tuple[list[dict[str, Any]], str] | None:
    """The convergence diagnostic (`stats.convergence`) at the end of `sagips.run`, from what rank 0 has: the
    logged prediction p^ (metrics.jsonl `params`; the ranks' mean, or rank 0's in rma-arar-arar) and the ranks'
    final predictions (`rank_params` of the final quality). With `env`, the data's Cramér-Rao bound at the final p^
    enters as in sagips.analyze: it floors the members' part of sigma where the ranks are independent members
    (--mode ensemble), so that members far apart are not called converged (`stats.convergence`'s floor), and it
    judges the movement of a run of exchanging ranks. Returns (per parameter, what sigma is), or None where the
    environment logs no parameters or fewer than two epochs were logged."""
    from sagips.io.metrics import read_metrics

    path = Path(out_dir) / "metrics.jsonl"
    recs = [r for r in read_metrics(path) if isinstance(r.get("params"), list)] if path.is_file() else []
    if len(recs) < 2 or not final_quality:
        return None
    epochs = [int(r["epoch"]) for r in recs]
    series = np.asarray([r["params"] for r in recs], dtype=np.float64)
    # (unnamed parameters as analyze and analysis.nonclosure name them: r_0, r_1, ...)
    names = list(names) if names and len(names) == series.shape[1] else [f"r_{i}" for i in range(series.shape[1])]
    ranks = np.asarray(final_quality.get("rank_params") or [final_quality["params"]], dtype=np.float64)
    advice = stats.drift_advice([info])
    f = ((info.get("config") or {}).get("environment") or {}).get("subset_fraction")
    # a member of a job of several (--ensemble-size): its own ranks cannot judge it, the job's members can
    job = int(info.get("ensemble_members") or 1)
    unjudged = (f"the job's {job} members judge it: python -m sagips.analyze {Path(out_dir).parent}" if job > 1 else
                stats.UNJUDGED_ADVICE)
    if len(ranks) < 2:
        u = stats.uncertainty(ranks, np.full(series.shape[1], np.nan), 1, np.zeros(series.shape[1]), None, True)
        what = ("one rank: no spread to judge the movement against" if job < 2 else
                f"member {info.get('member', 0)} of {job}, one rank: no spread of its own to judge the movement "
                f"against")
        return (stats.convergence(names, epochs, series, u.spread, unjudged=unjudged, records=LOG_RECORDS,
                                  advice=advice), what)
    # the data's error (the Cramér-Rao bound at the final p^), where the environment knows its information
    n_events = (info.get("reference_data") or {}).get("events")
    fisher = (_fisher_at(env, np.asarray(final_quality["params"], dtype=np.float64))
              if env is not None and n_events else None)
    floor = stats.cramer_rao(fisher, int(n_events)) if isinstance(fisher, np.ndarray) else None
    floor = floor if floor is not None and len(floor) == series.shape[1] else None
    corr = stats.information_correlation(fisher) if floor is not None else None  # (valley partners move together)
    if str(info.get("mode")) == "ensemble":  # independent GANs: the ranks are the members, sigma as analyze's
        u = stats.uncertainty(ranks, np.full(series.shape[1], np.nan), 1, np.zeros(series.shape[1]),
                              None if f is None else stats.seen_fraction(f, 1), split_part(info) is None, bound=floor)
        what = f"σ: the error of the mean of {len(ranks)} independent ranks (sagips.analyze, docs/analysis.md)"
        if floor is not None:
            what += ", with the data's Cramér-Rao bound as its floor"
        return (stats.convergence(names, epochs, series, u.spread, unjudged=unjudged, records=LOG_RECORDS,
                                  advice=advice, floor=u.cramer_rao, correlation=corr), what)
    # replicas that exchange: one member, whose ranks' spread is training noise (a lower bound)
    u = stats.uncertainty(ranks.mean(axis=0, keepdims=True), stats.member_scatter(ranks), len(ranks),
                          np.zeros(series.shape[1]), None, True)
    what = (f"σ: the spread of the {len(ranks)} ranks' generators, training noise only; several members give "
            f"the full σ (sagips.analyze)")
    # That spread is a lower bound of σ (ranks that exchange gradients agree more than independent fits would):
    # a parameter that moved less than it has converged, one that moved more is not judged (stats.convergence).
    # A density knows its data's error (the Cramer-Rao bound at the final p^): judged against the larger of both.
    spread = u.spread
    if str(info.get("mode")) == "rma-arar-arar":  # the logged series is rank 0's generator, not the ranks' mean:
        spread = stats.member_scatter(ranks)  # its noise is one rank's, not the error of their mean
    if floor is not None:
        what += "; the data's Cramér-Rao bound where it is larger"
    return (stats.convergence(names, epochs, series, spread, lower_bound=True, floor=floor, unjudged=unjudged,
                              records=LOG_RECORDS, advice=advice, correlation=corr), what)
