"""The third-party example examples/toy1d on 4 ranks in rma-arar-arar with its shipped preset, against its statistical
floor on the same events.

    python benchmarks/toy1d.py [--ranks 4] [--inner-size 2] [--set KEY=VALUE ...] [--budget-min 5]

It registers examples/toy1d through a real `sagips.environments` entry point (a dist-info folder on PYTHONPATH, as
`pip install -e examples/toy1d` would leave one; an installed sagips-toy1d is used as it is), then runs

    mpiexec -n 4 python -m sagips.run --config toy1d:quick --set comm.inner_size=2 --set train.checkpoint_every=50

and turns every rank's checkpoints into the ensemble-mean prediction (eq. 7: all generators on the same 1,024 noise
vectors, averaged) against the accumulated training seconds per rank. The floor is what the data allow: the
unbinned maximum-likelihood fit of (a, b, c) on the same reference events (regenerated from the run's seed) and the
Fisher matrix N·I(p) at the truth. A prediction p^ is "at the floor" when its Mahalanobis distance to the truth,
d2 = (p^ - p)^T N I (p^ - p), is at most the 95% quantile of chi2 with 3 degrees of freedom (7.81): the truth is then
as compatible with the GAN's answer as the data can tell (the ML fit's own d2 is printed beside it).

Writes docs/benchmarks/toy1d.json and the page docs/benchmarks/toy1d.md, whole; notes by hand belong in
docs/benchmarks/toy1d.notes.md, which this script links and never writes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.loop_closure import machine  # noqa: E402
from tests._plugins import pythonpath, toy_site  # noqa: E402

D2_95 = 7.815  # chi2(3 dof) 95% quantile
OUT = ROOT / "docs" / "benchmarks"


def density_np(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The toy's density, written again in numpy (independent of the package's torch code)."""
    a, b, c = p
    return 1 + b * x + a * x * x * np.exp(-c * x)


def norm(p: np.ndarray) -> float:
    from scipy import integrate

    return integrate.quad(lambda x: density_np(p, np.asarray(x)), 0.0, 1.0, epsabs=1e-13, epsrel=1e-12)[0]


def fisher(p: np.ndarray) -> np.ndarray:
    """Per-event Fisher matrix I(p) = E[grad log f grad log f^T] (numerical gradients, fine quadrature grid)."""
    x = np.linspace(0.0, 1.0, 200_001)
    logpdf = lambda q: np.log(density_np(q, x) / norm(q))  # noqa: E731
    eps = 1e-6
    g = np.array([(logpdf(p + e) - logpdf(p - e)) / (2 * eps) for e in np.eye(3) * eps])
    pdf = np.exp(logpdf(p))
    return np.array([[np.trapezoid(g[i] * g[j] * pdf, x) for j in range(3)] for i in range(3)])


def ml_fit(events: np.ndarray, bounds, start: np.ndarray) -> np.ndarray:
    """Unbinned ML fit: minimise -sum log f(x_i; p) + N log Z(p) inside the bounds."""
    from scipy import optimize

    x = events.astype(np.float64)
    n = len(x)

    def nll(p):
        f = density_np(p, x)
        return np.inf if np.any(f <= 0) else -np.log(f).sum() + n * np.log(norm(p))

    res = optimize.minimize(nll, start, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-4,
                                                                        "maxiter": 4000})
    res = optimize.minimize(nll, res.x, method="L-BFGS-B", bounds=bounds)
    return res.x


