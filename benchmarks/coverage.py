"""Calibration of sagips.analyze's p^ +- sigma (issue 36, item 4): pulls and coverage against a known truth.

    python benchmarks/coverage.py [--case smear1d toy1d proxy1d] [--replicas 20] [--members 4] [--commit]
    python benchmarks/coverage.py --workflow run --case smear1d toy1d proxy1d --replicas 5   # the floor untuned
    python benchmarks/coverage.py --page-only           # the page again, from the replicas' JSON
    python benchmarks/coverage.py --smoke --out DIR     # the whole pipeline in seconds (tests/test_coverage.py)
    python benchmarks/coverage.py --case smear1d --members 8 --set ensemble.data=split \
        --set environment.subset_fraction=1.0 --frozen-code --commit   # members on disjoint parts, from HEAD's code
    python benchmarks/coverage.py --case toy1d --replicas 1 --set environment.true_params.a=2.5 ...  # another truth
    python benchmarks/coverage.py --workflow run --case smear1d --replicas 3 --seed-offset 1000   # other training seeds
    python benchmarks/coverage.py --case toy1d --replicas 20 --data-seeds 2000   # other data sets (seeds 2000+k)
    python benchmarks/coverage.py --workflow run --run-mode ensemble --case smear1d --replicas 5  # the CLI's own mode

Any --set is passed to every training run (a profile of its own: CASE-PROFILEID-KKK.json); --set
environment.true_params.* also makes the data at that truth. --frozen-code runs the study from an export of HEAD
(benchmarks/frozen.py), so that edits of the working tree never reach a study that runs for hours.

For each case, at its fixed truth, K reference data sets (`python -m sagips.data CASE --seed 1000+k`), and on each
the workflow a user runs: one job of M members,

    mpiexec -n M python -m sagips.run --config CASE --mode ensemble --ensemble-size M \\
        --set environment.data_file=F --seed 1000+k
    python -m sagips.analyze RUN --out REPORT          # p^ +- sigma (docs/analysis.md, "What sigma contains")

and, on the same events, the maximum-likelihood fit with its own sigma from the Fisher information (the Hessian of
the negative log-likelihood at the fit): smear1d (the exponentially modified Gaussian, scipy.stats.exponnorm) and
toy1d (benchmarks/toy1d.py's unbinned fit and Fisher matrix). proxy1d's ML point comes from
benchmarks/loop_closure.py (a binned fit with the norm constraints), its sigma from the observed information in the
directions that keep the norms (loop_closure.ml_covariance; records from before it have none).

--workflow run (issue 36, item 3) asks instead whether one run, started as a new user starts it (M ranks of
rma-arar-arar on the environment's own defaults, no preset), ends at the data's floor: on the same data sets and ML
fits, its error in units of the ML sigma (records CASE-run-KKK.json, a table of its own on the page). --run-mode
ensemble runs it in sagips.run's default mode instead (M independent ranks, whose mean and spread analyze quotes).

Each replica writes DIR/coverage/CASE-KKK.json as it finishes (--commit: and commits that file alone); a rerun skips
the replicas whose JSON holds the same profile (resume). Stopping a study (Ctrl-C, or a kill's SIGTERM) stops its
running job and removes its work directory; the finished replicas stay. Each record also holds a digest of the
preset's settings: a rerun refuses to resume a profile whose preset changed since (move its records to a subfolder,
where the page shows them as superseded), and the summary leaves such a profile out. The page DIR/coverage.md is
generated whole from the JSON; notes by hand go to DIR/coverage.notes.md, which this script links and never writes.
The page opens with a summary: per case and workflow, the largest profile that ran today's defaults
(SAME_AS_DEFAULT, at_defaults).

Reported per parameter: the pull (p^ - p_true)/sigma (mean and width), the coverage of +-1 sigma and +-2 sigma, and the
ratio of the GAN's sigma to the ML sigma. Target: pull width 0.8-1.25, coverage of +-1 sigma 58-78 %.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import functools
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import jobs  # noqa: E402
from tests._mpirun import child_env, mpiexec  # noqa: E402
from tests._plugins import pythonpath, smear_site, toy_site  # noqa: E402
from sagips.analysis.stats import (P68, P95, compose_sigma, data_floor, effective_dof, nonclosure_part,  # noqa: E402
                                   nonclosure_factors, nonclosure_normal, nonclosure_terms, nonclosure_text,
                                   half_sampled, interval_factor, seen_fraction, split_scatter, spread_with_floor)
from sagips.analyze import _jsonable  # noqa: E402
from sagips.io import atomic  # noqa: E402

CASES = {  # case -> (--config, sagips.data environment name)
    "smear1d": ("smear1d:quick", "smear1d"),
    "toy1d": ("toy1d:quick", "toy1d"),
    "proxy1d": ("configs/proxy1d-quick.yaml", "proxy1d"),
}
#: --workflow run: the modes a run can take (the first is the default; a profile with another names it)
RUN_MODES = ("rma-arar-arar", "ensemble", "allreduce")
#: what analyze's sigma of one run is, per mode (docs/analysis.md, "What sigma contains")
SIGMA_OF_RUN = {"rma-arar-arar": "the ranks' spread / √R and the drift: a lower bound without the statistical error",
                "allreduce": "identical replicas: the drift, a lower bound",
                "ensemble": "the independent ranks' spread, as members on shared data"}
PULL_WIDTH = (0.8, 1.25)
COVER_1 = (0.58, 0.78)
SMOKE = {"replicas": 1, "members": 2, "noise_samples": 16,
         "set": ["environment.reference_events=4000", "environment.param_samples=8",
                 "environment.events_per_sample=20", "environment.hidden=16", "environment.layers=2",
                 "train.epochs=6", "train.checkpoint_every=2", "train.log_every=2", "train.state_every=6",
                 "train.quality_samples=16"]}
NOTES = "coverage.notes.md"
DATA_SEEDS = 1000  #: data set k of a study has seed DATA_SEEDS + k (--data-seeds)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--replicas", type=int, default=20, help="K reference data sets per case (default 20)")
    p.add_argument("--members", type=int, default=4, help="M members per replica (default 4)")
    p.add_argument("--workflow", choices=("ensemble", "run"), default="ensemble",
                   help="ensemble: M members of --mode ensemble on the case's preset (the calibration); run: the "
                        "floor without tuning (issue 36, item 3), one run as a new user starts it: M ranks of "
                        "rma-arar-arar (comm.inner_size 2) on the environment's own defaults (no preset; proxy1d: "
                        "make run's preset)"),
    p.add_argument("--run-mode", choices=RUN_MODES, default=RUN_MODES[0],
                   help="--workflow run: the mode of the run (default rma-arar-arar, as the docs' commands; "
                        "'ensemble' is sagips.run's own default: M independent ranks; allreduce: identical replicas)")
    p.add_argument("--noise-samples", type=int, default=1024, help="sagips.analyze --noise-samples")
    p.add_argument("--final-noise-samples", type=int, default=16384, help="sagips.analyze --final-noise-samples")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a sagips.run --set for every run")
    p.add_argument("--events", type=int, default=None, help="events per reference data set (default: the case's "
                   "environment.reference_events)")
    p.add_argument("--seed-offset", type=int, default=0, help="train with --seed 1000+k+OFFSET on data set k (seed "
                   "1000+k): the same data with other training noise (default 0: the data's seed)")
    p.add_argument("--data-seeds", type=int, default=DATA_SEEDS, metavar="BASE",
                   help=f"data set k has seed BASE+k (default {DATA_SEEDS}); another BASE draws other data sets, "
                        f"a profile of its own")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per training job")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="the page's folder")
    p.add_argument("--commit", action="store_true", help="git commit each replica's JSON as it finishes")
    p.add_argument("--smoke", action="store_true", help="a tiny profile: smear1d, 1 replica of 2 members, 6 epochs")
    p.add_argument("--page-only", action="store_true", help="only write the page from the JSON there is")
    p.add_argument("--frozen-code", action="store_true",
                   help="run from a copy of HEAD's committed code (runs/coverage/code-SHA, benchmarks/frozen.py), so "
                        "that edits of the working tree do not reach a study that runs for hours; the records and "
                        "the page still go to --out")
    a = p.parse_args(argv)
    if a.smoke:
        a.case, a.replicas, a.members, a.noise_samples = ["smear1d"], SMOKE["replicas"], SMOKE["members"], \
            SMOKE["noise_samples"]
        a.set = SMOKE["set"] + a.set
    if a.run_mode != RUN_MODES[0] and a.workflow != "run":
        p.error("--run-mode needs --workflow run (the ensemble workflow always runs --mode ensemble)")
    if a.replicas < 1 or a.members < 2:
        p.error("--replicas must be >= 1 and --members >= 2 (a spread needs two members)")
    return a


# ----------------------------------------------------------------------------------------------- the ML reference
def ml_smear1d(x: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unbinned ML fit of (tau, resolution) to the exponentially modified Gaussian; sigma from the NLL's Hessian."""
    from scipy import optimize, stats

    x = x.astype(np.float64)

    def nll(q):
        tau, res = q
        if tau <= 0 or res <= 0:
            return np.inf
        return -stats.exponnorm.logpdf(x, tau / res, loc=0.0, scale=res).sum()

    fit = optimize.minimize(nll, start, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-5}).x
    return fit, hessian_sigma(nll, fit)


