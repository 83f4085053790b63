"""A closure test of your own problem: does p^ +- sigma cover the truth, and what non-closure should analyze add?

    # K data sets at a truth you choose (one seed each), one job of M members on each
    for k in $(seq 0 19); do
      python -m sagips.data NAME --out data/k$k.h5 --seed $((1000 + k))
      mpiexec -n 4 python -m sagips.run --config PRESET --mode ensemble --ensemble-size 4 --seed $((1000 + k)) \\
          --set environment.data_file=data/k$k.h5 --output-dir closure/k$k
    done
    python -m sagips.closure closure/k*          # one job directory per data set

For every job it computes what `sagips.analyze` quotes, p^ +- sigma, without any non-closure, and against the truth
in run.json it reports per parameter the pulls (p^ - p_true)/sigma, how often +-1 sigma and analyze's 68.3 %
interval cover the truth, and the **non-closure** s (in units of the data's Cramér-Rao bound): s^2 = mean((p^ -
p_true)^2 - sigma^2)/bound^2 over the data sets (stats.nonclosure_terms), with its error. Jobs whose parameters still
move are left out (and named). Where s^2 > 0 the GAN's error exceeds sigma: it advises `analysis.nonclosure` (one
number, or one per parameter name) for the preset, sagips.run's --set or `sagips.analyze --nonclosure`, and sigma
then includes it, named (docs/analysis.md, "A systematic of the training"). No value is advised for fits more than
5 bounds from the truth: they have not reached the data. benchmarks/coverage.py does the same for the
project's own cases, with a maximum-likelihood fit on every data set. Exit status 2: bad input, one line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from sagips.analysis import stats
from sagips.analysis.ensemble import AnalysisError, data_identity, expand_run_dirs, job_uncertainty, load_run

PROG = "sagips.closure"
FEW = 10  #: below this many data sets s^2's error is said to be large


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0].strip(),
                                epilog="Each JOB_DIR is one data set's fit: a sagips.run output directory, or a job "
                                       "directory of members (--ensemble-size). The truth comes from its run.json: "
                                       "make the data with sagips.data at the truth you choose.")
    p.add_argument("job_dirs", nargs="+", metavar="JOB_DIR", help="one job (or run) directory per data set")
    p.add_argument("--noise-samples", type=int, default=1024, metavar="K", help="as sagips.analyze (default 1024)")
    p.add_argument("--final-noise-samples", type=int, default=16384, metavar="K",
                   help="as sagips.analyze (default 16384)")
    p.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    return p.parse_args(argv)


def fits(job_dirs: Sequence[str], noise_samples: int, final_noise_samples: int, say=lambda m: None) -> dict[str, Any]:
    """Per job: p^, sigma without a non-closure, its degrees of freedom, the bound and the truth (arrays (K, P));
    `say` gets a line per job (progress)."""
    rows: dict[str, list] = {"p_hat": [], "sigma": [], "dof": [], "bound": [], "truth": []}
    names, unsettled, unfinished, dirs = None, [], [], [str(d) for d in job_dirs]
    fitted: dict[Any, str] = {}  # data set -> the job that fitted it (run.json only: before any checkpoint is read)
    given: dict[str, str] = {}  # real path -> as first given (the same spelling again, or another)
    for d in job_dirs:
        real = os.path.realpath(d)
        if real in given:
            raise AnalysisError(f"{d}: given twice (as {given[real]}): a closure test needs one job per data set")
        given[real] = str(d)
        for r in (load_run(p) for p in expand_run_dirs([d])):
            first = fitted.setdefault(data_identity(r), str(d))
            if first != str(d):
                kind, what, *_ = data_identity(r)
                raise AnalysisError(f"{first} and {d} fitted the same data set ("
                                    + (f"data file {what}" if kind == "file" else f"generated with seed {what}")
                                    + "): a closure test needs one job per data set, each made with its own seed")
    for k, d in enumerate(job_dirs):
        say(f"{PROG}: job {k + 1} of {len(job_dirs)}: {d}")
        g, _, u, conv = job_uncertainty([d], noise_samples, final_noise_samples, nonclosure=0.0)
        if any(r.info.get("truth_known") is False for r in g.runs):
            raise AnalysisError(f"{d}: its data name no truth; a closure test needs data made at a known truth "
                                f"(python -m sagips.data NAME --seed S, then --set environment.data_file=...)")
        if u.cramer_rao is None:
            raise AnalysisError(f"{d}: the data's Cramér-Rao bound is not known for this environment, and the "
                                f"non-closure is a number of bounds: a closure test needs a density, or a "
                                f"simulator of events of 1 to 3 columns")
        these = [c["name"] for c in conv]
        if names is not None and these != names:
            raise AnalysisError(f"{d}: parameters {these} differ from the first job's {names}")
        names = these
        if any(c["moving"] is not False for c in conv):  # still moving, or not judged: the training is unfinished
            unsettled.append(str(d))
        if any(r.info.get("status") not in (None, "complete") for r in g.runs):  # killed, stopped, failed, running
            unfinished.append(str(d))
        for key, v in (("p_hat", u.p_hat), ("sigma", u.sigma), ("dof", u.dof), ("bound", u.cramer_rao),
                       ("truth", g.truth)):
            rows[key].append(np.asarray(v, dtype=np.float64))
    return {"names": names, "unsettled": unsettled, "unfinished": unfinished, "dirs": dirs,
            **{k: np.stack(v) for k, v in rows.items()}}


def closure(f: dict[str, Any]) -> dict[str, Any]:
    """The pulls, the coverage and the non-closure of the fits `f` (`fits`), per parameter, over the jobs whose
    parameters have settled (analyze's convergence diagnostic); jobs still moving are left out and named (all of
    them, where none has settled: then no value is advised)."""
    keep = np.array([d not in f["unsettled"] for d in f["dirs"]])
    use = keep if keep.any() else np.ones_like(keep)
    err = (f["p_hat"] - f["truth"])[use]
    sigma, bound = f["sigma"][use], f["bound"][use]
    pull = err / sigma
    k68 = np.vectorize(lambda d: stats.interval_factor(stats.P68, d))(f["dof"][use])
    terms = stats.nonclosure_terms(err ** 2, sigma, bound)  # (K, P)
    n = len(err)
    s2 = terms.mean(axis=0)  # per parameter: parameters differ (a weak one may need it, a strong one not)
    s2_err = terms.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.full(s2.shape, np.nan)
    s = np.sqrt(np.maximum(s2, 0.0))
    with_s = err / np.sqrt(sigma ** 2 + (s * bound) ** 2)
    params = [{"name": name, "pull_mean": float(pull[:, i].mean()),
               "pull_std": float(pull[:, i].std(ddof=1)) if n > 1 else None,
               "cover1": float(np.mean(np.abs(pull[:, i]) <= 1)),
               "cover68": float(np.mean(np.abs(pull[:, i]) <= k68[:, i])),
               "nonclosure_sq": float(s2[i]), "nonclosure_sq_error": None if n < 2 else float(s2_err[i]),
               "nonclosure": float(s[i]), "cover1_with_nonclosure": float(np.mean(np.abs(with_s[:, i]) <= 1))}
              for i, name in enumerate(f["names"])]
    # a non-closure is a systematic of a finished fit: not a cover for one that has not reached the data's floor
    far = [p["name"] for p in params if p["nonclosure"] > stats.FAR_FROM_FLOOR]
    # advised where s^2 stands above its own error (noise alone puts about half of the parameters above 0), rounded
    # up to 2 decimals (never below what was measured)
    rec = {p["name"]: math.ceil(100 * p["nonclosure"]) / 100 for p in params
           if p["nonclosure_sq_error"] is not None and p["nonclosure_sq"] > p["nonclosure_sq_error"]}
    advise = bool(keep.any()) and not far and bool(rec)
    return {"data_sets": n, "left_out": [d for d in f["unsettled"]] if keep.any() else [],
            "unsettled": list(f["unsettled"]), "unfinished": list(f.get("unfinished", [])),
            "settled": bool(keep.any()), "parameters": params, "far": far,
            "recommended": {p["name"]: rec.get(p["name"], 0.0) for p in params} if advise else None}


def advice(rec: dict[str, float]) -> str:
    """How to set a recommended non-closure: one number where the parameters agree to 10 %, else per name."""
    vals = list(rec.values())
    if min(vals) > 0 and max(vals) <= 1.1 * min(vals):
        one = f"{max(vals):g}"
        return (f"`analysis.nonclosure: {one}` in the preset (or `--set analysis.nonclosure={one}` on sagips.run, "
                f"or `python -m sagips.analyze RUN_DIR --out DIR --nonclosure {one}`)")
    named = {k: v for k, v in rec.items() if v > 0}
    yaml = "{" + ", ".join(f"{k}: {v:g}" for k, v in named.items()) + "}"
    arg = ",".join(f"{k}={v:g}" for k, v in named.items())
    return (f"`analysis.nonclosure: {yaml}` in the preset (or `--set 'analysis.nonclosure={yaml}'` on sagips.run, "
            f"or `python -m sagips.analyze RUN_DIR --out DIR --nonclosure {arg}`); the parameters left out get none")


def report(c: dict[str, Any]) -> list[str]:
    n = c["data_sets"]
    lines = [f"## Closure over {n} data set(s) of known truth (σ without a non-closure)", "",
             "| parameter | pull mean | pull std | ±1σ | ±k68σ (analyze's 68.3 %) | s² (bounds²) | s | ±1σ with s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in c["parameters"]:
        std = "n/a" if p["pull_std"] is None else f"{p['pull_std']:.2f}"
        err = "" if p["nonclosure_sq_error"] is None else f" ± {p['nonclosure_sq_error']:.2f}"
        lines.append(f"| {p['name']} | {p['pull_mean']:+.2f} | {std} | {100 * p['cover1']:.0f} % | "
                     f"{100 * p['cover68']:.0f} % | {p['nonclosure_sq']:+.2f}{err} | {p['nonclosure']:.2f} | "
                     f"{100 * p['cover1_with_nonclosure']:.0f} % |")
    lines += ["", "- s² = the mean over the data sets of ((p̂ − p_true)² − σ²)/bound² (0 for an honest σ; negative: σ "
                  "covers more than the error); s = √s² is the non-closure, in Cramér-Rao bounds"]
    if c["unsettled"]:
        left = c["unsettled"]
        lines.append(f"- {len(left)} job(s) have parameters still moving or not judged by analyze's convergence "
                     f"diagnostic, " + ("left out above" if c["settled"] else "every job: shown above, no value "
                                        "advised") + f": {', '.join(left[:3])}{', ...' if len(left) > 3 else ''}; "
                     "train them longer (python -m sagips.analyze JOB names each parameter's reason; where it says "
                     "too few records, lower train.checkpoint_every)")
    late = [d for d in c.get("unfinished", []) if d not in c["left_out"]]
    if late:
        lines.append(f"- {len(late)} job(s) did not complete (killed, stopped, failed or still running), and their "
                     f"fit above is at their last checkpoint: {', '.join(late[:3])}{', ...' if len(late) > 3 else ''} "
                     "(python -m sagips.analyze JOB names the epoch)")
    if c["far"]:
        lines.append(f"- {', '.join(c['far'])}: the fits end more than {stats.FAR_FROM_FLOOR:.0f} bounds from the "
                     "truth: they have not reached the data's floor, which a non-closure would only hide; train "
                     "longer, or check the setup (the truth of the data, the preset)")
    if c["recommended"] is not None:
        lines.append("- σ falls short of the error: set " + advice(c["recommended"]) + "; it is then part of σ, named")
    elif c["settled"] and not c["far"] and n > 1:
        lines.append("- σ covers the error (s² is nowhere above its own error): no non-closure is needed")
    if n < 2:
        lines.append("- one data set: s² has no error to judge it by, so no value is advised; 20 or more measure it")
    elif n < FEW:
        lines.append(f"- {n} data sets: s² is uncertain (its ± above); 20 or more measure it")
    lines.append("- pulls from M members follow Student's t (std 1.73 at M = 4 for an exact σ): judge ±k68σ, "
                 "which should cover 68 %, and s², rather than the pulls' std")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.noise_samples < 1 or args.final_noise_samples < 2:
            raise AnalysisError("--noise-samples must be at least 1 and --final-noise-samples at least 2")
        c = closure(fits(args.job_dirs, args.noise_samples, args.final_noise_samples,
                         say=lambda m: print(m, file=sys.stderr, flush=True)))
    except AnalysisError as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2
    print("\n".join(report(c)))
    if args.json:
        from sagips.io import atomic

        atomic.write_text(args.json, json.dumps(c, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
