"""The paper's two claims, measured with ensembles (issue 20): Table IV / Fig. 13 (SAGIPS against a Horovod-style
GAN) and Figs. 14-16 / eq. 10 (N ranks with the batch split against one rank with the whole batch).

    python benchmarks/paper_table4.py            # the study: M = 5 runs per column, 400 epochs (~70 min, 2 cores)
    python benchmarks/paper_table4.py --quick    # M = 2, 200 epochs (under 20 min)
    python benchmarks/paper_table4.py --smoke    # M = 1, 3 epochs, 2 ranks: the plumbing (the test suite)
    python benchmarks/paper_table4.py --columns hvd,arar   # only these columns (the page: every finished one)
    python benchmarks/paper_table4.py --profile converge   # issue 37: the preset's full 4,000 epochs, equal epochs
                                                            # and equal time (benchmarks/paper_table4_converge.py)

Part A, Table IV / Fig. 13: N = RANKS ranks (4, as 2 groups of 2), the quick preset (configs/proxy1d-quick.yaml)
with the same epochs for every column, and the paper's outer period scaled to the run: h = epochs / 100 (the paper:
1,000 of 100,000). Columns:
    hvd             the paper's Horovod baseline (generator and critic gradients averaged, every rank on all data)
    rma-arar-arar   SAGIPS (RMA inner groups)           arar-arar   SAGIPS (ring inner groups)
    arar            conventional ARAR (one ring)        ensemble    single-rank GANs: one launch of RANKS ranks
                                                                    with --ensemble-size RANKS (each rank its own run)
    arar-arar-weights   arar-arar with comm.outer_sync=weights
Part B, Figs. 14-16: N = 1 with the whole batch (one launch of 2 ranks with --ensemble-size 2: two independent
single-rank runs, each on its own core) against N = 2 with train.split_batch (eq. 10) in arar and rma-arar-arar.
Every run of part B uses one torch thread per rank, so that one rank is one core, as one rank is one GPU.

Runs are interleaved (round k runs every column once) so that machine load hits the columns alike; a run whose
run.json says complete is skipped, so the script resumes after a restart. Every run keeps its checkpoints in
--runs (sagips.analyze can redo any figure: `python -m sagips.analyze --group-by label RUNS/*/*`). Each finished
run also leaves a small JSON in docs/benchmarks/paper_table4/ (its wall time), and the page
docs/benchmarks/paper_table4.md with its figures is written from the analysis of all finished runs. Hand-written
notes belong in docs/benchmarks/paper_table4_notes.md, which this script never writes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRESET = "configs/proxy1d-quick.yaml"
#: the paper's Table IV (8 GPUs, ensembles of 20): residual and 1 sigma in units of 1e-3, r0..r5
PAPER_TABLE4 = {
    "hvd": [(95, 53), (94, 54), (26, 17), (212, 128), (138, 85), (99, 60)],
    "rma-arar-arar": [(5, 9), (6, 14), (1, 10), (24, 21), (17, 22), (11, 8)],
    "arar-arar": [(3, 14), (8, 12), (0, 16), (20, 19), (14, 23), (9, 9)],
    "arar": [(2, 9), (3, 13), (0, 9), (26, 18), (18, 20), (11, 7)],
}
TABLE_COLUMNS = ("hvd", "rma-arar-arar", "arar-arar", "arar", "ensemble", "arar-arar-weights")
SPLIT_COLUMNS = ("N1-whole-batch", "N2-arar-split", "N2-rma-split")
PROFILES = {  # runs per column, epochs, ranks of part A, checkpoint period
    "full": {"runs": 5, "epochs": 400, "ranks": 4, "checkpoint_every": 25},
    "quick": {"runs": 2, "epochs": 200, "ranks": 4, "checkpoint_every": 25},
    "smoke": {"runs": 1, "epochs": 3, "ranks": 2, "checkpoint_every": 1},
}
SMALL = ["environment.reference_events=20000", "environment.param_samples=16", "environment.events_per_sample=20",
         "train.quality_samples=16", "train.log_every=1"]  # --smoke only: seconds, not physics


def column_launch(col: str, prof: dict) -> tuple[int, list[str]]:
    """(ranks, sagips.run arguments besides the output directory and seed) of one run of column `col`."""
    n, e = prof["ranks"], prof["epochs"]
    h = prof.get("outer_every") or max(1, e // 100)  # converge: the preset's own h; else the paper's h/epochs
    inner = max(1, n // 2)
    common = ["--epochs", str(e), "--set", f"train.checkpoint_every={prof['checkpoint_every']}",
              "--set", "train.state_every=100000", "--set", f"label={col}"]
    grouped = ["--set", f"comm.inner_size={inner}", "--set", f"comm.outer_every={h}"]
    table = {
        "hvd": ["--mode", "hvd"],
        "rma-arar-arar": ["--mode", "rma-arar-arar", *grouped],
        "arar-arar": ["--mode", "arar-arar", *grouped],
        "arar": ["--mode", "arar"],
        "ensemble": ["--mode", "ensemble", "--ensemble-size", str(n)],
        "arar-arar-weights": ["--mode", "arar-arar", *grouped, "--set", "comm.outer_sync=weights"],
    }
    if col in table:
        return n, common + table[col]
    one = ["--set", "train.threads=1"]
    split = {
        "N1-whole-batch": (2, ["--mode", "ensemble", "--ensemble-size", "2", *one]),
        "N2-arar-split": (2, ["--mode", "arar", "--set", "train.split_batch=true", *one]),
        "N2-rma-split": (2, ["--mode", "rma-arar-arar", "--set", "comm.inner_size=2", "--set", "train.split_batch=true",
                             *one]),
    }
    ranks, args = split[col]
    return ranks, common + args


def run_dirs(out: Path) -> list[Path]:
    """The sagips.run output directories under one launch's directory (its members, or itself)."""
    members = sorted(p for p in out.glob("member[0-9][0-9][0-9]") if p.is_dir())
    return members or [out]