def hessian_sigma(nll, p: np.ndarray) -> np.ndarray:
    """sqrt(diag(H^-1)) of the total negative log-likelihood's Hessian at p (central differences)."""
    n = len(p)
    h = 1e-4 * np.maximum(np.abs(p), 1e-2)
    H = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            ei, ej = np.eye(n)[i] * h[i], np.eye(n)[j] * h[j]
            H[i, j] = (nll(p + ei + ej) - nll(p + ei - ej) - nll(p - ei + ej) + nll(p - ei - ej)) / (4 * h[i] * h[j])
    return np.sqrt(np.diag(np.linalg.inv(H)))


def ml_reference(case: str, data_file: Path, truth: np.ndarray, env_cfg) -> dict:
    from sagips.io.refdata import read_reference

    if case == "smear1d":
        arrays, _ = read_reference(data_file, {"events": 1})
        p, s = ml_smear1d(arrays["events"][:, 0], truth)
        return {"p": p.tolist(), "sigma": s.tolist()}
    if case == "toy1d":
        from benchmarks import toy1d

        arrays, _ = read_reference(data_file, {"events": 1})
        x = arrays["events"][:, 0]
        bounds = [tuple(env_cfg.bounds[n]) for n in env_cfg.bounds]
        p = toy1d.ml_fit(x, bounds, truth)
        cov = np.linalg.inv(len(x) * toy1d.fisher(p))
        return {"p": p.tolist(), "sigma": np.sqrt(np.diag(cov)).tolist()}
    from benchmarks import loop_closure

    arrays, attrs = read_reference(data_file, {"events": 2})
    p = loop_closure.ml_fit(arrays["events"], attrs["norms"], env_cfg, truth * 1.01)
    cov = loop_closure.ml_covariance(arrays["events"], env_cfg, p)
    return {"p": p.tolist(), "sigma": np.sqrt(np.diag(cov)).tolist()}


# ----------------------------------------------------------------------------------------------- one replica
def profile(args: argparse.Namespace, case: str) -> dict:
    prof = {"case": case, "config": config_of(args, case), "members": args.members,
            "noise_samples": args.noise_samples, "set": list(args.set), "events": args.events}
    if args.workflow != "ensemble":  # (the ensemble profiles' ids stay those of the records made before it existed)
        prof["workflow"] = args.workflow
        if args.run_mode != RUN_MODES[0]:
            prof["run_mode"] = args.run_mode
    if args.seed_offset:
        prof["seed_offset"] = args.seed_offset
    if args.data_seeds != DATA_SEEDS:
        prof["data_seeds"] = args.data_seeds
    if started_apart(args, case):  # the default start from STARTED_APART_FROM on: a profile of its own
        prof["g_start"] = STARTED_APART
    if sized_by_default(args, case):  # events_per_sample=auto and 64 x 3 networks from SIZED_FROM on: the same
        prof["sized"] = SIZED
    if critic_scaled(case):  # the critic on the data's scale from CRITIC_SCALED_FROM on: the same
        prof["critic"] = CRITIC
    if point_by_default(args, case):  # a point generator (a simulator at lr_g 3e-4) from POINT_FROM on: the same
        prof["point"] = POINT
    if max(args.final_noise_samples, args.noise_samples) != args.noise_samples:  # (profiles from before it existed
        prof["final_noise_samples"] = max(args.final_noise_samples, args.noise_samples)  # had p^ on noise_samples)
    prof["id"] = hashlib.sha256(json.dumps(prof, sort_keys=True).encode()).hexdigest()[:12]
    return prof


def started_apart(args: argparse.Namespace, case: str) -> bool:
    """Whether the members start apart by the environment's default (a ParametricEnvironment case, no
    environment.g_start in --set): such profiles get ids and record names of their own, apart from the records
    that the same settings made, at the box's middle, before the default changed."""
    return case in PARAMETRIC and not any(s.startswith("environment.g_start=") for s in args.set)


def sized_by_default(args: argparse.Namespace, case: str) -> bool:
    """Whether a ParametricEnvironment case trains with the batch and networks of today's defaults
    (environment.events_per_sample=auto, 64 x 3), none of them named in --set."""
    keys = ("environment.events_per_sample=", "environment.hidden=", "environment.layers=")
    return case in PARAMETRIC and not any(s.startswith(keys) for s in args.set)


def point_by_default(args: argparse.Namespace, case: str) -> bool:
    """Whether a ParametricEnvironment case takes environment.noise_scale or train.lr_g from the defaults, which
    changed at POINT_FROM (to a generator of one point, a simulator's at 3e-4): then its profile is marked apart
    from those that ran before with the same --set. With both in --set, training does not depend on the defaults: no
    mark."""
    named = {s.split("=", 1)[0] for s in args.set}
    return case in PARAMETRIC and not set(POINT_KEYS) <= named


def restates(setting: str, default: str) -> bool:
    """Whether --set `setting` ("key=value") restates `default`: the same key and the same value as YAML reads it
    (environment.noise_scale=0.0 restates environment.noise_scale=0, train.lr_g=0.0003 restates train.lr_g=3e-4)."""
    from sagips.config import parse_set

    (k, a), (dk, b) = parse_set(setting), parse_set(default)
    if k != dk:
        return False
    try:  # (numbers compare as floats: YAML reads 3e-4 as a string, which the config coerces)
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def critic_scaled(case: str) -> bool:
    """Whether a case's critic sees events standardised by the rank's reference data, its first layer's kinks at
    them (every ParametricEnvironment from CRITIC_SCALED_FROM on; no setting turns it off)."""
    return case in PARAMETRIC


def config_of(args: argparse.Namespace, case: str) -> str | None:
    """--config of the training job: the case's preset, or none (the environment's defaults) for workflow run."""
    return CASES[case][0] if args.workflow == "ensemble" or case == "proxy1d" else None


def preset_digest(config: str | None) -> str | None:
    """A digest of the preset's settings (the YAML file's parsed contents, or an ENV:NAME preset's dict; not its
    comments), recorded in each replica: a profile's id names its --set, not the preset's contents, so a preset
    edited under a study would otherwise let a rerun resume, and the page pool, records of two settings. None where
    there is no preset or it cannot be read here (an ENV:NAME whose environment is not importable)."""
    if config is None:
        return None
    raw = preset_settings(config)
    if raw is None:
        return None
    raw = {k: v for k, v in raw.items() if k != "analysis"}  # (how analyze reads the runs: not what they trained)
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:12]


def preset_settings(config: str | None) -> dict | None:
    """The preset's parsed settings (YAML file or ENV:NAME), or None where there is none or it cannot be read here.
    A fresh copy each call (the parse is cached: the page asks per record and parameter)."""
    return copy.deepcopy(_preset_settings(config))


@functools.lru_cache(maxsize=None)
def _preset_settings(config: str | None) -> dict | None:
    from sagips.config import is_preset, load_yaml, preset

    if config is None:
        return None
    try:
        return preset(config) if is_preset(config) else load_yaml(str(ROOT / config))
    except Exception:  # noqa: BLE001 (an unknown environment, an unreadable file: not known here)
        return None


def nonclosure_of(r: dict) -> float | dict[str, float]:
    """The non-closure (a number of Cramér-Rao bounds, analysis.nonclosure) that analyze applies to a record's sigma
    now: the one its runs carried, or, for a record from before the option that ran a case's current preset (its
    digest, where recorded, the preset's today; not a superseded profile) at today's defaults, the preset's current
    analysis.nonclosure (so that records read as analyze reads new runs), and for one made under an earlier preset
    (EARLIER_PRESETS) at that preset's settings, its analysis.nonclosure; else 0. A number for every parameter, or a
    mapping of names to numbers."""
    if r["gan"].get("nonclosure") is not None:
        return nonclosure_normal(r["gan"]["nonclosure"])
    prof = r["profile"]
    cfg = prof.get("config")
    earlier = None if r.get("superseded") else earlier_preset(r)
    if cfg and earlier is not None and at_earlier_defaults(r, earlier):  # (what analyze applies to a run of it)
        return nonclosure_normal(earlier.get("analysis.nonclosure"))
    if not cfg or r.get("superseded") or not at_defaults(r["case"], prof) or (
            r.get("preset") and r["preset"] != preset_digest(cfg)):
        return 0.0
    return today_nonclosure(cfg)


def today_nonclosure(config: str | None) -> float | dict[str, float] | None:
    """The analysis.nonclosure of a preset today (0 where it has none, or there is no preset: the library's default);
    None where the preset cannot be read here (then each record's own applies)."""
    if config is None:
        return 0.0
    settings = preset_settings(config)
    if settings is None:
        return None
    return nonclosure_normal((settings.get("analysis") or {}).get("nonclosure"))


def stale_preset(rs: list[dict], digest: str | None) -> dict | None:
    """The first record of `rs` made with other preset settings than `digest` (both known) that did not train what
    `digest` trains (an earlier preset whose differences its --set restates did: `trained_as_today`), or None."""
    return next((r for r in rs if digest and r.get("preset") and r["preset"] != digest
                 and not (digest == preset_digest(r["profile"].get("config")) and trained_as_today(r))), None)