def floor(cfg, seed: int) -> dict:
    from sagips.environment import get_environment

    env_cls = get_environment(cfg.name)
    from sagips.io.writer import generate_subset

    n = cfg.reference_events  # the file the ranks' subsets are taken from (sagips/io/writer.py)
    arrays, _ = generate_subset(env_cls, cfg, seed, n, np.array([[0, n]]))
    names = list(env_cls.parameters)
    truth = np.array([cfg.true_params[k] for k in names])
    events = arrays["events"][:, 0]
    t0 = time.time()
    p_ml = ml_fit(events, [tuple(cfg.bounds[k]) for k in names], truth)
    F = len(events) * fisher(truth)
    sigma = np.sqrt(np.diag(np.linalg.inv(F)))
    d = p_ml - truth
    return {"names": names, "truth": truth.tolist(), "events": int(len(events)), "p_ml": p_ml.tolist(),
            "r_ml": ((truth - p_ml) / truth).tolist(), "sigma": sigma.tolist(),
            "sigma_rel": (sigma / np.abs(truth)).tolist(), "d2_ml": float(d @ F @ d), "fisher_N": F.tolist(),
            "fit_s": round(time.time() - t0, 1)}


def series(run_dir: Path, F: np.ndarray) -> list[dict]:
    from sagips.analysis.ensemble import load_run, predict_group

    g = predict_group("run", [load_run(run_dir)], 1024, 0)
    truth = np.asarray(g.truth, dtype=np.float64)
    rows = []
    for t, epoch in enumerate(g.epochs):
        p = np.asarray(g.preds[t][0], dtype=np.float64).mean(0)
        r, d = (truth - p) / truth, p - truth
        rows.append({"epoch": int(epoch), "time_s": round(float(g.time_s[t]), 2), "p": [round(v, 5) for v in p],
                     "r": [round(float(v), 5) for v in r], "max_abs_r": round(float(np.abs(r).max()), 5),
                     "d2": round(float(d @ F @ d), 3)})
    return rows


