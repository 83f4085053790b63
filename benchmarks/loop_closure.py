"""Loop closure of `make run`'s preset in every mode and at several truths, against the ML floor of the same events.

    python benchmarks/loop_closure.py [--modes rma-arar-arar,arar-arar,allreduce,ensemble]
                                      [--truths "default;0.967,-0.438,2.603,1.334,0.261,0.551;..."]
                                      [--ranks 4] [--inner-size 2] [--budget-min 15] [--set KEY=VALUE ...]

For every (mode, truth) part it runs

    mpiexec -n RANKS python -m sagips.run --config configs/proxy1d-quick.yaml --mode MODE --set comm.inner_size=2
        --set environment.true_params=[...] --set train.checkpoint_every=100

and turns the checkpoints of all ranks into max_i |r_i| of the ensemble-mean prediction (eqs. 6-7: every rank's
generator on the same 1024 noise vectors, averaged) against the accumulated training time per rank. Beside it, the
statistical floor of the same reference events: a maximum-likelihood fit of the 6 parameters (binned likelihood on
the sampler's own grid, exact for its piecewise-uniform density, with the two norms as equality constraints), and
that fit's own error sigma_ML (the observed information with the norms held): the page also gives each run's final
distance from the fit, (p^ - p_ML)/sigma_ML, which says whether it ends where the data point (max|r| only says how
near the truth, which the data themselves miss by their fluctuation).

Resumable: each finished part is one small JSON in docs/benchmarks/loop_closure/ and is skipped on the next call
(--redo runs it again). After every part the page docs/benchmarks/loop_closure.md and its figure are regenerated
whole from all the JSON files present; hand-written notes belong in docs/benchmarks/loop_closure_notes.md, which
this script never writes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import jobs  # noqa: E402
from sagips.config import load  # noqa: E402
from sagips.io import atomic  # noqa: E402
from sagips_environments.proxy1d import Proxy1D, theory  # noqa: E402

PRESET = "configs/proxy1d-quick.yaml"
MODES = ("rma-arar-arar", "arar-arar", "allreduce", "ensemble")
# the study's own truths: drawn once (numpy seed 2026) uniformly within 10%-90% of each parameter's range, |p_i| >= 0.25
STUDY_TRUTHS = ("default", "2.472,-0.516,3.111,1.016,0.747,4.179", "0.967,-0.438,2.603,1.334,0.261,0.551",
                "1.428,0.281,2.809,1.299,-0.797,3.676", "1.547,-0.278,2.5,0.524,0.648,4.459")
TARGET = 0.05
NOTES = "loop_closure_notes.md"


# ----------------------------------------------------------------------------------------------- the ML floor
def _binned(events: np.ndarray, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """The theory's grid and the events' counts per bin of it, per observable (2, bins): the binned likelihood is
    exact for the sampler's density (each observable drawn by its own uniform)."""
    x = theory.make_grid(cfg.grid_points, cfg.x_min, cfg.x_max, dtype=torch.float64)
    counts = []
    for k in range(2):
        idx = np.clip(np.searchsorted(x.numpy(), events[:, k], side="right") - 1, 0, len(x) - 2)
        counts.append(np.bincount(idx, minlength=len(x) - 1))
    return x, torch.tensor(np.stack(counts), dtype=torch.float64)