#: earlier presets, by the digest their records carry: the settings in which each differed from the preset of today
#: (`preset_digest`: analysis excluded; tests/test_coverage.py rebuilds each digest from today's file and these), and
#: the analysis.nonclosure it carried (None: a key the file did not have, the default then). A record made under one,
#: whose --set gives every such key today's value,
#: trained what today's preset trains (`trained_as_today`). proxy1d's preset trained the generator at 3e-4 on raw
#: events for 4,000 epochs until the forty-second session (the lead of coverage.notes.md is the preset since).
EARLIER_PRESETS = {"configs/proxy1d-quick.yaml": {
    "2e6825a91887": {"train.lr_g": 3e-4, "environment.d_scale": None, "train.epochs": 4000,
                     "analysis.nonclosure": 0.7}}}


def earlier_preset(r: dict) -> dict | None:
    """The EARLIER_PRESETS entry a record was made under, or None (a record from before digests were recorded, of a
    config with earlier presets: the latest of them, as the page read such records while it was today's; which
    preset it trained is not known, `trained_as_today`)."""
    known = EARLIER_PRESETS.get(r["profile"].get("config") or "", {})
    digest = r.get("preset")
    if digest is None and known:
        return list(known.values())[-1]
    return known.get(digest)


def at_earlier_defaults(r: dict, earlier: dict) -> bool:
    """Whether a record made under an earlier preset ran its settings: each training --set restates that preset's
    value of its key (analysis settings aside), and the rest of its profile is at the study's defaults (`at_defaults`
    without --set: the data's size, the noise batches)."""
    if not at_defaults(r["case"], dict(r["profile"], set=[])):
        return False
    now = preset_settings(r["profile"].get("config")) or {}
    for s in training_sets(r["profile"]):
        key = s.split("=", 1)[0]
        section, name = key.split(".", 1)
        value = earlier[key] if key in earlier else (now.get(section) or {}).get(name)
        if value is None or not restates(s, f"{key}={value}"):
            return False
    return True


def trained_as_today(r: dict) -> bool:
    """Whether a record trained what its preset trains today: made under today's preset, or under an earlier one
    (EARLIER_PRESETS) with --set giving each key in which it differed today's value (an analysis setting never
    changes training). A record from before digests were recorded: yes, unless its config has had earlier presets
    (then which one it trained is not known: no)."""
    cfg = r["profile"].get("config")
    today = preset_digest(cfg)
    if not r.get("preset"):
        return not EARLIER_PRESETS.get(cfg or "")
    if not cfg or not today or r["preset"] == today:
        return True
    diff = EARLIER_PRESETS.get(cfg, {}).get(r["preset"])
    if diff is None:
        return False
    now = preset_settings(cfg) or {}
    for key in (k for k in diff if not k.startswith("analysis.")):
        section, name = key.split(".", 1)
        value = (now.get(section) or {}).get(name)
        if value is None or not any(restates(s, f"{key}={value}") for s in r["profile"]["set"]):
            return False
    return True


def record_path(out: Path, args: argparse.Namespace, case: str, k: int) -> Path:
    """coverage/CASE-KKK.json for the case's preset; a workflow or --set settings of its own get a name of their own,
    so that a variant never overwrites the preset's records; --smoke's are CASE[-run]-smoke-KKK.json, so that a smoke
    test pointed at the real folder never overwrites a study's record."""
    tag = ("" if args.workflow == "ensemble" else f"-{args.workflow}") + (
        "-smoke" if args.smoke else f"-{profile(args, case)['id']}" if (
            args.set or args.seed_offset or args.data_seeds != DATA_SEEDS or started_apart(args, case)
            or args.run_mode != RUN_MODES[0]) else "")
    return out / "coverage" / f"{case}{tag}-{k:03d}.json"


def env_config(case: str, sets: list[str]):
    from sagips.config import load

    cfg = load(CASES[case][0] if case != "proxy1d" else str(ROOT / CASES[case][0]),
               [s for s in sets if s.startswith("environment.") or s.startswith("train.")]
               + ([] if case == "proxy1d" else [f"environment.name={case}"]))
    return cfg.environment