def reached(points: list[dict]) -> dict:
    first = next((p for p in points if p["d2"] <= D2_95), None)
    stays = None
    for p in reversed(points):
        if p["d2"] > D2_95:
            break
        stays = p
    return {"first_at_floor_s": first["time_s"] if first else None, "first_at_floor_epoch": first and first["epoch"],
            "at_floor_from_s": stays["time_s"] if stays else None, "at_floor_from_epoch": stays and stays["epoch"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--inner-size", type=int, default=2)
    ap.add_argument("--budget-min", type=float, default=5.0, help="the figure's training-time budget per rank")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "toy1d-bench"))
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    import importlib.metadata as md

    installed = "toy1d" in {ep.name for ep in md.entry_points(group="sagips.environments")}
    paths = [] if installed else toy_site(Path(a.run_dir).parent / "toy1d-site")
    env = dict(os.environ, OMP_NUM_THREADS="1", **(pythonpath(paths) if paths else {}))
    for p in reversed(paths):
        sys.path.insert(0, p)
    sets = [f"comm.inner_size={a.inner_size}", "train.checkpoint_every=50", *a.set]
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(a.ranks), sys.executable, "-m", "sagips.run",
           "--config", "toy1d:quick", "--output-dir", a.run_dir, "--overwrite", "--no-progress",
           *[x for s in sets for x in ("--set", s)]]
    shown = " ".join(["mpiexec -n", str(a.ranks), "python -m sagips.run", *cmd[6:]]).replace(a.run_dir, "RUN_DIR")
    print(f"toy1d: {shown}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"toy1d: the run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    info = json.loads((Path(a.run_dir) / "run.json").read_text())
    from sagips.config import from_dict
    from sagips.environment import get_environment

    env_raw = dict(info["config"]["environment"])
    env_cls = get_environment(env_raw.pop("name"))
    cfg = from_dict(env_cls.Config, env_raw, "environment.")
    cfg.name = info["config"]["environment"]["name"]
    fl = floor(cfg, info["config"]["seed"])
    points = series(Path(a.run_dir), np.asarray(fl["fisher_N"]))
    toy_lines = len((ROOT / "examples" / "toy1d" / "sagips_toy1d" / "__init__.py").read_text().splitlines())
    result = {"command": shown, "ranks": a.ranks, "mode": info["mode"], "wall_s": round(wall, 1),
              "train_s": max(info["train_seconds"]), "epochs": info["epochs"], "startup_s": info.get("startup_s"),
              "precision": (info.get("precision") or {}).get("resolved"), "budget_s": a.budget_min * 60,
              "toy_package_python_lines": toy_lines, "floor": {k: v for k, v in fl.items() if k != "fisher_N"},
              "d2_95": D2_95, **reached(points), "final": points[-1], "points": points,
              "final_quality_logged": info.get("final_quality"), "machine": machine(),
              "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    out = Path(a.out)
    (out / "toy1d.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "toy1d.md").write_text(page(result))
    print(page(result))
    return 0


def page(r: dict) -> str:
    fl, m = r["floor"], r["machine"]
    names = fl["names"]
    ok = r["at_floor_from_s"] is not None and r["at_floor_from_s"] <= r["budget_s"]
    fmt = lambda v: "never" if v is None else f"{v:.0f} s"  # noqa: E731
    lines = [
        "# The third-party example `toy1d` on 4 ranks (rma-arar-arar) against its statistical floor", "",
        "Generated whole by `benchmarks/toy1d.py` from `toy1d.json`; notes by hand: [toy1d.notes.md](toy1d.notes.md).",
        "",
        f"- Package: `examples/toy1d` ({r['toy_package_python_lines']} lines of Python), registered through the "
        f"`sagips.environments` entry point; f(x) ∝ 1 + b·x + a·x²·e^(−c·x) on [0, 1].",
        f"- Command: `{r['command']}` (mode {r['mode']} from the preset `toy1d:quick`).",
        f"- Machine: {m['cpu_model']} ({', '.join(m['vector_flags']) or 'no vector flags found'}), {m['cores']} cores, "
        f"torch {m['torch']}, precision {r['precision']}; {r['ranks']} ranks share the cores.",
        f"- Run: {r['epochs']} epochs in {r['train_s']:.0f} s of training per rank (wall {r['wall_s']:.0f} s, "
        f"start-up {r['startup_s']} s); finished {r['finished']}.",
        "",
        "## The floor (the same reference events)", "",
        f"{fl['events']:,} events. Unbinned ML fit and the Fisher matrix N·I(p) at the truth; "
        f"d² = (p̂ − p)ᵀ N I (p̂ − p) ≤ {r['d2_95']} (χ², 3 dof, 95%) is \"at the floor\".", "",
        "| | " + " | ".join(names) + " | d² |", "|---|" + "---:|" * (len(names) + 1),
        "| truth | " + " | ".join(f"{v:g}" for v in fl["truth"]) + " | |",
        "| ML fit | " + " | ".join(f"{v:.4f}" for v in fl["p_ml"]) + f" | {fl['d2_ml']:.2f} |",
        "| ML residual (p − p̂)/p | " + " | ".join(f"{v:+.4f}" for v in fl["r_ml"]) + " | |",
        "| σ/abs(p) (Fisher) | " + " | ".join(f"{v:.4f}" for v in fl["sigma_rel"]) + " | |",
        "",
        "## The GAN (ensemble mean of the 4 ranks' generators)", "",
        f"**At the floor from {fmt(r['at_floor_from_s'])} of training per rank to the end** (first reached at "
        f"{fmt(r['first_at_floor_s'])}); budget {r['budget_s']:.0f} s: {'met' if ok else 'NOT met'}.", "",
        "| epoch | training s | " + " | ".join(f"p̂ {n}" for n in names) + " | max abs(r) | d² |",
        "|---:|---:|" + "---:|" * (len(names) + 2),
    ]
    pts = r["points"]
    step = max(1, len(pts) // 20)
    for p in pts[::step] + ([pts[-1]] if (len(pts) - 1) % step else []):
        lines.append(f"| {p['epoch']} | {p['time_s']:.0f} | " + " | ".join(f"{v:.4f}" for v in p["p"])
                     + f" | {p['max_abs_r']:.4f} | {p['d2']:.2f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