def _nll(p: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The binned negative log-likelihood of the counts at parameters p (6,), summed over all events' bins."""
    _, cdf = theory.norms_and_cdf(p[None], x)
    return -(counts * torch.log((cdf[0, :, 1:] - cdf[0, :, :-1]).clamp_min(1e-300))).sum()


def _norms(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The theory's two norms at parameters p (6,): what the fit holds at the reference's."""
    return theory.norms_and_cdf(p[None], x)[0][0]


def ml_fit(events: np.ndarray, norms: np.ndarray, cfg, start: np.ndarray) -> np.ndarray:
    """Maximum-likelihood parameters for events (N, 2) with the reference norms as constraints."""
    return ml_fit_counts(*_binned(events, cfg), norms, cfg, start)


def ml_fit_counts(x: torch.Tensor, counts: torch.Tensor, norms: np.ndarray, cfg, start: np.ndarray,
                  ftol: float = 1e-14) -> np.ndarray:
    """`ml_fit` on the events' counts (2, bins) in the bins of the theory's grid x (`_binned`). ftol: SLSQP's goal on
    the NLL per event; 1e-11 moves a fit of 1M events by at most ~0.05 of its bound and takes a third of the time."""
    from scipy import optimize

    n_tot = counts.sum()
    ref = torch.tensor(norms, dtype=torch.float64)

    def nll(p_np):
        p = torch.tensor(p_np, dtype=torch.float64, requires_grad=True)
        val = _nll(p, x, counts) / n_tot
        val.backward()
        return val.item(), p.grad.numpy().copy()

    def cons(p_np):
        p = torch.tensor(p_np, dtype=torch.float64)
        return (_norms(p, x) - ref).numpy()

    def cons_jac(p_np):
        p = torch.tensor(p_np, dtype=torch.float64)
        return torch.autograd.functional.jacobian(lambda q: _norms(q, x), p).numpy()

    bounds = list(zip(np.array(cfg.param_min) + 1e-3, np.array(cfg.param_max) - 1e-3))
    res = optimize.minimize(nll, start, jac=True, method="SLSQP", bounds=bounds,
                            constraints=[{"type": "eq", "fun": cons, "jac": cons_jac}],
                            options={"maxiter": 500, "ftol": ftol})
    return res.x


def ml_covariance(events: np.ndarray, cfg, p: np.ndarray) -> np.ndarray:
    """Covariance (6, 6) of the ML fit at p: the inverse of the observed information (the Hessian of the binned
    NLL) in the directions that keep both norms, which the fit holds fixed: V = Z (Z^T H Z)^-1 Z^T, Z an orthonormal
    basis of the null space of the norms' Jacobian."""
    return _covariance(*_binned(events, cfg), p)


def _covariance(x: torch.Tensor, counts: torch.Tensor, p: np.ndarray) -> np.ndarray:
    from scipy.linalg import null_space

    p = torch.as_tensor(p, dtype=torch.float64)
    h = torch.autograd.functional.hessian(lambda q: _nll(q, x, counts), p).numpy()
    c = torch.autograd.functional.jacobian(lambda q: _norms(q, x), p).numpy()
    z = null_space(c)
    return z @ np.linalg.inv(z.T @ h @ z) @ z.T


def floor(env_cfg, seed: int) -> dict:
    """The ML fit on the very reference events that the run's ranks take their subsets from (same config, same seed:
    the file that `python -m sagips.data` would write, sagips/io/writer.py)."""
    from sagips.io.writer import generate_subset

    truth = np.array(env_cfg.true_params)
    n = env_cfg.reference_events
    arrays, attrs = generate_subset(Proxy1D, env_cfg, seed, n, np.array([[0, n]]))
    lo, hi = np.array(env_cfg.param_min), np.array(env_cfg.param_max)
    start = np.clip(truth * 1.05, lo + 0.01 * (hi - lo), hi - 0.01 * (hi - lo))
    x, counts = _binned(arrays["events"], env_cfg)
    fit = ml_fit_counts(x, counts, attrs["norms"], env_cfg, start)
    r = (truth - fit) / truth
    return {"events": len(arrays["events"]), "ml_params": fit.tolist(), "r": r.tolist(),
            "max_abs_r": float(np.abs(r).max()),
            # the ML fit's own error (the data's): how far from it a run may end by chance (`from_ml`)
            "ml_sigma": np.sqrt(np.diag(_covariance(x, counts, fit))).tolist()}


def from_ml(part: dict, fl: dict) -> np.ndarray | None:
    """(p̂ - p_ML) / sigma_ML (6,) of a part's final ensemble mean: its distance from the ML fit on the same events
    in units of that fit's error, or None for a floor from before `ml_sigma`."""
    if not fl or not fl.get("ml_sigma"):
        return None
    truth = np.asarray(part["truth"], dtype=np.float64)
    p_hat = truth * (1 - np.asarray(part["points"][-1]["r"], dtype=np.float64))  # r = (truth - p̂) / truth
    return (p_hat - np.asarray(fl["ml_params"])) / np.asarray(fl["ml_sigma"])


# ----------------------------------------------------------------------------------------------- one part
def truth_key(truth: str) -> str:
    return "default" if truth == "default" else "p" + "_".join(f"{float(v):g}" for v in truth.split(","))


def series(run_dir: Path, noise_samples: int = 1024) -> dict:
    """max|r| of the ensemble mean (all ranks' generators, the same noise) at every checkpoint."""
    from sagips.analysis.ensemble import load_run, predict_group

    g = predict_group("run", [load_run(run_dir)], noise_samples, 0)
    truth = np.asarray(g.truth, dtype=np.float64)
    rows = []
    for t, epoch in enumerate(g.epochs):
        r = (truth - np.asarray(g.preds[t][0], dtype=np.float64).mean(0)) / truth
        rows.append({"epoch": int(epoch), "time_s": float(g.time_s[t]), "max_abs_r": float(np.abs(r).max()),
                     "r": [round(float(v), 5) for v in r]})
    return {"truth": truth.tolist(), "points": rows}


def crossing(points: list[dict], target: float = TARGET) -> dict:
    """First time at or below the target, the time from which it stays below to the end, and the final value."""
    first = next((p for p in points if p["max_abs_r"] <= target), None)
    stays = None
    for p in reversed(points):
        if p["max_abs_r"] > target:
            break
        stays = p
    return {"first_below_s": first["time_s"] if first else None, "first_below_epoch": first["epoch"] if first else None,
            "below_from_s": stays["time_s"] if stays else None, "below_from_epoch": stays["epoch"] if stays else None,
            "final_max_abs_r": points[-1]["max_abs_r"] if points else None,
            "final_time_s": points[-1]["time_s"] if points else None}


def run_part(mode: str, truth: str, a, run_dir: Path) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    sets = [f"comm.inner_size={a.inner_size}", f"train.checkpoint_every={a.checkpoint_every}", *a.set]
    if truth != "default":
        sets.append(f"environment.true_params=[{truth}]")
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(a.ranks), sys.executable, "-m", "sagips.run",
           "--config", PRESET, "--mode", mode, "--output-dir", str(run_dir), "--overwrite", "--no-progress",
           "--set", "ensemble.analyze=false",  # (wall_s is the run's; this study analyses the checkpoints itself)
           *[x for s in sets for x in ("--set", s)]]
    shown = " ".join(["mpiexec -n", str(a.ranks), "python", *cmd[4:]])
    print(f"loop_closure: {mode} at truth {truth}: {shown}", flush=True)
    t0 = time.time()
    # under `timeout`, and stopped with the script (benchmarks/jobs.py): no rank outlives the part
    limit = max(1, round(a.timeout_min * 60))
    proc = jobs.run_job(["timeout", "--kill-after=10", str(limit), *cmd], dict(os.environ, OMP_NUM_THREADS="1"), ROOT)
    wall = time.time() - t0
    if proc.returncode == 124 or (proc.returncode == 137 and wall >= limit):  # (137 alone: a rank killed, e.g. OOM)
        raise SystemExit(f"loop_closure: the run at truth {truth} ran past --timeout-min {a.timeout_min:g} and was "
                         "stopped; raise --timeout-min")
    if proc.returncode != 0:
        raise SystemExit(f"loop_closure: the run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    info = json.loads((run_dir / "run.json").read_text())
    s = series(run_dir)
    return {"mode": mode, "truth_arg": truth, "truth": s["truth"], "command": shown, "ranks": a.ranks,
            "wall_s": round(wall, 1), "train_s": max(info["train_seconds"]), "epochs": info["epochs"],
            "startup_s": info.get("startup_s"), "precision": info.get("precision"),
            "final_quality_logged": info.get("final_quality"), "points": s["points"], **crossing(s["points"]),
            "machine": machine(),
            "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


# ----------------------------------------------------------------------------------------------- the machine
def machine() -> dict:
    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        model = m.group(1).strip() if m else model
        f = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        flags = sorted(x for x in (f.group(1).split() if f else [])
                       if re.match(r"^(avx|fma|amx|f16c|sse4_2)", x))
    except OSError:
        pass
    from sagips.precision import cpu_capability, cpu_native_bf16

    return {"cpu_model": model, "vector_flags": flags, "torch_cpu_capability": cpu_capability(),
            "native_bf16": cpu_native_bf16(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "torch": torch.__version__}


# ----------------------------------------------------------------------------------------------- page and figure
def plot(parts: list[dict], floors: dict, truths: list[str], budget_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(truths)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    colors = {m: c for m, c in zip(MODES, ("tab:blue", "tab:orange", "tab:green", "tab:purple"))}
    t_max = max([budget_s] + [q["time_s"] for p in parts for q in p["points"]]) / 60
    for k, truth in enumerate(truths):
        ax = axes[k // cols][k % cols]
        for p in (p for p in parts if p["truth_arg"] == truth):
            t = np.array([q["time_s"] for q in p["points"]]) / 60
            ax.plot(t, [q["max_abs_r"] for q in p["points"]], color=colors.get(p["mode"]), lw=1.2, label=p["mode"])
        ax.axhline(TARGET, color="k", ls="--", lw=0.9, label=f"target {TARGET}")
        fl = floors.get(truth)
        if fl:
            ax.axhline(fl["max_abs_r"], color="tab:red", ls=":", lw=1.2, label="ML fit on the same events")
        ax.axvline(budget_s / 60, color="gray", lw=0.8, label=f"{budget_s / 60:.0f} min")
        ax.set_yscale("log")
        ax.set_xlim(0, 1.05 * t_max)
        ax.set_title(f"T{k}: " + ("default truth" if truth == "default" else truth), fontsize=8)
        ax.set_xlabel("training time per rank [min]", fontsize=8)
        if k % cols == 0:
            ax.set_ylabel("max$_i$ |r̂$_i$| of the ensemble mean", fontsize=8)
        ax.tick_params(labelsize=7)
    for k in range(n, rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    # the legend lives below the panels and the figure is saved around everything it holds: nothing is cut off
    fig.legend([handles[lab] for lab in labels], labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def fmt_s(v) -> str:
    return "—" if v is None else f"{v:.0f} s ({v / 60:.1f} min)"


def describe_machine(m: dict) -> str:
    return (f"**{m['cpu_model']}**, {m['cores']} cores, vector flags {' '.join(m['vector_flags'])}; torch "
            f"{m['torch']} dispatches **{m['torch_cpu_capability']}**, native bf16: {'yes' if m['native_bf16'] else 'no'}")


def extra_sets(parts: list[dict]) -> list[str]:
    """The --set settings the parts ran with beyond the script's own (a variant of the preset), from their commands:
    a page rebuilt with --page-only names them too."""
    own = ("comm.inner_size=", "train.checkpoint_every=", "environment.true_params=", "ensemble.analyze=")
    return sorted({x for p in parts for x in re.findall(r"--set (\S+)", p.get("command", "")) if not x.startswith(own)})


def out_arg(a) -> str:
    """' --out DIR' for a page written elsewhere than docs/benchmarks (a variant), relative to the repository."""
    out = Path(getattr(a, "out", ROOT / "docs" / "benchmarks")).resolve()
    if out == (ROOT / "docs" / "benchmarks").resolve():
        return ""
    return f" --out {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"


def write_page(parts: list[dict], floors: dict, truths: list[str], a, path: Path) -> None:
    machines = []
    for p in parts:
        text = describe_machine(p["machine"])
        if text not in machines:
            machines.append(text)
    if not machines:
        where = "Machine: no part has run yet."
    elif len(machines) == 1:
        where = "Machine: " + machines[0] + "."
    else:
        where = "Machines (the parts ran on more than one; each part's JSON names its own):\n\n" + "\n".join(
            f"- {m}" for m in machines)
    lines = [
        "# Loop closure of `make run`'s preset: every mode, several truths, against the ML floor",
        "",
        "<!-- generated whole by benchmarks/loop_closure.py; hand-written notes go into "
        f"{NOTES}, which the script never writes -->",
        "",
        where,
        "",
        f"Each part runs `{PRESET}` (the preset of `make run`) on {a.ranks} ranks (groups of {a.inner_size}), "
        "1 torch thread per rank, with a generator checkpoint every "
        f"{a.checkpoint_every} epochs. max|r̂| is the ensemble mean of eqs. 6-7: every rank's generator on the same "
        "1,024 noise vectors, averaged, against the truth. The floor is the maximum-likelihood fit on the same "
        "reference events. Command:",
        "",
        "    python benchmarks/loop_closure.py --modes " + ",".join(a.modes) + " --truths \"" + ";".join(truths) + "\""
        + "".join(f" --set {x}" for x in extra_sets(parts))
        + out_arg(a),
        "",
        f"Target: max\\|r̂\\| ≤ {TARGET} within {a.budget_min:.0f} min of training per rank, and below it to the end.",
        "",
        "| truth | mode | precision | start-up | epochs | training per rank | first ≤ 0.05 | ≤ 0.05 from | final max\\|r̂\\| "
        "| ML floor | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    budget = a.budget_min * 60
    for k, truth in enumerate(truths):
        fl = floors.get(truth)
        for mode in a.modes:
            p = next((p for p in parts if p["truth_arg"] == truth and p["mode"] == mode), None)
            if p is None:
                lines.append(f"| T{k} | {mode} | not run yet | | | | | | | | |")
                continue
            met = (p["below_from_s"] is not None and p["below_from_s"] <= budget)
            prec = (p.get("precision") or {}).get("resolved", "?")
            st = p.get("startup_s")
            lines.append(
                f"| T{k} | {mode} | {prec} | {'—' if st is None else f'{st:.1f} s'} | {p['epochs']} | "
                f"{p['train_s']:.0f} s | {fmt_s(p['first_below_s'])} | {fmt_s(p['below_from_s'])} | "
                f"**{p['final_max_abs_r']:.4f}** | {fl['max_abs_r']:.4f} | {'met' if met else 'missed'} |"
                if fl else
                f"| T{k} | {mode} | {prec} | {'—' if st is None else f'{st:.1f} s'} | {p['epochs']} | "
                f"{p['train_s']:.0f} s | {fmt_s(p['first_below_s'])} | {fmt_s(p['below_from_s'])} | "
                f"**{p['final_max_abs_r']:.4f}** | — | {'met' if met else 'missed'} |")
    lines += ["", "Truths:", ""]
    for k, truth in enumerate(truths):
        p = next((p for p in parts if p["truth_arg"] == truth), None)
        vals = p["truth"] if p else (list(theory.TRUE_PARAMS) if truth == "default" else
                                     [float(v) for v in truth.split(",")])
        lines.append(f"- T{k}: " + ("default " if truth == "default" else "") +
                     ("(" + ", ".join(f"{v:g}" for v in vals) + ")" if vals else ""))
    lines += ["", "![loop closure](loop_closure.png)", "",
              "Final residuals r̂ of the ensemble mean, and of the ML fit on the same events:", "",
              "| truth | mode | r̂0 | r̂1 | r̂2 | r̂3 | r̂4 | r̂5 |", "|---|---|---|---|---|---|---|---|"]
    for k, truth in enumerate(truths):
        for p in (p for p in parts if p["truth_arg"] == truth):
            lines.append(f"| T{k} | {p['mode']} | " + " | ".join(f"{v:+.4f}" for v in p["points"][-1]["r"]) + " |")
        fl = floors.get(truth)
        if fl:
            lines.append(f"| T{k} | ML floor | " + " | ".join(f"{v:+.4f}" for v in fl["r"]) + " |")
    lines += ["", "The ensemble mean's distance from the ML fit on the same events, (p̂ − p_ML)/σ_ML, in units of "
              "that fit's error (the data's, from its observed information with the norms held): max\\|r̂\\| "
              "says how near the truth a run ends, this says whether it ends where the data point. A run's ranks train "
              "on random halves of the data, with noise: one run of 4 ranks ended 0.4-1.2 σ_ML (rms) from the ML fit "
              "over the calibration's data sets (coverage.md, one run). The same sign at every truth is a bias:",
              "",
              "| truth | mode | p0 | p1 | p2 | p3 | p4 | p5 |", "|---|---|---|---|---|---|---|---|"]
    for k, truth in enumerate(truths):
        for p in (p for p in parts if p["truth_arg"] == truth):
            d = from_ml(p, floors.get(truth))
            lines.append(f"| T{k} | {p['mode']} | " + (" | ".join(f"{v:+.2f}" for v in d) if d is not None else
                                                     "(a floor from before σ_ML: rerun the script) | | | | |") + " |")
    lines += ["", "Parts finished: " + ", ".join(sorted(p["finished"] for p in parts)) if parts else "", "",
              f"Notes and the history of earlier runs: [{NOTES}]({NOTES}).", ""]
    atomic.write_text(path, "\n".join(lines))


# ----------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated modes (default: all four)")
    ap.add_argument("--truths", default=";".join(STUDY_TRUTHS),
                    help="';'-separated truths: 'default' or six comma-separated values (default: the study's five)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--inner-size", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--budget-min", type=float, default=15.0)
    ap.add_argument("--timeout-min", type=float, default=60.0, help="kill a part that runs longer than this")
    ap.add_argument("--set", action="append", default=[], help="extra --set KEY=VALUE for every run")
    ap.add_argument("--redo", action="store_true", help="run the parts again even where results exist")
    ap.add_argument("--page-only", action="store_true", help="only regenerate the page and figure from the JSON")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    ap.add_argument("--runs", default=str(ROOT / "runs" / "loop_closure"))
    a = ap.parse_args()
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
    truths = [t.strip().replace(" ", "") for t in a.truths.split(";") if t.strip()]
    for t in truths:
        if t != "default" and len(t.split(",")) != 6:
            ap.error(f"truth {t!r}: give 'default' or six comma-separated numbers")
    out, parts_dir = Path(a.out), Path(a.out) / "loop_closure"
    parts_dir.mkdir(parents=True, exist_ok=True)

    for truth in truths if not a.page_only else []:
        key = truth_key(truth)
        fpath = parts_dir / f"floor__{key}.json"
        if not fpath.exists() or "ml_sigma" not in json.loads(fpath.read_text()):  # (older floors: sigma added)
            sets = a.set + ([f"environment.true_params=[{truth}]"] if truth != "default" else [])
            cfg = load(str(ROOT / PRESET), sets)
            t0 = time.time()
            fl = floor(cfg.environment, cfg.seed)
            fl["seconds"] = round(time.time() - t0, 1)
            atomic.write_text(fpath, json.dumps(fl, indent=1) + "\n")
            print(f"loop_closure: ML floor at truth {truth}: max|r| {fl['max_abs_r']:.4f}", flush=True)
        for mode in a.modes:
            ppath = parts_dir / f"{mode}__{key}.json"
            if ppath.exists() and not a.redo:
                continue
            with jobs.stops_on_sigterm():  # a kill of the script stops the part's ranks too
                part = run_part(mode, truth, a, Path(a.runs) / mode / key)
            atomic.write_text(ppath, json.dumps(part, indent=1) + "\n")
            print(f"loop_closure: {mode} at truth {truth}: first <= {TARGET} at {fmt_s(part['first_below_s'])}, "
                  f"below from {fmt_s(part['below_from_s'])}, final {part['final_max_abs_r']:.4f} after "
                  f"{part['train_s']:.0f} s", flush=True)
            render(a, truths, out, parts_dir)
    render(a, truths, out, parts_dir)
    return 0


def render(a, truths: list[str], out: Path, parts_dir: Path) -> None:
    keys = {truth_key(t): t for t in truths}
    parts, floors = [], {}
    for f in sorted(parts_dir.glob("*.json")):
        d = json.loads(f.read_text())
        kind, key = f.stem.split("__", 1)
        if key not in keys:
            continue
        if kind == "floor":
            floors[keys[key]] = d
        elif kind in a.modes:
            parts.append(d)
    plot(parts, floors, truths, a.budget_min * 60, out / "loop_closure.png")
    write_page(parts, floors, truths, a, out / "loop_closure.md")


if __name__ == "__main__":
    sys.exit(main())