def replica(args: argparse.Namespace, case: str, k: int, work: Path, env: dict) -> dict:
    """Data, M members, sagips.analyze and the ML fit for replica k of `case`: the record of its JSON."""
    from sagips.analysis.ensemble import job_uncertainty, runs_nonclosure
    from sagips.data import main as data_main

    seed = args.data_seeds + k
    t0 = time.perf_counter()
    ecfg = env_config(case, args.set)
    data = work / f"{case}-{k:03d}.h5"
    events = args.events or int(ecfg.reference_events)
    data_args = [CASES[case][1], "--out", str(data), "--events", str(events), "--seed", str(seed), "--no-progress"]
    for s in args.set:  # another truth (--set environment.true_params.a=2.5) makes the data too
        if s.startswith("environment.true_params"):
            data_args += ["--set", s[len("environment."):]]
    if data_main(data_args) != 0:
        raise SystemExit(f"coverage: sagips.data {' '.join(data_args)} failed")
    run = work / f"{case}-{k:03d}-run"
    cfg = config_of(args, case)
    cmd = ["timeout", "--kill-after=10", str(args.timeout), mpiexec(), "-n", str(args.members), sys.executable, "-m",
           "sagips.run"] + (["--config", cfg] if cfg else ["--set", f"environment.name={case}"]) + (
           ["--mode", "ensemble", "--ensemble-size", str(args.members)] if args.workflow == "ensemble" else
           ["--mode", args.run_mode] + (["--set", "comm.inner_size=2"] if args.run_mode == "rma-arar-arar" else [])
    ) + [
           "--seed", str(seed + args.seed_offset), "--no-progress", "--output-dir", str(run), "--overwrite",
           "--set", f"environment.data_file={data}", "--set", "train.threads=1",
           "--set", "ensemble.analyze=false"]  # (the job's own analysis: this study's follows, with its settings)
    for s in args.set:
        cmd += ["--set", s]
    r = train(cmd, env)
    if r.returncode != 0:
        raise SystemExit(f"coverage: training of {case} replica {k} failed (exit {r.returncode}): "
                         f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
    # what sagips.analyze RUN computes for its p^ +- sigma section (the same functions, without its figures)
    g, final, u, conv = job_uncertainty([run], args.noise_samples, args.final_noise_samples)
    nonclosure = runs_nonclosure(g.runs)
    truth = g.truth
    ml = ml_reference(case, data, truth, ecfg)
    # the record holds what the page needs: the data and the run go now, so that a study of K replicas needs the
    # disk of one (proxy1d: ~70 MB a replica), not of K, in a TMPDIR that may be memory
    data.unlink()
    shutil.rmtree(run)
    return {"case": case, "replica": k, "seed": seed, "train_seed": seed + args.seed_offset,
            "profile": profile(args, case), "preset": preset_digest(cfg), "events": events,
            "subset_fraction": float(ecfg.subset_fraction),
            "names": [c["name"] for c in conv], "truth": truth.tolist(),
            "gan": {"p_hat": u.p_hat.tolist(), "sigma": u.sigma.tolist(), "members": u.members.tolist(),
                    "scatter": u.scatter.tolist(), "ranks": [None if not math.isfinite(x) else x for x in u.ranks],
                    "drift": u.drift.tolist(), "sampling": u.sampling.tolist(), "noise_samples": final.noise_samples,
                    "n_members": u.n_members, "factor": u.factor, "k68": u.k68, "k95": u.k95,
                    "spread_from": u.spread_from, "notes": u.notes, "nonclosure": nonclosure,
                    "cramer_rao": None if u.cramer_rao is None else u.cramer_rao.tolist()},
            "moving": [c["moving"] for c in conv],
            "ml": ml, "wall_s": round(time.perf_counter() - t0, 1), "code": os.environ.get("SAGIPS_FROZEN_CODE"),
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def judged_cell(row: dict) -> str:
    """The replicas analyze did not judge, beside those still moving (neither counts as settled)."""
    return f" (+{row['not_judged']} not judged)" if row.get("not_judged") else ""


def train(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run a replica's training job (benchmarks/jobs.py): a stopped study stops it and waits for it before its work
    directory goes."""
    return jobs.run_job(cmd, env, ROOT)


def commit(path: Path, message: str) -> None:
    rel, repo = path.name, path.resolve().parent  # (the repository of --out: with --frozen-code ROOT is an export)
    for _ in range(10):  # another engineer's commit may hold .git/index.lock for a moment
        if subprocess.run(["git", "add", rel], cwd=repo).returncode == 0 and subprocess.run(
                ["git", "commit", "-q", "-m", message, "--", rel], cwd=repo).returncode == 0:
            return
        time.sleep(3)
    print(f"coverage: could not commit {rel}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------- the page
def stats_of(recs: list[dict], nonclosure: float | dict[str, float] | None = None) -> list[dict]:
    """Per parameter: pulls of the GAN and of the ML fit, coverage, sigma ratio; sigma under each record's
    non-closure (`nonclosure_of`), or under `nonclosure` for all."""
    out = []
    for i, name in enumerate(recs[0]["names"]):
        t = np.array([r["truth"][i] for r in recs])
        p = np.array([r["gan"]["p_hat"][i] for r in recs])
        parts = [parts_now(r, i, nonclosure) for r in recs]
        s = np.array([x[0] for x in parts])
        pull = (p - t) / s
        # the intervals analyze quotes: +-k68 sigma and +-k95 sigma, Student's t with sigma's degrees of freedom,
        # recomputed here from each record's parts (records written before effective_dof held whole-sigma factors);
        # a spread that is the data's floor is not sampled (stats.Uncertainty.dof)
        dof = [float(effective_dof([smp], [sg], r["gan"]["n_members"], r["gan"]["spread_from"] == "members")[0])
               for r, (sg, _, _, smp) in zip(recs, parts)]
        k68 = np.array([interval_factor(P68, d) for d in dof])
        k95 = np.array([interval_factor(P95, d) for d in dof])
        fin = np.isfinite(pull)
        row = {"name": name, "n": len(recs), "pull_mean": float(np.nanmean(pull)),
               "pull_width_t": float(np.nanstd(t_normalised(pull[fin], np.array(dof)[fin]), ddof=1))
               if fin.sum() > 1 else None,
               "cover68": float(np.mean(np.abs(pull[fin]) <= k68[fin])),
               "cover95": float(np.mean(np.abs(pull[fin]) <= k95[fin])),
               "noise_over_sigma": float(np.median([r["gan"]["sampling"][i] / r["gan"]["sigma"][i] for r in recs]))
               if all("sampling" in r["gan"] for r in recs) else None,
               "pull_width": float(np.nanstd(pull, ddof=1)) if len(recs) > 1 else None,
               # the half-width of the pulls' central 68 %: a Gaussian's std, but robust to the heavy tails that
               # an honest sigma from M members has (Student's t with M - 1 degrees of freedom: std 1.73 at M = 4)
               "pull_width68": float(np.diff(np.nanpercentile(pull, [15.87, 84.13]))[0] / 2) if len(recs) > 1
               else None,
               "cover1": float(np.mean(np.abs(pull[fin]) <= 1)),
               "covered1": int(np.sum(np.abs(pull[fin]) <= 1)), "finite": int(fin.sum()),
               "cover2": float(np.mean(np.abs(pull[fin]) <= 2)),
               "moving": int(sum(bool(r["moving"][i]) for r in recs)),
               # None: analyze judged nothing (too few records, a valley partner still moving, members far apart,
               # no spread, or a movement beyond a lower bound of sigma)
               "not_judged": int(sum(r["moving"][i] is None for r in recs)), "ratio": None, "ml_pull_width": None,
               "gan_err_rms": float(np.sqrt(np.mean((p - t) ** 2))), "ml_err_rms": None}
        mls = [r["ml"] for r in recs]
        mp = np.array([m["p"][i] for m in mls])
        row["ml_err_rms"] = float(np.sqrt(np.mean((mp - t) ** 2)))
        if all(m["sigma"] is not None for m in mls):
            ms = np.array([m["sigma"][i] for m in mls])
            row["ratio"] = float(np.nanmedian(s / ms))
            row["ml_pull_width"] = float(np.std((mp - t) / ms, ddof=1)) if len(recs) > 1 else None
            # the reference's own coverage on the same data sets: what an exact sigma gives on this draw of them
            row["ml_cover1"] = float(np.mean(np.abs((mp - t) / ms)[fin] <= 1))  # (the data sets of cover1)
            row["typical"] = at_typical_data(t, p, s, mp, ms, np.array(dof))
            row["nonclosure_sq"] = nonclosure_sq(recs, i)
            row["nonclosure_sq_truth"] = nonclosure_sq(recs, i, against="truth")
        # (one value, unless records differ; as JSON, so that a mapping compares too)
        row["nonclosure"] = sorted({json.dumps(nonclosure_of(r) if nonclosure is None else nonclosure_normal(
            nonclosure), sort_keys=True) for r in recs})
        out.append(row)
    return out


def nonclosure_sq(recs: list[dict], i: int, against: str = "ml") -> float | None:
    """The square of the non-closure that parameter i's records measure, in Cramér-Rao bounds: the GAN's mean square
    error beyond its sigma (without any non-closure), with the ML fit on the same events as the reference, so that
    the data sets' own scatter drops out, mean((p^ - p_ML)^2 + sigma_ML^2 - sigma^2) / bound^2 (E (p^ - p_true)^2 =
    E (p^ - p_ML)^2 + sigma_ML^2 where the GAN's distance from the fit does not follow the fit's error; negative: sigma
    covers more than the error). None where a record has no bound or no ML sigma.

    against="truth": mean((p^ - p_true)^2 - sigma^2) / bound^2, as sagips.closure measures it, with the data sets'
    own scatter in it. The two differ beyond that scatter where the GAN's error grows with the fit's (slope b on it:
    by 2 (b - 1) sigma_ML^2 on average); the lead at 6,000 epochs along d had b ~1.4, ~0 against the ML fit and
    0.7-1.3 against the truth (coverage.notes.md, thirty-fourth session)."""
    sq, s0, b = [], [], []
    for r in recs:
        bound = (r["gan"].get("cramer_rao") or [None] * (i + 1))[i]
        ms = (r["ml"].get("sigma") or [None] * (i + 1))[i]
        if not bound or ms is None:
            return None
        sq.append((r["gan"]["p_hat"][i] - r["truth"][i]) ** 2 if against == "truth"
                  else (r["gan"]["p_hat"][i] - r["ml"]["p"][i]) ** 2 + ms ** 2)
        s0.append(sigma_now(r, i, 0.0))
        b.append(bound)
    return float(np.mean(nonclosure_terms(np.array(sq), np.array(s0), np.array(b))))


def nonclosure_line(rows: list[dict]) -> str | None:
    """The page's line under a profile's table: the non-closure its data sets measure (per parameter and pooled over
    the parameters, `nonclosure_sq`) and the one applied to its sigma."""
    sq = [r.get("nonclosure_sq") for r in rows]
    if any(x is None for x in sq):
        return None
    def root(x): return f"{math.sqrt(x):.2f}" if x > 0 else f"0 ({x:+.2f} in its square)"
    applied = rows[0]["nonclosure"]
    def shown(v): return nonclosure_text(json.loads(v))
    truth = [r.get("nonclosure_sq_truth") for r in rows]
    return ("Non-closure measured here (the GAN's error beyond σ without one, in Cramér-Rao bounds: "
            "√mean((p̂ − p_ML)² + σ_ML² − σ²)/bound): " + ", ".join(f"{r['name']} {root(x)}" for r, x in zip(rows, sq))
            + f"; over all parameters {root(float(np.mean(sq)))}"
            + ("" if any(x is None for x in truth) else
               "; against the truth as sagips.closure measures it (√mean((p̂ − p_true)² − σ²)/bound, the data sets' "
               "own scatter in it; above the first where the GAN's error grows faster than the ML fit's): "
               + ", ".join(f"{r['name']} {root(x)}" for r, x in zip(rows, truth))
               + f"; over all parameters {root(float(np.mean(truth)))}")
            + ". Applied to σ above: "
            + (f"{shown(applied[0])} bounds (analysis.nonclosure)" if len(applied) == 1 else
               "varies by record (" + "; ".join(map(shown, applied)) + " bounds)") + ".")


def typical_cell(typ: dict | None) -> str:
    return "" if typ is None else f"{typ['slope']:.2f}, {typ['width_t']:.2f}, {100 * typ['cover1']:.0f} %"


def at_typical_data(t, p, s, mp, ms, dof) -> dict | None:
    """The pulls' t-normalised width and coverage of +-1 sigma on data sets that scatter as independent ones do: a
    model, not a measurement. K data sets can scatter little by chance (proxy1d's first 40 along u: the ML fit's own
    pulls 0.72 wide, where 444 data sets give 0.98), and an honest sigma's pulls then do too. In the ML fit's sigma,
    the GAN's error is regressed on the ML fit's over the data sets (e_GAN = b e_ML + a + r); the ML errors are then
    made those of typical data sets (standardised: mean 0, width 1), each GAN estimate rebuilt with the fitted slope,
    offset and its own residual, and its pull taken with its own sigma and degrees of freedom. None below 5 data
    sets, or where a value is not finite."""
    e_ml, e_gan = (mp - t) / ms, (p - t) / ms
    if len(t) < 5 or not (np.all(np.isfinite(e_ml)) and np.all(np.isfinite(e_gan)) and np.all(np.isfinite(s))):
        return None
    b, a = np.polyfit(e_ml, e_gan, 1)
    r = e_gan - (b * e_ml + a)
    z = (e_ml - e_ml.mean()) / e_ml.std(ddof=1)
    pull = ms * (b * z + a + r) / s
    return {"slope": float(b), "offset": float(a), "width_t": float(np.std(t_normalised(pull, dof), ddof=1)),
            "cover1": float(np.mean(np.abs(pull) <= 1))}


def t_normalised(pull: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """The pulls mapped to a unit Gaussian through Student's t with each sigma's degrees of freedom (the probability
    integral transform, z = Phi^-1(F_t(pull))): N(0, 1) for an exact sigma whatever M is, where the pulls themselves
    have the std sqrt(d / (d - 2)) of Student's t (1.73 at M = 4). The target's pull width is judged on their std."""
    from scipy import stats as st

    return np.sign(pull) * st.norm.isf(st.t.sf(np.abs(pull), dof))


FLOOR_MARGIN = 1.5  # "at its floor": rms error within 1.5x the run's statistical floor sigma_ML / sqrt(seen)


#: the commit from which a density environment (toy1d) trains with the Fisher preconditioner by default
PRECONDITIONED_FROM = "c0096a6"
#: the commit from which a ParametricEnvironment's members start apart by default (environment.g_start 0.8)
STARTED_APART_FROM = "97ff486"
STARTED_APART = 0.8
#: the commit from which a ParametricEnvironment sizes its synthetic batch from the data
#: (environment.events_per_sample=auto) and has networks of 64 x 3 (was 100 events, 128 x 4)
SIZED_FROM = "6aac2a4"
SIZED = "events_per_sample=auto, 64x3"
#: the commit from which a ParametricEnvironment's critic sees standardised events with kinks at them
CRITIC_SCALED_FROM = "6ac22ee"
CRITIC = "data's scale, kinks at the events"
#: the commit from which a ParametricEnvironment's generator predicts one point (environment.noise_scale 0, was 0.01)
#: and trains at train.lr_g 3e-4 (was 1e-3, the critic's rate)
POINT_FROM = "a42842f"
POINT = "noise_scale=0; a simulator at lr_g=3e-4"
#: the --set settings that restate it
POINT_SET = {"smear1d": ("environment.noise_scale=0", "train.lr_g=3e-4"),  # a simulator
             "toy1d": ("environment.noise_scale=0", "train.lr_g=1e-3")}  # a density (its rate did not change)
POINT_KEYS = tuple(s.split("=", 1)[0] for s in POINT_SET["smear1d"])
#: the cases whose environment is a ParametricEnvironment (they have environment.g_start)
PARAMETRIC = ("smear1d", "toy1d")


def code_of(rs: list[dict]) -> str:
    """The commits a profile's replicas ran from (--frozen-code), or that they ran from a working tree."""
    shas = sorted({r["code"][:7] for r in rs if r.get("code")})
    if not shas:
        return "code: a working tree (no commit recorded)"
    tree = any(not r.get("code") for r in rs)
    return f"code: commit{'s' if len(shas) > 1 else ''} {', '.join(shas)}" + (" and a working tree" if tree else "")


def seeds_of(prof: dict) -> str:
    """A heading's note of data seeds other than 1000+k (--data-seeds) and training seeds apart from the data's
    (--seed-offset)."""
    base = prof.get("data_seeds", DATA_SEEDS)
    return ((f", data seeds {base}+k" if base != DATA_SEEDS else "")
            + (f", training seed {base}+k+{prof['seed_offset']}" if prof.get("seed_offset") else ""))


def defaults_of(prof: dict) -> str:
    """The heading's words for the defaults a ParametricEnvironment profile ran, each a profile of its own."""
    return "".join(text for key, text in (("g_start", ", members started apart (the default)"),
                                          ("sized", ", batch sized from the data (the default)"),
                                          ("critic", ", critic on the data's scale (the default)"),
                                          ("point", ", a generator of one point (the default)"))
                   if key in prof)


def floor_table(case: str, pid: str, prof: dict, rs: list[dict], label: str = "") -> list[str]:
    """Workflow run (issue 36, item 3): how far one untuned run ends from the truth, in units of the data's own ML
    error, against the floor of a run whose ranks keep subset_fraction f each (sigma_ML / sqrt(seen))."""
    ranks = int(prof["members"])
    fraction, floor = run_floor(prof, rs)
    mode = prof.get("run_mode", RUN_MODES[0])
    lines = [f"## {case}: the floor without tuning (profile {pid}: one run of {ranks} ranks, {mode}, "
             f"{'the preset ' + prof['config'] if prof['config'] else 'the environment defaults, no preset'}"
             f"{', settings ' + ' '.join(prof['set']) if prof['set'] else ''}"
             f"{defaults_of(prof)}{seeds_of(prof)}){label}", "",
             f"{len(rs)} data set(s); {sum(r['wall_s'] for r in rs) / 60:.1f} min in all; {code_of(rs)}. "
             f"Error = (p̂ − p_true) in units of the ML fit's σ on the same events (a profile with a record "
             f"without it: the ML fits' rms error over the data sets). A run "
             f"of {ranks} ranks keeping {fraction:g} of the data each has the floor {floor:.2f} (σ_ML/√seen, "
             f"docs/analysis.md); 'at its floor' means an rms error within {FLOOR_MARGIN}× that. ±1σ: how often "
             f"analyze's σ for the run covered the truth ({SIGMA_OF_RUN[mode]}).", "",
             "| parameter | K | rms error GAN | rms error ML | max abs error GAN | GAN − ML (rms) | ±1σ | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in floor_rows(prof, rs):
        lines.append(f"| {row['name']} | {len(rs)} | {row['rms']:.2f} | {row['ml_rms']:.2f} | {row['max']:.2f} | "
                     f"{row['gan_ml']:.2f} | {row['cover1']} | {row['verdict']} |")
    return lines + [""]


def run_floor(prof: dict, rs: list[dict]) -> tuple[float, float]:
    """A workflow-run profile's data fraction per rank and its floor sigma_ML / sqrt(seen), in units of sigma_ML."""
    from sagips.analysis.stats import seen_fraction

    fraction = rs[0].get("subset_fraction", 0.5)  # (records from before it was recorded: the default 0.5)
    return fraction, 1.0 / math.sqrt(seen_fraction(fraction, int(prof["members"])))


def floor_rows(prof: dict, rs: list[dict], nonclosure: float | dict[str, float] | None = None) -> list[dict]:
    """Per parameter of a workflow-run profile: the rms error of the GAN and of the ML fit, the largest GAN error
    and the rms GAN - ML distance, in units of the ML sigma; and the verdict against the run's floor (+-1 sigma
    under each record's non-closure, or under `nonclosure` for all)."""
    floor = run_floor(prof, rs)[1]
    rows = []
    for i, name in enumerate(rs[0]["names"]):
        t = np.array([r["truth"][i] for r in rs])
        p = np.array([r["gan"]["p_hat"][i] for r in rs])
        mp = np.array([r["ml"]["p"][i] for r in rs])
        if all(r["ml"]["sigma"] is not None for r in rs):
            unit = np.array([r["ml"]["sigma"][i] for r in rs])
        else:
            unit = np.full(len(rs), math.sqrt(np.mean((mp - t) ** 2)))
        g, m, d = (p - t) / unit, (mp - t) / unit, (p - mp) / unit
        rms = float(np.sqrt(np.mean(g ** 2)))
        verdict = ("at its floor" if rms <= FLOOR_MARGIN * floor else "above its floor") + (
            f" (provisional, K = {len(rs)})" if len(rs) < 5 else "")
        s = np.array([sigma_now(r, i, nonclosure) for r in rs])
        covered = int(np.sum(np.abs(p - t) <= s))  # (a sigma of 0 or nan covers nothing)
        rows.append({"name": name, "rms": rms, "ml_rms": float(np.sqrt(np.mean(m ** 2))),
                     "cover1": f"{covered} of {len(rs)}",
                     "max": float(np.max(np.abs(g))), "gan_ml": float(np.sqrt(np.mean(d ** 2))), "verdict": verdict})
    return rows


def sigma_now(r: dict, i: int, nonclosure: float | dict[str, float] | None = None) -> float:
    """sigma of parameter i of a record under analyze's current rule (`parts_now`)."""
    return parts_now(r, i, nonclosure)[0]


def parts_now(r: dict, i: int, nonclosure: float | dict[str, float] | None = None
              ) -> tuple[float, float, bool, float]:
    """(sigma, its spread part, floored, the spread's part sampled from the members) of parameter i of a record under
    analyze's current rule (sagips.analysis.stats: the record's Cramér-Rao bound, where it has one, splits the
    members' scatter or floors it; the drift where the parameter still moves; the non-closure, `nonclosure_of` or
    `nonclosure` bounds), from the record's parts (records from before `drift_in_sigma` always added the drift; those
    from before the noise part have none). Records without a part: their sigma as written."""
    g = r["gan"]
    bound = (g.get("cramer_rao") or [None] * (i + 1))[i]
    floored, sampled = False, None
    drift = g["drift"][i] or 0.0
    mc = (g.get("sampling") or [0.0] * (i + 1))[i] or 0.0
    f = r.get("subset_fraction")
    if g["spread_from"] == "members":
        spread = g["members"][i]
        spread = math.nan if spread is None else spread
        if bound is not None:
            shared = "ensemble.data=split" not in (r["profile"].get("set") or [])
            holds = not (shared and (f is None or f >= 1.0))
            if half_sampled(f, shared) and g.get("scatter") is not None:
                sp, low, smp = split_scatter(np.array([g["scatter"][i]]), np.array([bound]), f, g["n_members"])
                sampled = float(smp[0])
            else:
                sp, low = spread_with_floor(np.array([spread]), data_floor(np.array([bound]), f, g["n_members"],
                                                                           shared), holds)
            spread, floored = float(sp[0]), bool(low[0])
        elif spread != spread:
            spread = 0.0
    elif g["spread_from"] == "ranks" and bound is not None and g["ranks"][i] is not None:
        n = int(r["profile"]["members"])  # the run's ranks
        seen = None if f is None else seen_fraction(f, n)
        spread = float(spread_with_floor(np.array([g["ranks"][i] / math.sqrt(n)]),
                                         data_floor(np.array([bound]), seen, 1, True), False)[0][0])
    else:
        return g["sigma"][i] or math.nan, math.nan, False, math.nan
    f = nonclosure_factors(nonclosure_of(r) if nonclosure is None else nonclosure, r.get("names"),
                           len(g["p_hat"] if "p_hat" in g else g["drift"]))[i]  # (this parameter's, in bounds)
    nc = nonclosure_part(float(f), None if bound is None else np.array([bound]))
    sigma = compose_sigma(np.array([spread]), np.array([drift]), np.array([mc]), g["spread_from"] == "members",
                          nc, None if bound is None else np.array([bound]))[0]
    if sampled is None:  # (a floor that replaced the members' part is known, not sampled)
        sampled = 0.0 if floored else (g["members"][i] or 0.0) if g["spread_from"] == "members" else spread
    return float(sigma[0]) or math.nan, spread, floored, sampled


def expected(members: int) -> dict:
    """What the pulls of an exact sigma from M members look like: Student's t with M - 1 degrees of freedom."""
    from scipy import stats as st

    d = members - 1
    return {"std": math.sqrt(d / (d - 2)) if d > 2 else math.inf, "hw68": float(st.t.ppf(0.5 + P68 / 2, d)),
            "cover1": float(st.t.cdf(1, d) - st.t.cdf(-1, d)), "cover2": float(st.t.cdf(2, d) - st.t.cdf(-2, d))}


def _f(x, spec):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def calibration_verdict(row: dict) -> str:
    """met / missed against the target (pull width and coverage of +-1 sigma); provisional below the issue's K = 20.
    A width that misses where the ML fit's own pulls on the same data sets (row["ml_pull_width"]) miss it too, on the
    same side, says so: those data sets scatter little (or much) whatever the fit; so does a coverage that misses
    where the ML fit's own +-1 sigma_ML on them (row["ml_cover1"]) misses on the same side."""
    width_ok = row["pull_width_t"] is not None and PULL_WIDTH[0] <= row["pull_width_t"] <= PULL_WIDTH[1]
    cover_ok = COVER_1[0] <= row["cover1"] <= COVER_1[1]
    if row["n"] < 20:  # the issue's K >= 20: fewer is a provisional reading either way
        return f"provisional ({'within' if width_ok and cover_ok else 'outside'} the target at K = {row['n']})"
    if width_ok and cover_ok:
        return "met"
    notes = []
    ml = row.get("ml_pull_width")
    if not width_ok and row["pull_width_t"] is not None and ml is not None and not (
            PULL_WIDTH[0] <= ml <= PULL_WIDTH[1]) and (ml < PULL_WIDTH[0]) == (row["pull_width_t"] < PULL_WIDTH[0]):
        notes.append(f"width; the ML fit's pulls on these data sets: {ml:.2f}")
    elif not width_ok:
        notes.append("width")  # (a miss the ML fit does not share: named beside one it does)
    mc = row.get("ml_cover1")
    if not cover_ok and mc is not None and not (COVER_1[0] <= mc <= COVER_1[1]) and (
            (mc < COVER_1[0]) == (row["cover1"] < COVER_1[0])):
        notes.append(f"±1σ; the ML fit's own ±1σ_ML covers {100 * mc:.0f} % of these data sets")
    elif not cover_ok:
        notes.append("±1σ")
    if all(n in ("width", "±1σ") for n in notes):  # nothing that the data sets' draw explains
        return "missed"
    typ = row.get("typical")
    if typ:
        notes.append(f"on typical data sets, a model: width {typ['width_t']:.2f}, ±1σ {100 * typ['cover1']:.0f} %")
    return f"missed ({'; '.join(notes)})"


#: per case, the --set settings that only restate a default of today's code (a profile with them, or with none of
#: its own, ran the shipped defaults; tests/test_coverage.py checks each against the library; an analysis setting
#: never changes training, and the summary reads every record under today's analysis.nonclosure)
#: (proxy1d's preset trains the lead of coverage.notes.md since the forty-second session, which its profiles ran by
#: --set on the earlier preset, EARLIER_PRESETS; the earlier preset trained the generator at 3e-4, and before the
#: twenty-fourth session at 1e-3: those records, with no --set, are superseded in coverage/preset_lr_g1e-3/)
SAME_AS_DEFAULT = {"smear1d": (f"environment.g_start={STARTED_APART}", *POINT_SET["smear1d"]),
                   "toy1d": (f"environment.g_start={STARTED_APART}", "environment.precondition=fisher",
                             *POINT_SET["toy1d"]),
                   "proxy1d": ("train.lr_g=1e-3", "environment.d_scale=data", "train.epochs=6000")}


def training_sets(prof: dict) -> list[str]:
    """A profile's --set less what never changes training (analysis settings)."""
    return [s for s in prof["set"] if not s.startswith("analysis.")]


def at_defaults(case: str, prof: dict) -> bool:
    """Whether a profile ran what a user gets today: no setting apart from restated defaults (nor another data size
    or noise batch of the study), the members started apart (a ParametricEnvironment: by the default, which implies
    code from after the preconditioner became the default, or by --set), for toy1d the Fisher preconditioner (by
    --set, or by that same code), and, for a ParametricEnvironment, the batch sized from the data with networks of
    64 x 3 (code from SIZED_FROM on, nothing of them in --set), and a generator of one point at lr_g 3e-4 (code from
    POINT_FROM on, or both restated in --set)."""
    if any(not any(restates(s, d) for d in SAME_AS_DEFAULT.get(case, ())) for s in training_sets(prof)):
        return False
    d = parse_args([])  # the study's own defaults: the data's size, and p^ on the final noise batch
    if prof.get("events") is not None or prof["noise_samples"] != d.noise_samples or prof.get(
            "final_noise_samples", prof["noise_samples"]) != max(d.final_noise_samples, d.noise_samples):
        return False
    if case not in PARAMETRIC:
        return True
    by_default = "g_start" in prof
    if not (by_default or f"environment.g_start={STARTED_APART}" in prof["set"]):
        return False
    if "sized" not in prof or "critic" not in prof:  # before the batch was sized, or the critic scaled, by the data
        return False
    named = {s.split("=", 1)[0] for s in training_sets(prof)}  # (each restates a default: checked above)
    if "point" not in prof and not set(POINT_KEYS) <= named:  # before POINT_FROM: a
        return False  # generator spread over its noise, at the critic's rate
    return case != "toy1d" or by_default or "environment.precondition=fisher" in prof["set"]


def settings_of(prof: dict) -> str:
    """A profile's training settings: less its data seeds and its analysis settings. Profiles that differ only in
    the data sets they drew (--data-seeds) are one calibration on more data sets, and those that differ only in how
    analyze read them (analysis.nonclosure) one training: the summary pools them, and reads every record under
    today's analysis.nonclosure."""
    return json.dumps(dict({k: v for k, v in prof.items() if k not in ("id", "data_seeds")},
                           set=training_sets(prof)), sort_keys=True)


def pooled(rs: list[dict]) -> list[dict]:
    """One record per data seed, in the seeds' order (studies whose seed ranges overlap drew some data sets twice:
    the first given counts)."""
    seen: set[int] = set()
    return sorted((r for r in rs if not (r["seed"] in seen or seen.add(r["seed"]))), key=lambda r: r["seed"])


def summary(recs: list[dict]) -> list[str]:
    """The page's first section: per case and workflow, the largest calibration among those that ran today's
    defaults (a profile, or profiles that differ only in their data seeds or analysis settings, pooled; a record
    made under an earlier preset counts where its --set restates today's, `trained_as_today`), in one line per
    parameter (or 'not measured'), sigma under the preset's analysis.nonclosure of today."""
    from scipy.stats import binomtest, chi2

    per_profile: dict[str, list[dict]] = {}
    for r in recs:
        per_profile.setdefault(r["profile"]["id"], []).append(r)
    by: dict[tuple, list[dict]] = {}
    for rs in per_profile.values():
        if not all(trained_as_today(r) for r in rs):  # the preset changed since (and --set does not restate it):
            continue  # a profile of its own, dropped before pooling, so that it never hides a current one
        wf = rs[0]["profile"].get("workflow", "ensemble")
        wf += f":{rs[0]['profile']['run_mode']}" if rs[0]["profile"].get("run_mode") else ""
        by.setdefault((rs[0]["case"], wf, settings_of(rs[0]["profile"])), []).extend(rs)
    by = {key: pooled(rs) for key, rs in by.items()}
    best: dict[tuple, list[dict]] = {}
    for (case, wf, _), rs in by.items():
        if at_defaults(case, rs[0]["profile"]) and len(rs) > len(best.get((case, wf), [])):
            best[case, wf] = rs

    def ensemble_cells(rs):  # (sigma as analyze gives it today: under the preset's analysis.nonclosure)
        for row in stats_of(rs, today_nonclosure(rs[0]["profile"].get("config"))):
            ratio = row["gan_err_rms"] / row["ml_err_rms"] if row["ml_err_rms"] else float("nan")
            cover = "n/a"
            if row["finite"]:  # (a pull is not finite where sigma is 0: the interval counts the finite ones)
                ci = binomtest(row["covered1"], row["finite"]).proportion_ci(0.95, "exact")
                of = "" if row["finite"] == row["n"] else f"; {row['finite']} finite"
                cover = f"{100 * row['cover1']:.0f} % ({100 * ci.low:.0f}–{100 * ci.high:.0f}{of})"
            ml_cover = "n/a" if row.get("ml_cover1") is None else f"{100 * row['ml_cover1']:.0f} %"
            width = _f(row["pull_width_t"], ".2f")
            if row["pull_width_t"] is not None and row["finite"] > 2:  # its 95 % interval, for Gaussian pulls
                k = row["finite"] - 1
                lo, hi = (row["pull_width_t"] * math.sqrt(k / chi2.ppf(q, k)) for q in (0.975, 0.025))
                width += f" ({lo:.2f}–{hi:.2f})"
            yield (row["name"], row["n"], f"{row['pull_mean']:+.2f}", width,
                   _f(row["pull_width"], ".2f"), _f(row["ml_pull_width"], ".2f"), cover, ml_cover,
                   f"{ratio:.2f}", calibration_verdict(row))

    def run_cells(rs):  # (as ensemble_cells: sigma under the preset's analysis.nonclosure of today)
        for row in floor_rows(rs[0]["profile"], rs, today_nonclosure(rs[0]["profile"].get("config"))):
            yield row["name"], len(rs), f"{row['rms']:.2f}", f"{row['ml_rms']:.2f}", row["cover1"], row["verdict"]

    lines = ["## Summary: what today's defaults give", "",
             "Per case, the profile with the most data sets among those that ran today's defaults (sections below); "
             "profiles that differ only in their data seeds (`--data-seeds`) are one calibration on more data sets, "
             "and those that differ only in how analyze read them (`analysis.nonclosure`) one training: both are "
             "pooled here (their ids joined by +, one record per data seed), and σ is recomputed under the preset's "
             "`analysis.nonclosure` of today (each profile's section below keeps the one its runs carried); a "
             "profile made under an earlier preset counts where its --set restates today's. "
             "Pulls are in units of the GAN's own σ; the errors of the GAN and of the ML fit on the same events in "
             "units of the ML fit's σ, or as their ratio. Beside the coverage of ±1σ, its 95 % interval "
             "(Clopper–Pearson, from K data sets): a verdict whose interval holds the target's 68 % is not yet a "
             "clear miss; and the ML fit's own coverage of ±1σ_ML on the same data sets (ML ±1σ), what an exact σ "
             "covers on this draw of them (a verdict that misses as it does, on the same side, says so). Beside "
             "the pull width, its 95 % interval (χ² with K − 1 degrees of freedom), and the width "
             "of the ML fit's own pulls (p_ML − p_true)/σ_ML on the same data sets: where the data sets happen to "
             "scatter little (or much), an honest σ's pulls do too. Where a width or a coverage misses as the ML "
             "fit's does, the verdict adds a model of what data sets of the usual scatter would give: the GAN's error regressed on the ML "
             "fit's over the data sets, the ML errors standardised (`at_typical_data`; the sections below show it "
             "for every parameter). It is an estimate, not a measurement: more data sets are the measurement.", ""]
    for wf, intro, head, cells in (
            ("ensemble", "**An ensemble of M members** (`--mode ensemble --ensemble-size M`, the case's preset; the "
             "issue's workflow):", "M | pull mean | pull width (t-normalised) | pull std | ML pull width | ±1σ | "
             "ML ±1σ | rms error GAN / ML",
             ensemble_cells),
            ("run", "**One run** as a new user starts it (`--workflow run`: M ranks of rma-arar-arar, the "
             "environment's own defaults), against its statistical floor; ±1σ with analyze's σ for the run, "
             "a lower bound:", "ranks | rms error GAN | rms error ML | ±1σ", run_cells),
            ("run:ensemble", "**One run in sagips.run's default mode** (`--workflow run --run-mode ensemble`: M "
             "independent ranks, the environment's own defaults, p̂ their mean), against the same floor; ±1σ with "
             "analyze's σ from the ranks as members:", "ranks | rms error GAN | rms error ML | ±1σ", run_cells)):
        n = head.count("|") + 1
        lines += [intro, "", f"| case | parameter | profile | K | {head} | verdict |",
                  "|---|---|---|" + "---:|" * (n + 1) + "---|"]
        for case in CASES:
            rs = best.get((case, wf))
            if not rs:
                lines.append(f"| {case} | all | — | 0 |" + " |" * n + " not measured at today's defaults |")
                continue
            for name, k, *rest in cells(rs):
                m, ids = rs[0]["profile"]["members"], "+".join(dict.fromkeys(r["profile"]["id"] for r in rs))
                lines.append(f"| {case} | {name} | {ids} | {k} | {m} | " + " | ".join(rest) + " |")
        lines.append("")
    return lines


def groups_tables(recs: list[dict], label: str) -> list[str]:
    """One table per (case, profile) of `recs`: the calibration, or the floor without tuning (workflow run)."""
    lines: list[str] = []
    by: dict[tuple, list[dict]] = {}
    for r in recs:
        by.setdefault((r["case"], r["profile"]["id"]), []).append(r)
    for (case, pid), rs in by.items():
        prof = rs[0]["profile"]
        if prof.get("workflow") == "run":
            lines += floor_table(case, pid, prof, rs, label)
            continue
        kf = prof.get("final_noise_samples", prof["noise_samples"])
        lines += [f"## {case} (profile {pid}: M = {prof['members']}, {rs[0]['events']} events, "
                  f"settings {' '.join(prof['set']) or 'the preset' + (' of then' if label else '')}"
                  f"{defaults_of(prof)}{seeds_of(prof)}, "
                  f"p̂ on {kf} noise vectors){label}", "",
                  f"{len(rs)} replica(s); training + analysis {sum(r['wall_s'] for r in rs) / 60:.1f} min in all; "
                  f"{code_of(rs)}.", "",
                  "| parameter | K | pull mean | pull width (t-normalised) | pull std | central 68 % half-width | "
                  "±1σ | ±2σ | ±k68σ | "
                  "±k95σ | σ_GAN/σ_ML (median) | rms error GAN / ML | ML pull width | on typical data sets (a model): "
                  "slope on the ML error, width, ±1σ | noise / σ (median) | still moving | verdict |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        e = expected(int(prof["members"]))
        lines.append(f"| *exact σ, M = {prof['members']} members* | | 0 | 1.00 | {e['std']:.2f} | {e['hw68']:.2f} | "
                     f"{100 * e['cover1']:.0f} % | {100 * e['cover2']:.0f} % | 68 % | 95 % | | | | | | | |")
        rows = stats_of(rs)  # (once: the table and the non-closure line below)
        for row in rows:
            verdict = calibration_verdict(row)
            lines.append(f"| {row['name']} | {row['n']} | {row['pull_mean']:+.2f} | {_f(row['pull_width_t'], '.2f')} | "
                         f"{_f(row['pull_width'], '.2f')} | "
                         f"{_f(row['pull_width68'], '.2f')} | "
                         f"{100 * row['cover1']:.0f} % | {100 * row['cover2']:.0f} % | "
                         f"{100 * row['cover68']:.0f} % | {100 * row['cover95']:.0f} % | {_f(row['ratio'], '.2f')} | "
                         f"{row['gan_err_rms'] / row['ml_err_rms'] if row['ml_err_rms'] else float('nan'):.2f} | "
                         f"{_f(row['ml_pull_width'], '.2f')} | {typical_cell(row.get('typical'))} | "
                         f"{_f(row['noise_over_sigma'], '.2f')} | "
                         f"{row['moving']}/{row['n']}{judged_cell(row)} | {verdict} |")
        nl = nonclosure_line(rows)
        lines += ["", nl] if nl else []
        lines.append("")
    return lines


def fill_bounds(recs: list[dict]) -> None:
    """Records from before their environment had a Fisher information have no Cramér-Rao bound: proxy1d's from
    before Proxy1D.fisher, smear1d's (a simulator) from before sagips/simfisher.py. It is computed here as analyze
    computes it now (stats.cramer_rao of the information at the record's p̂, for its number of events; smear1d's at
    p̂ rounded to 3 significant digits, shared by the records that round alike, since each estimate takes seconds),
    in memory, so that their sigma follows analyze's current rule (`parts_now`)."""
    from sagips.analysis.stats import cramer_rao

    envs, bounds = {}, {}
    for r in recs:
        g = r["gan"]
        if (r["case"] not in ("proxy1d", "smear1d") or g.get("cramer_rao") is not None
                or g["spread_from"] not in ("members", "ranks")):
            continue
        sets = r["profile"].get("set") or []
        key = (r["case"], json.dumps(sets))
        if key not in envs:
            envs[key] = environment(r["case"], sets)
        p = np.asarray(g["p_hat"], dtype=np.float64)
        if r["case"] == "smear1d":
            p = np.asarray([float(f"{v:.3g}") for v in p])
        at = key + (tuple(p.tolist()), int(r["events"]))
        if at not in bounds:
            bound = cramer_rao(envs[key].fisher(p), int(r["events"]))
            bounds[at] = None if bound is None else bound.tolist()
        g["cramer_rao"] = bounds[at]


def environment(case: str, sets: list[str]):
    """The environment of `case` on the CPU, for its Fisher information (fill_bounds): proxy1d's under the settings
    `sets`; smear1d's with its defaults (its information is its simulator's, which no setting changes)."""
    if case == "proxy1d":
        from sagips_environments.proxy1d import Proxy1D

        return Proxy1D(env_config("proxy1d", sets), "cpu", 0)
    from tests._plugins import SMEAR_SRC

    sys.path.insert(0, str(SMEAR_SRC))
    try:
        from sagips_smear1d import Smear1D
    finally:
        sys.path.remove(str(SMEAR_SRC))
    from sagips.config import from_dict

    return Smear1D(from_dict(Smear1D.Config, {}, "environment."), "cpu", 0)


def page(out: Path) -> str:
    from benchmarks.loop_closure import machine

    recs = [json.loads(p.read_text()) for p in sorted((out / "coverage").glob("*.json"))]
    # superseded profiles, kept in subfolders (coverage/NAME/*.json): shown after the current ones, labelled
    old = {p.parent.name: [] for p in (out / "coverage").glob("*/*.json")}
    for p in sorted((out / "coverage").glob("*/*.json")):
        old[p.parent.name].append(dict(json.loads(p.read_text()), superseded=True))  # (`nonclosure_of`)
    fill_bounds(recs + [r for rs in old.values() for r in rs])
    m = machine()
    lines = ["# Calibration of p̂ ± σ: pulls and coverage (benchmarks/coverage.py)", "",
             "Generated whole by `python benchmarks/coverage.py` from `coverage/*.json` (one file per replica; "
             "superseded profiles in subfolders); "
             f"notes by hand: [{NOTES}]({NOTES}).", "",
             f"Machine of the last page build: {m['cpu_model']}, {m['cores']} cores, flags "
             f"{' '.join(m['vector_flags'])}; torch {m['torch']}.", "",
             "Each replica: one reference data set (seed 1000+k) at the case's truth, one job of M members "
             "(`--mode ensemble --ensemble-size M`, 1 rank each, the data file shared), `sagips.analyze` → p̂ ± σ, and "
             "the ML fit on the same events with its Fisher σ. Pull = (p̂ − p_true)/σ. Target: pull width "
             f"{PULL_WIDTH[0]}–{PULL_WIDTH[1]}, coverage of ±1σ {100 * COVER_1[0]:.0f}–{100 * COVER_1[1]:.0f} %.", "",
             "σ from M members is itself an estimate with M − 1 degrees of freedom, so even an exact σ gives pulls "
             "that follow Student's t, not a unit Gaussian: the row *exact σ, M members* gives what to expect (the "
             "pulls' std is 1.73 at M = 4, where the target asks for at most 1.25). The verdict's pull width is "
             "therefore that of the t-normalised pulls z = Φ⁻¹(F_t(pull)), with each σ's degrees of freedom: a unit "
             "Gaussian for an exact σ whatever M is. The pulls' own std stands beside it. "
             "sagips.analyze therefore also quotes the 68.3 % and 95.4 % intervals ±k68σ and ±k95σ (Student's t "
             "with σ's Welch–Satterthwaite degrees of freedom: the drift and noise parts are not sampled); the "
             "columns ±k68σ and ±k95σ are their coverage (targets 68 % and 95 %). Where drift and noise weigh in, "
             "real pulls are narrower than the exact-σ row. σ is recomputed from each record's parts under "
             "analyze's current rule (the drift counts only where the parameter still moves; the spread part is "
             "at least the data's floor where the Cramér-Rao bound is known, docs/analysis.md), so records made "
             "under an older rule read alike; proxy1d's records from before its Fisher information, and smear1d's from "
             "before a simulator had one (sagips/simfisher.py), get their bound here, from their p̂ and size, as "
             "analyze computes it now (toy1d's records from before analyze "
             "recorded the bound keep σ without the floor).", "",
             f"A `density` environment (toy1d) trains with the Fisher preconditioner by default from commit "
             f"{PRECONDITIONED_FROM} on (`environment.precondition=fisher`, docs/environments.md); toy1d's profiles "
             "from earlier code, and those without a commit, trained with plain gradients (coverage.notes.md).", "",
             f"smear1d's and toy1d's members start at their own points of the box's middle 80 % by default from "
             f"commit {STARTED_APART_FROM} on (`environment.g_start=0.8`). Their profiles made before, with no "
             "`g_start` setting, started every member at the box's middle; those made after it get profiles of "
             "their own (the heading says `members started apart`).", "",
             f"smear1d and toy1d size their synthetic batch from the data by default from commit {SIZED_FROM} on "
             "(`environment.events_per_sample=auto`: the synthetic events of a weight-average window are 10x the "
             "events a rank keeps, 391 per parameter set for 1M events) and have networks of 64 x 3 (the presets "
             "had them already); before, 100 events and 128 x 4. Those profiles are their own (the heading says "
             "`batch sized from the data`); only they count as today's defaults.", "",
             f"From commit {CRITIC_SCALED_FROM} on, a ParametricEnvironment's critic sees events standardised by "
             "the rank's reference data, its first layer's kinks at them (docs/environments.md). Those profiles are "
             "their own (the heading says `critic on the data's scale`); only they count as today's defaults. Before "
             "the ensembles were run again, one run on each of the five data sets of smear1d's and toy1d's one-run "
             "profiles ended as near the truth as with the raw critic (rms 0.83, 1.32 and 1.15-1.31 σ_ML against "
             "0.81, 1.47 and 1.15-1.59; coverage.notes.md, twenty-fifth session).", "",
             f"From commit {POINT_FROM} on, a ParametricEnvironment's generator predicts one point "
             "(`environment.noise_scale=0`, was 0.01), and a simulator's (smear1d's) trains at `train.lr_g=3e-4` "
             "(was 1e-3, the critic's rate; a density's, toy1d's, keeps 1e-3): a spread of predicted locations made "
             "a width end low, and at equal rates a width collapsed mid-run (coverage.notes.md, thirty-fifth "
             "session). Those profiles are their own (the heading says `a generator of one point`), as are those "
             "that restate both settings in --set; only they count as today's defaults.", ""]
    if not recs:
        lines += ["No replica has finished yet.", ""]
    lines += summary(recs) + groups_tables(recs, "")
    for name, rs in old.items():
        lines += groups_tables(rs, f" — superseded (coverage/{name}/)")
    return "\n".join(lines) + "\n"


def run_frozen(argv: list[str], out: Path) -> None:
    """Run this script again from an export of HEAD (sagips, the environments, the examples, the benchmarks and the
    tests' helpers), with that export first on PYTHONPATH for every import of the study and of its training runs;
    --out stays this tree's. Replaces this process."""
    from benchmarks import frozen

    sha = frozen.head()
    code, _ = frozen.export(ROOT / "runs" / "coverage" / f"code-{sha[:12]}",
                            (*frozen.PARTS, "examples", "benchmarks", "tests"), sha)
    env = dict(os.environ, SAGIPS_FROZEN_CODE=sha,
               PYTHONPATH=os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])]))
    args = [a for a in argv if a != "--frozen-code"] + ["--out", str(out.resolve())]
    print(f"coverage: running from {code} (commit {sha[:10]})", flush=True)
    os.execve(sys.executable, [sys.executable, str(code / "benchmarks" / "coverage.py"), *args], env)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.frozen_code and not args.page_only and not os.environ.get("SAGIPS_FROZEN_CODE"):
        run_frozen(list(sys.argv[1:] if argv is None else argv), out)
    (out / "coverage").mkdir(parents=True, exist_ok=True)
    if not args.page_only:
        # a kill's SIGTERM unwinds as Ctrl-C does: the running job stops and the work directory (a replica's data
        # and run, up to ~1 GB) goes with the study
        with jobs.stops_on_sigterm():
            study(args, out)
    (out / "coverage.md").write_text(page(out))
    print(f"coverage: wrote {out / 'coverage.md'}")
    return 0