def complete(out: Path) -> bool:
    try:
        return all(json.loads((d / "run.json").read_text()).get("status") == "complete" for d in run_dirs(out))
    except (OSError, ValueError):
        return False


def run_command(n: int, args: list[str], out: Path, seed: int, extra: list[str]) -> list[str]:
    """The mpiexec command line of one launch of `n` ranks (sagips.run arguments `args`, then `--set` of `extra`)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"  # the venv's (pip's mpich), else the one on PATH
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n), sys.executable, "-m", "sagips.run",
           "--config", PRESET, "--no-progress", "--overwrite", "--output-dir", str(out), "--seed", str(seed), *args,
           "--set", "ensemble.analyze=false"]  # (a run's own p^ +- sigma: this study's analysis follows, over them all)
    for s in extra:
        cmd += ["--set", s]
    return cmd


def printable(cmd: list[str]) -> str:
    """A launch's command as the page quotes it (no local paths)."""
    return " ".join(["mpiexec", *cmd[1:]]).replace(sys.executable, "python").replace(str(ROOT) + "/", "")


def launch(col: str, k: int, prof: dict, runs: Path, results: Path, extra: list[str], timeout_s: float) -> dict:
    """Run (or skip, when complete) run k of column col; its small JSON record."""
    out = runs / col / f"s{k}"
    rec_path = results / f"{col}__s{k}.json"
    if complete(out) and rec_path.exists():
        return json.loads(rec_path.read_text())
    n, args = column_launch(col, prof)
    cmd = run_command(n, args, out, 1000 + k, extra)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"paper_table4: {col} run {k} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    infos = [json.loads((d / "run.json").read_text()) for d in run_dirs(out)]
    rec = {"column": col, "run": k, "ranks": n, "command": printable(cmd),
           "wall_s": round(wall, 1), "train_s_per_rank": round(float(np.mean([np.mean(i["train_seconds"])
                                                                               for i in infos])), 1),
           "members": len(infos), "epochs": infos[0]["epochs"], "batch": infos[0].get("batch"),
           "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    results.mkdir(parents=True, exist_ok=True)
    rec_path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


# ----------------------------------------------------------------------------------------------- the analysis
def analyse(runs: Path, cols: tuple[str, ...], prof: dict, out: Path) -> dict | None:
    """sagips.analyze over every complete run of `cols`, grouped by label (one group per column)."""
    dirs = [d for c in cols for launch_dir in sorted((runs / c).glob("s*")) if complete(launch_dir)
            for d in run_dirs(launch_dir)]
    if not dirs:
        return None
    import contextlib
    import io

    from sagips.analyze import main as analyze_main

    with contextlib.redirect_stdout(io.StringIO()):  # its table is on the page; keep the progress lines readable
        rc = analyze_main(["--group-by", "label", "--out", str(out), "--noise-samples", "256", "--resamples", "50",
                           *map(str, dirs)])
    if rc != 0:
        raise SystemExit(f"paper_table4: sagips.analyze failed on {out}")
    return json.loads((out / "summary.json").read_text())


def max_abs(g: dict) -> np.ndarray:
    """max_i |r_i| of the ensemble mean at each time step of one group."""
    return np.abs(np.asarray(g["residual"])).max(axis=1)


def first_time_below(g: dict, level: float) -> float | None:
    for t, v in zip(g["time_s"], max_abs(g)):
        if v <= level:
            return float(t)
    return None


def verdicts(table: dict | None, split: dict | None) -> dict:
    v = {}
    if table:
        groups = {g["name"]: g for g in table["groups"]}
        if "hvd" in groups:
            hvd = np.abs(np.asarray(groups["hvd"]["final"]["residual_1e3"]))
            for c in ("rma-arar-arar", "arar-arar", "arar"):
                if c in groups:
                    mine = np.abs(np.asarray(groups[c]["final"]["residual_1e3"]))
                    v[f"{c}_vs_hvd"] = {"better_on": int((mine < hvd).sum()), "of": len(hvd),
                                        "ratio_max_abs": float(hvd.max() / max(mine.max(), 1e-9)),
                                        "ratio_rms": float(np.sqrt((hvd ** 2).mean() / max((mine ** 2).mean(), 1e-18)))}
        if "arar-arar" in groups and "arar-arar-weights" in groups:
            g, w = (np.abs(np.asarray(groups[c]["final"]["residual_1e3"])) for c in ("arar-arar", "arar-arar-weights"))
            v["weights_vs_gradients"] = {"max_abs_gradients": float(g.max()), "max_abs_weights": float(w.max()),
                                         "rms_gradients": float(np.sqrt((g ** 2).mean())),
                                         "rms_weights": float(np.sqrt((w ** 2).mean()))}
    if split:
        groups = {g["name"]: g for g in split["groups"]}
        one = groups.get("N1-whole-batch")
        if one:
            level = float(max_abs(one)[-1])
            for c in ("N2-arar-split", "N2-rma-split"):
                if c in groups:
                    t = first_time_below(groups[c], level)
                    v[f"{c}_vs_N1"] = {"N1_final_max_abs": level, "N1_time_s": float(one["time_s"][-1]),
                                       "N2_reaches_at_s": t, "N2_final_max_abs": float(max_abs(groups[c])[-1]),
                                       "N2_time_s": float(groups[c]["time_s"][-1])}
    return v


# ----------------------------------------------------------------------------------------------- page and figures
def figures(table: dict | None, split: dict | None, docs: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if table:
        gs = table["groups"]
        fig, axes = plt.subplots(1, len(gs), figsize=(3.0 * len(gs), 3.0), sharey=True, squeeze=False)
        for ax, g in zip(axes[0], gs):
            t = np.asarray(g["time_s"]) / 60
            r0, s0 = np.asarray(g["residual"])[:, 0], np.asarray(g["residual_sigma"])[:, 0]
            ax.plot(t, r0, color="tab:blue")
            ax.fill_between(t, r0 - s0, r0 + s0, color="tab:blue", alpha=0.25)
            ax.axhline(0, color="k", lw=0.6)
            ax.set_title(f"{g['name']} (M={g['n_runs']})", fontsize=9)
            ax.set_xlabel("training time per rank [min]")
        axes[0][0].set_ylabel("r̂_0 (ensemble mean ± 1σ)")
        fig.tight_layout()
        fig.savefig(docs / "paper_table4_fig13.png", dpi=110)
        plt.close(fig)
        made.append("paper_table4_fig13.png")
    if split:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for g in split["groups"]:
            ax.plot(np.asarray(g["time_s"]) / 60, max_abs(g), marker=".", label=f"{g['name']} (M={g['n_runs']})")
        ax.set_yscale("log")
        ax.set_xlabel("training time per rank [min]")
        ax.set_ylabel("max_i |r̂_i| of the ensemble mean")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(docs / "paper_table4_fig14.png", dpi=110)
        plt.close(fig)
        made.append("paper_table4_fig14.png")
    return made


def _col_walls(results: Path, col: str) -> tuple[float, float, int]:
    recs = [json.loads(p.read_text()) for p in sorted(results.glob(f"{col}__s*.json"))]
    if not recs:
        return float("nan"), float("nan"), 0
    return (float(np.mean([r["wall_s"] for r in recs])), float(np.mean([r["train_s_per_rank"] for r in recs])),
            len(recs))


def page(table: dict | None, split: dict | None, prof_name: str, prof: dict, results: Path, docs: Path,
         machine: dict) -> str:
    v = verdicts(table, split)
    made = figures(table, split, docs)
    L = ["# The paper's Table IV and Figs. 13-16, measured (issue 20)", "",
         f"Generated by `benchmarks/paper_table4.py{'' if prof_name == 'full' else ' --' + prof_name}` from the runs' "
         f"checkpoints (analysis: `sagips.analyze --group-by label`); hand-written notes: "
         f"[paper_table4_notes.md](paper_table4_notes.md).", "",
         f"Machine: **{machine['cpu_model']}**, {machine['cores']} cores, torch {machine['torch']} "
         f"({machine['torch_cpu_capability']}). Profile `{prof_name}`: {prof['runs']} run(s) per column, "
         f"{prof['epochs']} epochs, part A on {prof['ranks']} ranks as 2 groups of {max(1, prof['ranks'] // 2)}, "
         f"h = {max(1, prof['epochs'] // 100)} (the paper's h/epochs = 1/100), the quick preset "
         f"(`{PRESET}`) otherwise.", ""]
    if table:
        groups = {g["name"]: g for g in table["groups"]}
        cols = [c for c in TABLE_COLUMNS if c in groups]
        L += ["## Table IV: residuals at the last time step, r̂_i ± 1σ in units of 10⁻³ (ours | the paper's)", "",
              "| residual | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for i in range(len(table["parameters"])):
            cells = []
            for c in cols:
                f = groups[c]["final"]
                ours = f"{f['residual_1e3'][i]:+.0f} ± {f['residual_sigma_1e3'][i]:.0f}"
                paper = PAPER_TABLE4.get(c)
                cells.append(ours + (f" \\| {paper[i][0]} ± {paper[i][1]}" if paper else ""))
            L.append(f"| r̂_{i} | " + " | ".join(cells) + " |")
        walls = {c: _col_walls(results, c) for c in cols}
        L.append("| max\\|r̂\\| | " + " | ".join(f"{max_abs(groups[c])[-1] * 1e3:.0f}" for c in cols) + " |")
        L.append("| generators (runs × ranks averaged per run) | "
                 + " | ".join(str(groups[c]["n_runs"]) for c in cols) + " |")
        L.append("| wall per run [s] | " + " | ".join(f"{walls[c][0]:.0f}" for c in cols) + " |")
        L.append("| training per rank [s] | " + " | ".join(f"{walls[c][1]:.0f}" for c in cols) + " |")
        L += ["", "A run's ranks are averaged into one member (sagips.analyze); the ensemble column's runs are single "
              "ranks (each rank of its launches is its own run), the paper's single-GPU reference.", ""]
        if "paper_table4_fig13.png" in made:
            L += ["![Fig. 13 analogue](paper_table4_fig13.png)", "",
                  "Fig. 13 analogue: r̂_0 of the ensemble mean against the accumulated training time per rank, one "
                  "panel per column, with the 1σ band of the ensemble.", ""]
    if split:
        groups = {g["name"]: g for g in split["groups"]}
        L += ["## Figs. 14-16: N = 2 with eq. 10 against N = 1 with the whole batch", "",
              "| column | runs (members) | final max\\|r̂\\| | training per rank [s] | wall per run [s] |",
              "|---|---|---|---|---|"]
        for c in (c for c in SPLIT_COLUMNS if c in groups):
            w = _col_walls(results, c)
            L.append(f"| {c} | {groups[c]['n_runs']} | {max_abs(groups[c])[-1]:.4f} | {w[1]:.0f} | {w[0]:.0f} |")
        L.append("")
        if "paper_table4_fig14.png" in made:
            L += ["![Figs. 14-16 analogue](paper_table4_fig14.png)", ""]
    L += ["## Verdicts", ""]
    for c in ("rma-arar-arar", "arar-arar", "arar"):
        x = v.get(f"{c}_vs_hvd")
        if x:
            L.append(f"- **{c} against hvd**: smaller |r̂_i| on {x['better_on']} of {x['of']} parameters; hvd's "
                     f"largest |r̂| is {x['ratio_max_abs']:.1f}x {c}'s, its RMS residual {x['ratio_rms']:.1f}x "
                     f"(the paper: 5-20x). "
                     + ("SAGIPS beats the Horovod-style GAN on every residual." if x["better_on"] == x["of"] else
                        "Not on every residual: the claim does not fully reproduce here."))
    w = v.get("weights_vs_gradients")
    if w:
        better = w["rms_weights"] < w["rms_gradients"]
        L.append(f"- **weights against gradients on outer epochs** (arar-arar): RMS residual {w['rms_weights']:.0f} "
                 f"against {w['rms_gradients']:.0f} (×10⁻³), max {w['max_abs_weights']:.0f} against "
                 f"{w['max_abs_gradients']:.0f}: weight averaging is {'better' if better else 'not better'} here.")
    for c in ("N2-arar-split", "N2-rma-split"):
        x = v.get(f"{c}_vs_N1")
        if x:
            t = x["N2_reaches_at_s"]
            L.append(f"- **{c} against N = 1**: N = 1 ends at max|r̂| {x['N1_final_max_abs']:.4f} after "
                     f"{x['N1_time_s']:.0f} s per rank; N = 2 with eq. 10 "
                     + (f"reaches it at {t:.0f} s ({t / x['N1_time_s']:.2f}x the time): sooner."
                        if t is not None and t < x["N1_time_s"] else
                        f"{'reaches it only at ' + format(t, '.0f') + ' s' if t is not None else 'does not reach it'}"
                        f" (its final {x['N2_final_max_abs']:.4f} after {x['N2_time_s']:.0f} s): not sooner."))
    L += ["", "Raw numbers: [paper_table4.json](paper_table4.json).", ""]
    (docs / "paper_table4.json").write_text(json.dumps(
        {"profile": prof_name, "settings": prof, "machine": machine, "verdicts": v,
         "table": None if not table else {g["name"]: {"final": g["final"], "n_runs": g["n_runs"]}
                                          for g in table["groups"]},
         "split": None if not split else {g["name"]: {"time_s": g["time_s"], "max_abs": max_abs(g).tolist(),
                                                      "n_runs": g["n_runs"]} for g in split["groups"]}},
        indent=1) + "\n")
    text = "\n".join(L)
    (docs / "paper_table4.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="M = 2 runs per column, 200 epochs (under 20 minutes)")
    g.add_argument("--smoke", action="store_true", help="M = 1, 3 epochs, 2 ranks: checks the plumbing (tests)")
    g.add_argument("--profile", choices=("full", "quick", "smoke", "converge", "converge-smoke"), default=None,
                   help="full (the default), quick, smoke, or converge: Table IV at the preset's full epochs, "
                        "against the clock (issue 37; benchmarks/paper_table4_converge.py, its own flags below)")
    ap.add_argument("--runs", type=Path, default=None, help="where the runs go (default runs/paper_table4[_PROFILE])")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks",
                    help="where the page, its JSON and figures go")
    ap.add_argument("--parts", default=None, help="comma-separated: table (Table IV), split (Figs. 14-16); "
                    "default table,split. converge: calibrate, table, control (default calibrate,table)")
    ap.add_argument("--page-only", action="store_true", help="only analyse the finished runs and write the page")
    ap.add_argument("--timeout-min", type=float, default=None, help="kill a run that takes longer (default 30; "
                    "converge: 180)")
    ap.add_argument("--columns", default=None, help="only these columns (comma-separated; default all of the "
                    "parts' columns)")
    ap.add_argument("--commit", action="store_true", help="converge: git-commit each run's JSON as it finishes")
    ap.add_argument("--frozen-code", action="store_true", help="converge: run sagips from a snapshot of HEAD taken "
                    "at the study's first start (RUNS/code), not from the working tree that others edit")
    a = ap.parse_args(argv)
    name = a.profile or ("smoke" if a.smoke else "quick" if a.quick else "full")
    if name.startswith("converge"):
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import paper_table4_converge

        return paper_table4_converge.main(a, name)
    if a.commit or a.frozen_code:
        ap.error("--commit and --frozen-code belong to --profile converge")
    a.timeout_min = a.timeout_min or 30.0
    prof = PROFILES[name]
    runs = a.runs or ROOT / "runs" / ("paper_table4" if name == "full" else f"paper_table4_{name}")
    docs = a.docs
    results = docs / "paper_table4"
    docs.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in (a.parts or "table,split").split(",") if p.strip()]
    if set(parts) - {"table", "split"}:
        ap.error(f"--parts: unknown part(s) {sorted(set(parts) - {'table', 'split'})}")
    cols = (TABLE_COLUMNS if "table" in parts else ()) + (SPLIT_COLUMNS if "split" in parts else ())
    if a.columns:
        asked = [c.strip() for c in a.columns.split(",") if c.strip()]
        if not asked or set(asked) - set(cols):
            ap.error(f"--columns: not a column of the parts {parts}: {sorted(set(asked) - set(cols))}; they are "
                     f"{', '.join(cols)}")
        cols = tuple(c for c in cols if c in asked)
    extra = SMALL if name == "smoke" else []
    if not a.page_only:
        order = [(c, k) for k in range(prof["runs"]) for c in cols]
        t_start = time.perf_counter()
        for i, (c, k) in enumerate(order):
            rec = launch(c, k, prof, runs, results, extra, a.timeout_min * 60)
            done = time.perf_counter() - t_start
            print(f"paper_table4: [{i + 1}/{len(order)}] {c} run {k}: wall {rec['wall_s']:.0f} s "
                  f"(elapsed {done / 60:.1f} min)", flush=True)
    from benchmarks.loop_closure import machine

    table = analyse(runs, TABLE_COLUMNS, prof, runs / "analysis_table") if "table" in parts else None
    split = analyse(runs, SPLIT_COLUMNS, prof, runs / "analysis_split") if "split" in parts else None
    page(table, split, name, prof, results, docs, machine())
    print(f"paper_table4: wrote {docs / 'paper_table4.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
