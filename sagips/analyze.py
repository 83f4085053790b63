"""Ensemble post-analysis of SAGIPS runs (the paper's section VI): residuals, 1 sigma, convergence, analysis rate.

    # M runs of one mode, then the analysis (every run directory is an output of sagips.run)
    for s in 1 2 3 4; do
      mpiexec -n 2 python -m sagips.run --config configs/proxy1d-quick.yaml --mode arar --seed $s \\
          --output-dir runs/arar/s$s
    done
    python -m sagips.analyze runs/arar/s* --out reports/arar

    # an ensemble launched in one job: 8 ranks -> 4 runs of 2 ranks in runs/rma/member000 ... member003
    mpiexec -n 8 python -m sagips.run --config configs/proxy1d-quick.yaml --mode rma-arar-arar --ensemble-size 4 \\
        --output-dir runs/rma
    python -m sagips.analyze runs/arar/s* runs/rma --out reports/cmp      # one column (group) per mode

Outputs in --out: summary.md (first p^ +- sigma per parameter by name with sigma's parts and the convergence
diagnostic, then Table IV), summary.csv (Table IV: residuals +- 1 sigma in units of 1e-3 per parameter at the last
common checkpoint, one column per group), summary.json (every number in the figures), residuals_vs_time.png,
convergence.png, rmse_vs_spread.png, uncertainty.png, and analysis_rate.png when the runs cover several world sizes.
See docs/analysis.md for how to read them. Exit status 2 means bad input, with a one-line message; -v prints
progress on stderr.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from sagips.analysis import stats
from sagips.io.refdata import NO_TRUTH_ANALYSIS
from sagips.analysis.ensemble import (
    GROUP_KEYS,
    AnalysisError,
    FinalPrediction,
    GroupSeries,
    check_runs,
    expand_run_dirs,
    group_runs,
    group_uncertainty,
    load_run,
    predict_final,
    predict_group,
    truth_known,
)

EXIT_USAGE = 2
PROG = "sagips.analyze"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _nonclosure(text: str) -> float | dict[str, float]:
    """--nonclosure S (every parameter) or NAME=S,NAME=S (those named; the others 0)."""
    def number(t: str) -> float:
        try:
            v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected S or NAME=S,NAME=S with numbers S >= 0, got {text!r}") from None
        if not (v >= 0 and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"expected S or NAME=S,NAME=S with numbers S >= 0, got {text!r}")
        return v
    if "=" not in text:
        return number(text)
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    if any(len(p) != 2 or not p[0].strip() for p in pairs):
        raise argparse.ArgumentTypeError(f"expected S or NAME=S,NAME=S with numbers S >= 0, got {text!r}")
    return {k.strip(): number(v) for k, v in pairs}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sagips.analyze",
        description="Ensemble post-analysis of sagips.run outputs: ensemble mean and 1 sigma of the parameter "
                    "predictions (eqs. 7-8), normalised residuals against the truth (eq. 6) over accumulated "
                    "training time, and the analysis rate (eq. 9).",
        epilog="A RUN_DIR is an output directory of sagips.run; a directory with member{m:03d}/ subdirectories "
               "(sagips.run --ensemble-size M) expands to its members. Runs are grouped (--group-by) into "
               "ensembles; each group is one column of the table and one panel or curve of the figures.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="sagips.run output directories")
    p.add_argument("--out", required=True, metavar="DIR", help="where the summary and figures go (created)")
    p.add_argument("--noise-samples", type=_positive_int, default=1024, metavar="K",
                   help="noise vectors per generator at every checkpoint, the same for every generator (default 1024)")
    p.add_argument("--final-noise-samples", type=_positive_int, default=16384, metavar="K",
                   help="noise vectors for the quoted p̂ ± σ at the last checkpoint (default 16384): a generator "
                        "with noise (proxy1d; a ParametricEnvironment with environment.noise_scale > 0) maps it to a "
                        "spread of parameters, so p̂ carries a Monte-Carlo error that falls as "
                        "1/sqrt(K) "
                        "(the column `noise`)"),
    p.add_argument("--group-by", choices=GROUP_KEYS, default="mode",
                   help="run.json field that forms the ensembles (default: mode)")
    p.add_argument("--resamples", type=_positive_int, default=300, metavar="S",
                   help="random sub-ensembles per size M for the RMSE-vs-spread figure (default 300)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the shared noise batch and of the resampling (default 0)")
    p.add_argument("--nonclosure", type=_nonclosure, default=None, metavar="S|NAME=S,...",
                   help="a systematic of the training, S times the data's Cramér-Rao bound, added to σ in quadrature, "
                        "for every parameter or per name (tau=0,resolution=2.5) (default: the runs' "
                        "analysis.nonclosure, itself 0 unless a preset measured it; python -m sagips.closure measures "
                        "it; docs/analysis.md)")
    p.add_argument("--verbose", "-v", action="store_true", help="progress messages on stderr")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ the numbers
def _jsonable(x: Any) -> Any:
    """numpy arrays and scalars -> lists and floats; non-finite floats -> None (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return _jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def group_summary(g: GroupSeries, resamples: int, rng: np.random.Generator,
                  final: FinalPrediction | None = None, nonclosure: float | None = None) -> dict[str, Any]:
    """Every number of one group: eqs. 6-8 at each time step, the final row of the table, the resampling study, and
    p^ +- sigma (from `final`, the last checkpoint on a larger noise batch, when given)."""
    res = [g.at(t) for t in range(len(g.epochs))]
    last = res[-1]
    n = len(g.runs)
    rs = {"epoch": int(g.epochs[-1]), "time_s": float(g.time_s[-1]), "resamples": resamples, "sizes": [],
          "rmse_1e3": [], "spread_1e3": [], "rmse_mean_1e3": [], "spread_mean_1e3": [], "ellipse95_1e3": []}
    if n >= 2:
        sizes = list(range(2, n + 1))
        for m, (rmse, spread) in stats.resample_rmse_spread(g.preds[-1], g.truth, sizes, resamples, rng).items():
            rmse, spread = rmse * 1e3, spread * 1e3
            rs["sizes"].append(m)
            rs["rmse_1e3"].append(rmse)
            rs["spread_1e3"].append(spread)
            rs["rmse_mean_1e3"].append(float(rmse.mean()))
            rs["spread_mean_1e3"].append(float(spread.mean()))
            rs["ellipse95_1e3"].append(stats.confidence_ellipse(spread, rmse, 0.95))
    rates = [r.rate() for r in g.runs]
    rated = [x for x in rates if x is not None]
    u, conv = group_uncertainty(g, final=final, nonclosure=nonclosure)
    known = all(r.info.get("truth_known") is not False for r in g.runs)
    out = {
        "name": g.name, "n_runs": n, "runs": [str(r.path) for r in g.runs],
        "modes": sorted({r.mode for r in g.runs}), "world_sizes": sorted({r.world_size for r in g.runs}),
        "labels": sorted({r.label for r in g.runs}),
        "truth": g.truth, "epochs": g.epochs, "time_s": g.time_s,
        # a data file of the user's that names no truth: the truth is the environment's placeholder (sagips.run)
        "truth_known": known,
        "p_hat": np.array([x.p_hat for x in res]), "sigma": np.array([x.sigma for x in res]),
        "residual": np.array([x.residual for x in res]), "residual_sigma": np.array([x.residual_sigma for x in res]),
        "mean_abs_residual_1e3": [1e3 * x.mean_abs_residual for x in res],
        "mean_residual_sigma_1e3": [1e3 * x.spread for x in res],
        "rmse_1e3": [1e3 * x.rmse for x in res],
        "final": {"epoch": int(g.epochs[-1]), "time_s": float(g.time_s[-1]), "p_hat": last.p_hat,
                  "sigma": last.sigma, "residual_1e3": last.residual * 1e3,
                  "residual_sigma_1e3": last.residual_sigma * 1e3},
        "uncertainty": {"epoch": int(g.epochs[-1]),
                        "noise_samples": final.noise_samples if final is not None else len(g.preds[-1][0]),
                        "p_hat": u.p_hat, "sigma": u.sigma, "spread": u.spread,
                        "members": u.members, "scatter": u.scatter, "ranks": u.ranks, "drift": u.drift,
                        "drift_added": u.drift_added, "sampling": u.sampling, "nonclosure": u.nonclosure,
                        "pull": ((u.p_hat - g.truth) / np.where(u.sigma > 0, u.sigma, np.nan)) if known
                        else [None] * len(g.truth),  # (no truth: no pulls)
                        "n_members": u.n_members, "factor": u.factor, "spread_from": u.spread_from,
                        "split_by_bound": u.sampled is not None,
                        "dof": u.dof, "k68": u.k68, "k95": u.k95, "cramer_rao": u.cramer_rao,
                        "floored": u.floored, "notes": u.notes},
        "convergence": conv,
        "rmse_vs_spread": rs,
        "analysis_rate": {"per_run": rates, "mean": float(np.mean(rated)) if rated else None,
                          "std": float(np.std(rated)) if rated else None},
    }
    if not known:  # measured data: the truth is the environment's placeholder, so is every number against it
        out.update(truth=None, residual=None, residual_sigma=None, mean_abs_residual_1e3=None,
                   mean_residual_sigma_1e3=None, rmse_1e3=None, rmse_vs_spread=None)
        out["final"].update(residual_1e3=None, residual_sigma_1e3=None)
    return out


def rate_rows(runs, group_of: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """Eq. 9 per run, and its mean/std per (mode, world size) for the analysis-rate figure."""
    per_run, by = [], {}
    for r in runs:
        rate = r.rate()
        secs = r.info.get("train_seconds") or []
        per_run.append({"run": str(r.path), "group": group_of[str(r.path)], "mode": r.mode,
                        "world_size": r.world_size, "label": r.label, "member": r.info.get("member"),
                        "seed": (r.info.get("config") or {}).get("seed"),
                        "events_per_epoch": r.info.get("events_per_epoch"), "epochs": r.info.get("epochs"),
                        "train_seconds_max": max(secs) if secs else None, "analysis_rate": rate})
        if rate is not None:
            by.setdefault((r.mode, r.world_size), []).append(rate)
    agg = [{"mode": m, "world_size": w, "n_runs": len(v), "mean": float(np.mean(v)), "std": float(np.std(v))}
           for (m, w), v in by.items()]
    return per_run, agg


def final_k(args: argparse.Namespace) -> int:
    """Noise vectors for the quoted p^ +- sigma at the last checkpoint: never fewer than the series'."""
    return max(args.final_noise_samples, args.noise_samples)


def build_summary(series: list[GroupSeries], args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    runs = [r for g in series for r in g.runs]
    group_of = {str(r.path): g.name for g in series for r in g.runs}
    per_run, agg = rate_rows(runs, group_of)
    n_par = len(series[0].truth)
    out = {
        "sagips_analysis": 1,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": runs[0].environment,
        "settings": {"noise_samples": args.noise_samples, "final_noise_samples": final_k(args),
                     "group_by": args.group_by, "resamples": args.resamples,
                     "seed": args.seed, "nonclosure": getattr(args, "nonclosure", None)},  # (None: the runs')
        "parameters": (list(series[0].names) if series[0].names and len(series[0].names) == n_par
                       else [f"r_{i}" for i in range(n_par)]),
        "groups": [group_summary(g, args.resamples, rng, predict_final(g, final_k(args), args.seed),
                                 getattr(args, "nonclosure", None)) for g in series],
        "runs": per_run,
        "analysis_rate_by_world_size": agg,
    }
    return _jsonable(out)


# ------------------------------------------------------------------------------------------------ the table
def table_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """summary.csv: one row per parameter; per group its residual and 1 sigma in units of 1e-3 (Table IV), then per
    group the p^ +- sigma to quote (the first section of summary.md)."""
    header = ["parameter", "truth"]
    for g in summary["groups"]:
        header += [f"{g['name']} residual [1e-3]", f"{g['name']} sigma [1e-3]"]
    for g in summary["groups"]:
        header += [f"{g['name']} p_hat", f"{g['name']} p_hat sigma"]
    rows = []
    known = truth_known(summary["groups"])  # (else the truth is a placeholder: no residuals against it)
    for i, name in enumerate(summary["parameters"]):
        row: list[Any] = [name, summary["groups"][0]["truth"][i] if known else "unknown"]
        for g in summary["groups"]:
            row += ([g["final"]["residual_1e3"][i], g["final"]["residual_sigma_1e3"][i]] if known else ["", ""])
        for g in summary["groups"]:
            row += [g["uncertainty"]["p_hat"][i], g["uncertainty"]["sigma"][i]]
        rows.append(row)
    return header, rows


def write_csv(summary: dict[str, Any], path: str) -> None:
    header, rows = table_rows(summary)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for row in rows:
        w.writerow([repr(float(v)) if isinstance(v, float) else v for v in row])
    _write(path, buf.getvalue())


def _fmt_rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def markdown(summary: dict[str, Any], figures: dict[str, str]) -> str:
    groups = summary["groups"]
    s = summary["settings"]
    lines = ["# SAGIPS ensemble analysis", "",
             (f"Environment `{summary['environment']}`; {len(summary['runs'])} run(s) in {len(groups)} group(s) "
              f"(grouped by `{s['group_by']}`); K = {s['noise_samples']} shared noise vectors (seed {s['seed']}) "
              f"for the series and the residual table; p̂ ± σ below uses K = {s['final_noise_samples']}."),
             "",
             *quotable(summary), "",
             "## Normalised residuals at the last time step (Table IV style)", "",
             ("r̂_i = (p_i − p̂_i)/p_i of the ensemble mean p̂ (eq. 6, 7) ± 1σ = σ_i/|p_i| (eq. 8), in units of "
              "10⁻³. This σ is the paper's: the spread of single members (runs) about their mean, not the error of "
              "p̂ quoted above (that is about σ/√M, with its other parts)."), ""]
    if not truth_known(summary["groups"]):  # (residuals against a placeholder: no table, no figure of them)
        lines += [f"Not shown here: {NO_TRUTH_ANALYSIS}."]
    else:
        lines += table_iv(summary)
    lines += ["", "## Groups", "",
              ("| group | runs (M) | modes | ranks per run | last common epoch | training time at it [s] | "
               "analysis rate, eq. 9 [events/s] |"), "|---|---:|---|---|---:|---:|---:|"]
    for g in groups:
        ar = g["analysis_rate"]
        rate = _fmt_rate(ar["mean"]) + (f" ± {ar['std']:.2g}" if ar["mean"] is not None and g["n_runs"] > 1 else "")
        lines.append(f"| {g['name']} | {g['n_runs']} | {', '.join(g['modes'])} | "
                     f"{', '.join(map(str, g['world_sizes']))} | {g['final']['epoch']} | {g['final']['time_s']:.1f} "
                     f"| {rate} |")
    lines += ["", "## Runs", "",
              ("Members of one job (--ensemble-size) share the base seed; each rank's seed is derived from "
               "(seed, member, rank)."), "",
              "| run | group | mode | ranks | seed | member | epochs | max train s | analysis rate |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in summary["runs"]:
        secs = r["train_seconds_max"]
        lines.append(f"| `{r['run']}` | {r['group']} | {r['mode']} | {r['world_size']} | {r['seed']} | {r['member']} | "
                     f"{r['epochs']} | {'n/a' if secs is None else f'{secs:.1f}'} | {_fmt_rate(r['analysis_rate'])} |")
    lines += ["", "## Figures", ""]
    for name, f in figures.items():
        lines.append(f"![{name}]({f})")
    lines += ["", ("Every number above and in the figures is in `summary.json`; see docs/analysis.md for how to "
                   "read them."), ""]
    return "\n".join(lines)


def table_iv(summary: dict[str, Any]) -> list[str]:
    """The paper's Table IV: each group's residuals at its last common checkpoint, against the truth."""
    groups = summary["groups"]
    lines = ["| Residual [10⁻³] | p_i (truth) | " + " | ".join(g["name"] for g in groups) + " |",
             "|---|---:|" + "---:|" * len(groups)]
    truth = groups[0]["truth"]
    for i, pname in enumerate(summary["parameters"]):
        label = f"r̂_{i}" if pname == f"r_{i}" else f"r̂ ({pname})"
        cells = [f"{g['final']['residual_1e3'][i]:.1f}" + (f" ± {g['final']['residual_sigma_1e3'][i]:.1f}"
                                                            if g["n_runs"] > 1 else " (one run: no spread between runs)")
                 for g in groups]
        lines.append(f"| {label} | {truth[i]:g} | " + " | ".join(cells) + " |")
    lines.append("| mean abs(r̂_i) | | " + " | ".join(f"{g['mean_abs_residual_1e3'][-1]:.1f}" for g in groups) + " |")
    lines.append("| mean σ_i/abs(p_i) | | " + " | ".join(f"{g['mean_residual_sigma_1e3'][-1]:.1f}" if g["n_runs"] > 1
                                                       else "n/a (one run)" for g in groups) + " |")
    if any(g["n_runs"] < 2 for g in groups):
        lines += ["", "A group of one run has no spread between runs here; the error to quote, with the spread "
                      "between its ranks where they are independent members (`--mode ensemble`), is p̂ ± σ above."]
    return lines


def quotable(summary: dict[str, Any]) -> list[str]:
    """The section "p̂ ± σ per parameter": the estimate to quote, its σ and σ's parts, and the convergence
    diagnostic, one table per group (docs/analysis.md, "What σ contains")."""
    lines = ["## Parameters: p̂ ± σ (what to quote)", "",
             ("σ = sqrt(spread² + drift² + noise² [+ non-closure²]): the spread between independent members turned "
              "into the error of "
              "their mean (members), the spread of the ranks inside a run (ranks: training noise, shown, and used only "
              "without members), the drift of p̂ over the last "
              f"{100 * stats.DRIFT_FRACTION:.0f} % of the epochs (added where the parameter still moves, i.e. more "
              "than the members' spread; else shown as \"not in σ\"), and the Monte-Carlo error of p̂ from the K noise "
              "vectors it averages (noise; --final-noise-samples makes it smaller), and, where a calibration measured "
              "one, a systematic of the training (non-closure: analysis.nonclosure × the data's Cramér-Rao bound). "
              "Pull = (p̂ − truth)/σ. p̂ here "
              "uses K noise vectors of its own, so it differs from the residual table's (--noise-samples) by about "
              "the noise column.")]
    for g in summary["groups"]:
        u = g["uncertainty"]
        nc = u.get("nonclosure") if any(u.get("nonclosure") or []) else None  # (a systematic: its own column)
        how = ("" if u["spread_from"] != "members" else
               " (members = √(bound² + max(scatter², the bound's part of it)/M): the scatter's training noise "
               "averages over the members, stats.split_scatter)" if u.get("split_by_bound") else
               f" (members = scatter × {u['factor']:.3f})")
        lines += ["", f"### {g['name']}: {u['n_members']} member(s), σ from {u['spread_from']}{how}, "
                      f"epoch {u['epoch']}, K = {u['noise_samples']} noise vectors", "",
                  "| parameter | truth | p̂ ± σ | 68.3 % / 95.4 % interval | members | ranks | drift | noise (K) | "
                  + ("non-closure | " if nc else "") + "pull | convergence |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if nc else "") + "---:|---|"]
        known = g.get("truth_known", True)
        floored = u.get("floored") or [False] * len(summary["parameters"])
        for i, name in enumerate(summary["parameters"]):
            c = g["convergence"][i]
            state = {True: "**still moving**", False: "converged", None: "cannot judge"}[c["moving"]]
            z = "" if c["z"] is None else f" ({c['z']:.1f}σ)"
            lines.append(f"| {name} | {format(g['truth'][i], '.6g') if known else 'unknown'} | "
                         f"{_pm(u['p_hat'][i], u['sigma'][i])} | "
                         f"±{_g(u['k68'][i] * u['sigma'][i])} / ±{_g(u['k95'][i] * u['sigma'][i])} | "
                         f"{_g(u['members'][i])}{' (the data floor)' if floored[i] else ''} | {_g(u['ranks'][i])} | "
                         f"{_g(u['drift'][i])}"
                         f"{'' if u['drift_added'][i] else ' (not in σ)'} | "
                         f"{_g(u['sampling'][i])} | " + (f"{_g(nc[i])} | " if nc else "") +
                         f"{_f(u['pull'][i], '+.2f')} | {state}{z} |")
        lines += ["", f"- {t_note(u)}"] + [f"- {n}" for n in u["notes"]]
        if not known:
            lines.append(f"- {NO_TRUTH_ANALYSIS}")
        if u.get("cramer_rao") is not None:
            cr = u["cramer_rao"]
            lines.append("- the Cramér-Rao bound of the data (the smallest σ of an unbiased fit to all its events, from "
                         "the Fisher information at p̂): " + ", ".join(
                             f"{n} {_g(b)} (σ/bound {_f(s / b if b and s is not None else None, '.2f')})"
                             for n, b, s in zip(summary["parameters"], cr, u["sigma"])))
            low = [n for n, x in zip(summary["parameters"], u.get("floored") or []) if x]
            if low:
                lines.append("- σ's members part is the data's floor where the members scattered less than their "
                             "subsets of the data make them (with few members, often by chance; σ never goes below "
                             "the data's statistical error, stats.data_floor): " + ", ".join(low))
        lines += [f"- {c['message']}" for c in g["convergence"] if c["moving"] is not False]
    return lines


def t_note(u: dict[str, Any]) -> str:
    """One line: how sure sigma itself is, and the intervals to quote (Student's t, `stats.effective_dof`)."""
    if u["spread_from"] != "members":
        return "the intervals are ±σ and ±2σ: σ is not estimated from independent members (see the notes)"
    dof = [d for d in u["dof"] if d is not None]  # None: inf in JSON (no spread)
    k68 = [k for k, d in zip(u["k68"], u["dof"]) if d is not None]
    k95 = [k for k, d in zip(u["k95"], u["dof"]) if d is not None]
    if not dof:
        return "the intervals are ±σ and ±2σ"
    def rng(v, f):  # "a-b", or one value where both show the same; the dof of a sigma that the known parts (the
        # data's floor, the non-closure) set are huge and say nothing more than "over 100"; below 10, one decimal
        # (t's factors move fast there: 1.84 degrees of freedom give ±4.93σ at 95.4 %, 2 give ±4.53σ)
        lo, hi = (format(x, f) if f != "dof" else "over 100" if round(x) > 100 else
                  format(x, ".1f" if x < 9.95 else ".0f") for x in (min(v), max(v)))
        return lo if lo == hi else f"{lo} to {hi}" if hi == "over 100" else f"{lo}-{hi}"

    caveat = (" (but see the note below: σ holds no statistical error)"
              if any(stats.NO_STATISTICS in n for n in u["notes"]) else "")
    k = u["n_members"] - 1
    return (f"σ's spread part comes from {u['n_members']} members ({k} degree{'s' if k != 1 else ''} of freedom; σ "
            f"as a whole {rng(dof, 'dof')}, as its other parts, the data's floor, drift, noise and non-closure, are "
            f"not sampled from them), so σ is itself uncertain: the 68 % interval "
            f"is ±{rng(k68, '.2f')}σ and the 95.4 % interval ±{rng(k95, '.2f')}σ (Student's t; ±1σ and ±2σ with many "
            f"members){caveat}")


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _pm(p: float | None, sigma: float | None) -> str:
    """p ± sigma to quote: sigma to 4 significant digits and p to the same last decimal (p's own digits could
    round it by a sizeable part of sigma: 1.489571 ± 0.004042 shown as 1.49 moved it by 0.1 sigma)."""
    if p is None or sigma is None or not (math.isfinite(sigma) and sigma > 0) or not math.isfinite(p):
        return f"{_g(p)} ± {_g(sigma)}"
    decimals = max(0, 3 - math.floor(math.log10(sigma)))
    return f"{p:.{decimals}f} ± {_g(sigma)}"


def _f(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _write(path: str, text: str) -> None:
    from sagips.io.atomic import write_text

    write_text(path, text)  # a kill leaves the file complete or absent, as every output (README, "Outputs")


# ------------------------------------------------------------------------------------------------ main
def run_analysis(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from sagips.analysis import figures

    say = (lambda m: None) if not args.verbose else (lambda m: print(f"{PROG}: {m}", file=sys.stderr, flush=True))
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    runs = [load_run(p) for p in expand_run_dirs(args.run_dirs)]
    check_runs(runs)
    groups = group_runs(runs, args.group_by)
    for name, members in groups.items():
        for a, b in duplicate_seeds(members):
            print(f"{PROG}: warning: group {name!r}: {a.path} and {b.path} have the same seed and member index: they "
                  f"start from the same weights and data, so they are not independent members (use different --seed)",
                  file=sys.stderr)
    say(f"{len(runs)} run(s) in {len(groups)} group(s): "
        + ", ".join(f"{k} ({len(v)})" for k, v in groups.items()))
    series = [predict_group(name, members, args.noise_samples, args.seed, progress=say)
              for name, members in groups.items()]
    summary = build_summary(series, args)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise AnalysisError(f"--out {args.out}: cannot create it ({e.strerror})") from None
    made = figures.write_all(summary, args.out)
    summary["figures"] = made
    write_csv(summary, os.path.join(args.out, "summary.csv"))
    _write(os.path.join(args.out, "summary.md"), markdown(summary, made))
    _write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1) + "\n")
    return summary


def duplicate_seeds(runs) -> list[tuple[Any, Any]]:
    """Pairs of runs launched with the same base seed and member index (copies, not independent members)."""
    seen, pairs = {}, []
    for r in runs:
        key = ((r.info.get("config") or {}).get("seed"), r.info.get("member", 0))
        if key[0] is not None and key in seen:
            pairs.append((seen[key], r))
        seen.setdefault(key, r)
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = run_analysis(args)
    except AnalysisError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    files = ["summary.md", "summary.csv", "summary.json", *summary["figures"].values()]
    print(f"{PROG}: wrote {', '.join(files)} to {args.out}")
    print(markdown_table_only(summary))
    return 0


def markdown_table_only(summary: dict[str, Any]) -> str:
    """The p̂ ± σ section and the Table IV part of summary.md (where the data name their truth), for the terminal."""
    table = table_iv(summary) if truth_known(summary["groups"]) else []
    table = table[:table.index("")] if "" in table else table
    return "\n".join(quotable(summary)) + ("\n\n" + "\n".join(table) if table else "")


if __name__ == "__main__":
    sys.exit(main())