def study(args: argparse.Namespace, out: Path) -> None:
    """The replicas that are not finished yet, in a work directory of their own."""
    with tempfile.TemporaryDirectory(prefix="sagips-coverage-") as tmp:
        work = Path(tmp)
        paths = smear_site(work / "site") + toy_site(work / "site")[1:]
        for p in reversed(paths):
            sys.path.insert(0, p)
        env = child_env(pythonpath(paths))
        for case in args.case:
            prof = profile(args, case)
            done = [json.loads(f.read_text()) for f in sorted((out / "coverage").glob(f"{case}*.json"))]
            old = stale_preset([r for r in done if r.get("profile", {}).get("id") == prof["id"]],
                               preset_digest(config_of(args, case)))
            if old is not None:
                raise SystemExit(f"coverage: {case}'s preset {config_of(args, case)} changed since replica "
                                 f"{old['replica']} of profile {prof['id']} was made: move that profile's "
                                 f"records to {out / 'coverage'}/SUBFOLDER/ (kept as superseded) before resuming")
            for k in range(args.replicas):
                path = record_path(out, args, case, k)
                if path.is_file() and json.loads(path.read_text()).get("profile", {}).get("id") == prof["id"]:
                    continue  # finished before: resume from the next one
                rec = replica(args, case, k, work, env)
                # strict JSON (NaN, inf -> null); a kill leaves no torn replica
                atomic.write_text(path, json.dumps(_jsonable(rec), indent=1) + "\n")
                print(f"coverage: {case} replica {k}: pulls "
                      + ", ".join(f"{n} {(p - t) / s:+.2f}" if s else f"{n} n/a" for n, p, t, s in
                                  zip(rec["names"], rec["gan"]["p_hat"], rec["truth"], rec["gan"]["sigma"]))
                      + f" ({rec['wall_s']:.0f} s)", flush=True)
                if args.commit:
                    commit(path, f"coverage: {case} replica {k} (profile {prof['id']})")


if __name__ == "__main__":
    sys.exit(main())
