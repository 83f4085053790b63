"""Table IV at convergence and against the clock (issue 37): which mode should a user run?

    python benchmarks/paper_table4.py --profile converge --parts calibrate    # the calibration, in one sitting
    setsid nohup nice -n 19 python benchmarks/paper_table4.py --profile converge --parts table,control --commit \\
        > runs/paper_table4_converge.log 2>&1 &                                 # the study (hours; it resumes)
    python benchmarks/paper_table4.py --profile converge --page-only            # the page from the records
    python benchmarks/paper_table4.py --profile converge-smoke --docs D --runs R  # the plumbing (tests, seconds)

Every column runs `make run`'s preset (configs/proxy1d-quick.yaml) for 4,000 epochs (its full length until the
forty-second session; the study ran the preset of then, lr_g 3e-4 on raw events, from its frozen code) on 4 ranks (2 groups of
2 where the mode has groups, h = 1 as in the preset), M = 5 seeds (1000-1004, the same seeds in every column), with
train.amp=none: float32, what `auto` resolves to on an AVX2 CPU, pinned so that no start-up probe changes the
precision from run to run. Runs go round by round (round k runs every column once, hvd and rma-arar-arar first), so
that machine load hits the columns alike and a study stopped early has the most informative columns at equal M.

Part `control` asks one question at a time, with the same seeds (CONTROL): hvd with train.split_batch (its shared
critic then sees the events of one local critic per step), rma-arar-arar with h = 10 and 100 (comm.outer_every),
with the whole data on every rank (environment.subset_fraction 1.0 against the paper's 0.5), and hvd and
rma-arar-arar at the paper's learning rates scaled to the epochs (G 1e-5, D 1e-4 over 100,000 epochs, constant:
x 100,000 / epochs), and rma-arar-arar with train.split_batch (does a quarter batch per rank help the local critics
as it helps hvd?).

Records: each finished run leaves docs/benchmarks/paper_table4/converge/COLUMN__sK.json (its final residuals and its
metrics.jsonl curve); with --commit the script git-commits it as it finishes, and the page after each round. A run
whose record exists is skipped: the study resumes where it stopped (a run killed midway starts again). The
analysis and the page (paper_table4_converge.md, .json, .png) are made from the records alone.

Time: the study shares 2 cores with other work at nice 19, so the seconds measured inside its runs depend on the
load. Equal time is therefore computed from each column's seconds per epoch measured by part `calibrate` (every
column for a few hundred epochs, back to back, interleaved by repetition, in one sitting; calibration.json, kept
unless deleted). Start-up is not counted. Hand-written notes: docs/benchmarks/paper_table4_notes.md (never written
here).
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import frozen  # noqa: E402  (ROOT is on sys.path: paper_table4)
import paper_table4 as pt4

ROOT = pt4.ROOT
PROFILES = {  # runs per column, epochs, ranks, checkpoint period, h, the calibration's epochs and repetitions
    "converge": {"runs": 5, "epochs": 4000, "ranks": 4, "checkpoint_every": 1000, "outer_every": 1,
                 "calibrate_epochs": 200, "calibrate_reps": 3},
    "converge-smoke": {"runs": 2, "epochs": 4, "ranks": 2, "checkpoint_every": 2, "outer_every": 1,
                       "calibrate_epochs": 4, "calibrate_reps": 1},
}
PINNED = ["train.amp=none"]  # float32 in every run (see the docstring)
MAIN = ("hvd", "rma-arar-arar", "ensemble", "arar", "arar-arar", "arar-arar-weights")  # most informative first
LEVEL = 0.02  # "reach and stay below" this max|r̂|
SEED0 = 1000


def paper_lr(epochs: int) -> list[str]:
    """The paper's learning rates (G 1e-5, D 1e-4, constant, 100,000 epochs) scaled to `epochs`."""
    f = 100_000 / epochs
    return [f"train.lr_g={1e-5 * f:.3g}", f"train.lr_d={1e-4 * f:.3g}", "train.lr_final=1.0"]


def control_columns(epochs: int) -> dict[str, tuple[str, list[str]]]:
    """column -> (the main column it changes, its --set overrides): one change at a time."""
    return {"hvd-split": ("hvd", ["train.split_batch=true"]),
            "rma-h10": ("rma-arar-arar", ["comm.outer_every=10"]),
            "rma-h100": ("rma-arar-arar", ["comm.outer_every=100"]),
            "rma-data1": ("rma-arar-arar", ["environment.subset_fraction=1.0"]),
            "hvd-paper-lr": ("hvd", paper_lr(epochs)),
            "rma-paper-lr": ("rma-arar-arar", paper_lr(epochs)),
            "rma-split": ("rma-arar-arar", ["train.split_batch=true"])}


CONTROL = tuple(control_columns(4000))
#: (question, the local-critic column, the column it is measured against); each at equal epochs and equal time
QUESTIONS = (
    ("hvd's shared critic sees 4x the events per step: against hvd with split_batch", "rma-arar-arar", "hvd-split"),
    ("split_batch in hvd (hvd-split against hvd)", "hvd-split", "hvd"),
    ("h = 10 against hvd", "rma-h10", "hvd"),
    ("h = 10 against h = 1", "rma-h10", "rma-arar-arar"),
    ("h = 100 against hvd", "rma-h100", "hvd"),
    ("h = 100 against h = 1", "rma-h100", "rma-arar-arar"),
    ("all the data on every rank, against hvd", "rma-data1", "hvd"),
    ("data fraction 1.0 against 0.5", "rma-data1", "rma-arar-arar"),
    ("the paper's learning rates, scaled: rma-arar-arar against hvd", "rma-paper-lr", "hvd-paper-lr"),
    ("split_batch in rma-arar-arar (a quarter batch per local critic) against h = 1", "rma-split", "rma-arar-arar"),
    ("split_batch in both: rma-arar-arar against hvd", "rma-split", "hvd-split"),
)


class RunFailed(RuntimeError):
    pass


@dataclass
class Study:
    """Where and how the runs of one profile go."""

    prof: dict  #: PROFILES[name]
    runs: Path  #: the runs' output directories
    results: Path  #: the records (COLUMN__sK.json, calibration.json)
    extra: list[str] = field(default_factory=list)  #: --set for every run (the smoke profile's small sizes)
    timeout_s: float = 3 * 3600.0  #: a run that takes longer is killed (and tried again by the next invocation)
    code: Path = ROOT  #: where sagips, environments/ and configs/ come from (snapshot(): a frozen copy)
    commit: str | None = None  #: the commit of `code` where it is a snapshot


def snapshot(runs: Path) -> tuple[Path, str]:
    """The committed code that the study runs (benchmarks/frozen.py): HEAD's sagips/, environments/ and configs/ at
    the study's first start, exported once into RUNS/code and reused on every resume."""
    return frozen.export(runs / "code")


# ----------------------------------------------------------------------------------------------- running
def launch_args(col: str, prof: dict, epochs: int | None = None) -> tuple[int, list[str]]:
    """(ranks, sagips.run arguments) of column `col`; `epochs` shortens the run (the calibration) and keeps the
    column's settings (a control column's learning rates stay those of the full run)."""
    base, sets = (col, []) if col in MAIN else control_columns(prof["epochs"])[col]
    n, args = pt4.column_launch(base, dict(prof, epochs=epochs or prof["epochs"]))
    for s in [*PINNED, *sets, f"label={col}"]:  # later --set win: label and h replace column_launch's
        args += ["--set", s]
    return n, args


def seconds_per_epoch(epochs, times) -> float:
    """Slope of the accumulated training time over the logged epochs from a quarter of the run on (so that the
    first epochs' warm-up is left out)."""
    e, t = np.asarray(epochs, float), np.asarray(times, float)
    i = min(int(np.searchsorted(e, e[-1] / 4)), len(e) - 2)
    return float((t[-1] - t[i]) / (e[-1] - e[i]))


def read_run(out: Path) -> dict:
    """A finished launch's figures: final residuals (run.json's, every rank's generator averaged) and the
    metrics.jsonl curve; an ensemble launch's members are averaged (residuals are linear in the prediction, so this
    is the residual of the members' mean prediction, as a user who averages them gets)."""
    dirs = pt4.run_dirs(out)
    infos = [json.loads((d / "run.json").read_text()) for d in dirs]
    logs = [[r for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "residuals" in r]
            for d in dirs]
    n = min(len(x) for x in logs)
    res = np.mean([[r["residuals"] for r in x[:n]] for x in logs], axis=0)
    final = np.mean([i["final_quality"]["residuals"] for i in infos], axis=0)
    prec = infos[0].get("precision") or {}
    return {"members": len(infos), "epochs": infos[0]["epochs"], "batch": infos[0].get("batch"),
            "reference_fraction": infos[0].get("reference_fraction"),
            "outer_every": infos[0]["config"]["comm"]["outer_every"],
            "lr": [infos[0]["config"]["train"][k] for k in ("lr_g", "lr_d", "lr_final")],
            "precision": prec.get("resolved"), "cpu_capability": prec.get("cpu_capability"),
            "train_s_per_rank": round(float(np.mean([np.mean(i["train_seconds"]) for i in infos])), 2),
            "final": {"residuals": [round(float(x), 6) for x in final],
                      "max_abs": round(float(np.abs(final).max()), 6)},
            "curve": {"epoch": [r["epoch"] for r in logs[0][:n]],
                      "time_s": [round(float(np.mean([x[j]["time_s"] for x in logs])), 3) for j in range(n)],
                      "max_abs": [round(float(v), 6) for v in np.abs(res).max(axis=1)],
                      "quality_ranks": logs[0][n - 1].get("quality_ranks")}}


def run_once(st: Study, col: str, out: Path, seed: int, epochs: int | None = None) -> dict:
    """Launch one run of `col` into `out` (replacing what is there); read_run's figures plus how it ran."""
    n, args = launch_args(col, st.prof, epochs)
    cmd = pt4.run_command(n, args, out.resolve(), seed, st.extra)
    env = dict(os.environ)
    if st.code != ROOT:
        env["PYTHONPATH"] = os.pathsep.join([str(st.code), *filter(None, [env.get("PYTHONPATH")])])
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=st.code, env=env, capture_output=True, text=True, timeout=st.timeout_s)
    except subprocess.TimeoutExpired as e:
        raise RunFailed(f"{col} seed {seed}: no end after {st.timeout_s:.0f} s") from e
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RunFailed(f"{col} seed {seed} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return {"column": col, "seed": seed, "ranks": n, "command": pt4.printable(cmd), "code": st.commit,
            "wall_s": round(wall, 1), "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            **read_run(out)}


def record(st: Study, col: str, k: int) -> tuple[dict, bool]:
    """Run k of column `col`, or its record where it exists (resume); (record, whether it is new)."""
    path = st.results / f"{col}__s{k}.json"
    if path.exists():
        return json.loads(path.read_text()), False
    out = st.runs / col / f"s{k}"
    if pt4.complete(out):  # finished, but stopped before its record was written
        rec = {"column": col, "seed": SEED0 + k, "ranks": launch_args(col, st.prof)[0], "code": st.commit,
               "wall_s": None, **read_run(out)}
    else:
        rec = run_once(st, col, out, SEED0 + k)
    rec = {"run": k, **rec, "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    st.results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec) + "\n")
    return rec, True


def calibrated(reps: list[dict]) -> float:
    """A column's seconds per epoch from its calibration repetitions: the fastest one. Other work on the machine
    only ever adds time (a repetition's seconds vary up to 2.6x with the load average, calibration.json), so the
    least loaded repetition is the best estimate of the column's own time."""
    return float(min(r["s_per_epoch"] for r in reps))


def calibrate(st: Study, cols: list[str]) -> dict:
    """Seconds per epoch of every column, measured back to back and interleaved by repetition in one sitting;
    kept in calibration.json (delete it to measure again)."""
    path = st.results / "calibration.json"
    if path.exists():
        cal = json.loads(path.read_text())
        if set(cols) <= set(cal["columns"]):
            return cal
    e, reps = st.prof["calibrate_epochs"], st.prof["calibrate_reps"]
    rows: dict[str, list] = {c: [] for c in cols}
    began = dt.datetime.now(dt.timezone.utc)
    for j in range(reps):
        for c in cols:
            r = run_once(st, c, st.runs / "calibration" / c / f"r{j}", SEED0, epochs=e)
            s = seconds_per_epoch(r["curve"]["epoch"], r["curve"]["time_s"])
            rows[c].append({"s_per_epoch": round(s, 6), "train_s_per_rank": r["train_s_per_rank"],
                            "load_before": r["load_before"], "load_after": r["load_after"],
                            "precision": r["precision"], "cpu_capability": r["cpu_capability"]})
            print(f"paper_table4: calibration {j + 1}/{reps} {c}: {s * 1e3:.1f} ms per epoch "
                  f"(load {r['load_before']:.1f} -> {r['load_after']:.1f})", flush=True)
    from benchmarks.loop_closure import machine

    cal = {"began": began.strftime("%Y-%m-%d %H:%M UTC"),
           "ended": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "epochs": e, "reps": reps,
           "ranks": st.prof["ranks"], "code": st.commit, "machine": machine(),
           "env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")},
           "columns": {c: {"s_per_epoch": calibrated(rows[c]), "reps": rows[c]} for c in cols}}
    st.results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal, indent=1) + "\n")
    return cal


def git_commit(paths: list[Path], message: str, repo: Path = ROOT, tries: int = 90, wait_s: float = 2.0) -> bool:
    """`git add` + `git commit -- paths` (only these paths: others commit in the same tree), retried while another
    git process holds the index lock. False where nothing changed or git refused for another reason."""
    rel = [str(Path(p).resolve().relative_to(repo.resolve())) for p in paths]
    err = ""
    for _ in range(tries):
        add = subprocess.run(["git", "-C", str(repo), "add", "--", *rel], capture_output=True, text=True)
        if add.returncode == 0:
            c = subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message, "--", *rel],
                               capture_output=True, text=True)
            if c.returncode == 0:
                return True
            err = c.stdout + c.stderr
            if "nothing to commit" in err or "no changes added" in err:
                return False
        else:
            err = add.stderr
        if "index.lock" not in err:
            break
        time.sleep(wait_s)
    print(f"paper_table4: git commit of {rel} failed: {err.strip()[-400:]}", flush=True)
    return False


# ----------------------------------------------------------------------------------------------- statistics
def mean_se(xs) -> tuple[float, float]:
    """(mean, standard error of the mean = sample std (ddof 1) / sqrt(n)); the SE is nan for fewer than 2 values."""
    x = np.asarray(list(xs), float)
    if len(x) == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def compare(a: tuple[float, float], b: tuple[float, float]) -> dict:
    """a - b with its combined standard error; significant where |a - b| >= 2 combined SE (nan SE: never)."""
    d, se = a[0] - b[0], math.hypot(a[1], b[1])
    return {"diff": d, "se": se, "significant": bool(math.isfinite(se) and abs(d) >= 2 * se)}


def stays_below_from(epochs, values, level: float) -> float | None:
    """The first logged epoch from which every later logged value is <= level; None where the last one is above."""
    above = np.nonzero(np.asarray(values, float) > level)[0]
    if len(above) == 0:
        return float(epochs[0])
    i = int(above[-1]) + 1
    return float(epochs[i]) if i < len(epochs) else None


def curve_of(rec: dict) -> str:
    """Whose generator a run's logged curve scores: "all ranks" (their mean, as the final figure), "the members'
    mean" (an ensemble launch: read_run averages its single-rank members), or "rank 0" (rma-arar-arar logs rank 0's
    generator alone, so that a log epoch never waits for other ranks: `quality_of` in metrics.jsonl)."""
    if rec.get("members", 1) > 1:
        return "the members' mean"
    q = rec["curve"].get("quality_ranks")
    return "not recorded" if q is None else "all ranks" if q == rec.get("ranks") else "rank 0"


def analyse(records: list[dict], calibration: dict | None, level: float = LEVEL) -> dict:
    """Every column's statistics at equal epochs (run.json's final residuals) and at equal time (its curve at the
    time the fastest column ends, in calibrated seconds), the time to reach and stay below `level`, and the
    comparisons: every column against hvd, and QUESTIONS."""
    order = [c for c in (*MAIN, *CONTROL) if any(r["column"] == c for r in records)]
    order += sorted({r["column"] for r in records} - set(order))
    by = {c: sorted((r for r in records if r["column"] == c), key=lambda r: r["run"]) for c in order}
    cal = (calibration or {}).get("columns", {})
    cols: dict[str, dict] = {}
    for c, rs in by.items():
        in_run = float(np.median([seconds_per_epoch(r["curve"]["epoch"], r["curve"]["time_s"]) for r in rs]))
        t = calibrated(cal[c]["reps"]) if c in cal else in_run
        epochs = max(r["epochs"] for r in rs)
        cols[c] = {"runs": len(rs), "seeds": [r["seed"] for r in rs], "epochs": epochs, "s_per_epoch": t,
                   "timing": "calibration" if c in cal else "in-run (loaded)", "in_run_s_per_epoch": in_run,
                   "time_s": epochs * t, "final_per_run": [r["final"]["max_abs"] for r in rs]}
        cols[c]["final"] = mean_se(cols[c]["final_per_run"])
    if not cols:
        return {"columns": {}, "vs_hvd": {}, "questions": [], "equal_time_s": None, "fastest": None}
    fastest = min(cols, key=lambda c: cols[c]["time_s"])
    t_eq = cols[fastest]["time_s"]
    for c, rs in by.items():
        x = cols[c]
        x["equal_time_epoch"] = t_eq / x["s_per_epoch"]
        x["at_equal_time_per_run"] = [float(np.interp(x["equal_time_epoch"], r["curve"]["epoch"],
                                                       r["curve"]["max_abs"])) for r in rs]
        x["at_equal_time"] = mean_se(x["at_equal_time_per_run"])
        stay = [stays_below_from(r["curve"]["epoch"], r["curve"]["max_abs"], level) for r in rs]
        x["stay_below_epoch_per_run"] = stay
        x["stay_below_reached"] = sum(s is not None for s in stay)
        x["stay_below_time"] = mean_se([s * x["s_per_epoch"] for s in stay if s is not None])
        n = min(len(r["curve"]["epoch"]) for r in rs)
        m = np.array([r["curve"]["max_abs"][:n] for r in rs], float)
        x["curve"] = {"epoch": rs[0]["curve"]["epoch"][:n], "mean": m.mean(axis=0).tolist(),
                      "se": (m.std(axis=0, ddof=1) / math.sqrt(len(rs))).tolist() if len(rs) > 1 else None}
        x["curve_of"] = curve_of(rs[0])
        ratios = [r["curve"]["max_abs"][-1] / max(r["final"]["max_abs"], 1e-12) for r in rs]
        x["curve_end_over_final"], x["curve_end_over_final_range"] = mean_se(ratios), (min(ratios), max(ratios))

    def both(a: str, b: str) -> dict:
        return {"equal_epochs": compare(cols[a]["final"], cols[b]["final"]),
                "equal_time": compare(cols[a]["at_equal_time"], cols[b]["at_equal_time"])}

    vs_hvd = {c: both(c, "hvd") for c in cols if c != "hvd" and "hvd" in cols}
    questions = [{"question": q, "a": a, "b": b, **both(a, b)} for q, a, b in QUESTIONS if a in cols and b in cols]
    return {"columns": cols, "fastest": fastest, "equal_time_s": t_eq, "level": level, "vs_hvd": vs_hvd,
            "questions": questions}


def verdict(a: str, b: str, cmp: dict, ma: float, mb: float) -> str:
    """One line: which of columns a and b is closer to the truth, or that they do not differ significantly."""
    figure = f"{a} − {b} = {cmp['diff']:+.4f} ± {cmp['se']:.4f}"
    if not math.isfinite(cmp["se"]):
        return f"{a} − {b} = {cmp['diff']:+.4f}, no uncertainty yet (fewer than 2 runs)"
    if not cmp["significant"]:
        return f"no significant difference ({figure})"
    better, worse = (a, b) if cmp["diff"] < 0 else (b, a)
    ratio = max(ma, mb) / max(min(ma, mb), 1e-12)
    return f"**{better}** closer, {ratio:.2f}x ({figure}: {abs(cmp['diff']) / cmp['se']:.1f} SE)"


# ----------------------------------------------------------------------------------------------- page
def _pm(ms: tuple[float, float], digits: int = 4) -> str:
    m, s = ms
    if not math.isfinite(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f}"


def figure(an: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, (c, x) in enumerate(an["columns"].items()):
        e = np.asarray(x["curve"]["epoch"], float)
        m = np.asarray(x["curve"]["mean"])
        s = np.asarray(x["curve"]["se"]) if x["curve"]["se"] is not None else np.zeros_like(m)
        style = {"color": f"C{i % 10}", "ls": "-" if c in MAIN else "--", "label": f"{c} (M={x['runs']})"}
        for ax, xs in ((axes[0], e), (axes[1], e * x["s_per_epoch"] / 60)):
            ax.plot(xs, m, **style)
            ax.fill_between(xs, np.clip(m - s, 1e-4, None), m + s, color=style["color"], alpha=0.15)
    for ax in axes:
        ax.axhline(an["level"], color="k", lw=0.6, ls=":")
        ax.set_yscale("log")
    axes[1].axvline(an["equal_time_s"] / 60, color="k", lw=0.6)
    axes[0].set_xlabel("epoch")
    axes[1].set_xlabel("training time per rank [min] (epoch x the column's calibrated s/epoch)")
    axes[0].set_ylabel("max_i |r̂_i|, mean over runs ± SE")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def page(an: dict, calibration: dict | None, records: list[dict], prof_name: str, prof: dict, docs: Path,
         machine: dict) -> list[Path]:
    """Write paper_table4_converge.{md,json,png} from the analysis; the paths written."""
    cols = an["columns"]
    planned = prof["runs"] * (len(MAIN) + len(CONTROL))
    rec0 = records[0] if records else next(iter((calibration or {}).get("columns", {}).values()), {}).get(
        "reps", [{}])[0]  # the kernels and precision of the runs, not of this process
    L = ["# Table IV at convergence and against the clock (issue 37)", "",
         f"Generated whole by `benchmarks/paper_table4.py --profile {prof_name}` from the run records in "
         f"[paper_table4/converge/](paper_table4/converge/) (module `benchmarks/paper_table4_converge.py`); "
         f"hand-written notes: [paper_table4_notes.md](paper_table4_notes.md), section \"converge\".", "",
         f"Machine: **{machine['cpu_model']}**, {machine['cores']} cores, torch {machine['torch']} "
         f"({rec0.get('cpu_capability') or machine['torch_cpu_capability']} kernels in the runs; flags "
         f"{', '.join(machine.get('vector_flags', []))}). Every run: `{pt4.PRESET}` for {prof['epochs']} epochs, "
         f"{prof['ranks']} ranks (2 groups of {max(1, prof['ranks'] // 2)} in the grouped modes, h = "
         f"{prof['outer_every']} as in the preset), precision {rec0.get('precision', 'float32')} (`train.amp=none` "
         f"pinned), seeds {SEED0}-{SEED0 + prof['runs'] - 1} in every column.", "",
         f"**Runs finished: {len(records)} of {planned} planned** ({prof['runs']} per column, {len(MAIN)} main and "
         f"{len(CONTROL)} controlled columns). "
         + ("Every verdict below is provisional until each column has its runs." if len(records) < planned else ""),
         "", "max|r̂| is max_i |r̂_i| of one run (its ranks' generators averaged; the ensemble column: its "
         f"{prof['ranks']} single-rank GANs averaged); a column's figure is the mean over its runs ± the standard "
         "error of that mean (sample std / √M). Two columns differ significantly where |difference| ≥ 2 "
         "combined SE.", ""]
    if calibration:
        L += ["## Time: the calibration", "",
              f"The runs shared the machine with other work, so their own seconds depend on the load. Equal time is "
              f"taken from each column's seconds per epoch measured in one sitting ({calibration['began']} to "
              f"{calibration['ended']}): every column for {calibration['epochs']} epochs on {calibration['ranks']} "
              f"ranks, back to back, {calibration['reps']} repetition(s) interleaved, the slope from a quarter of "
              f"the run on; a column's figure is its fastest repetition (load only adds time). Start-up is not "
              f"counted. These are seconds of this "
              f"{machine['cores']}-core CPU with {calibration['ranks']} ranks, not of a GPU.", "",
              "| column | s per epoch (fastest) | repetitions [ms] | load before → after | the full run [min] |",
              "|---|---|---|---|---|"]
        for c, x in calibration["columns"].items():
            reps = ", ".join(f"{r['s_per_epoch'] * 1e3:.1f}" for r in x["reps"])
            loads = ", ".join(f"{r['load_before']:.1f} → {r['load_after']:.1f}" for r in x["reps"])
            t = calibrated(x["reps"])
            L.append(f"| {c} | {t:.4f} | {reps} | {loads} | {t * prof['epochs'] / 60:.1f} |")
        spread = max(max(r["s_per_epoch"] for r in x["reps"]) / calibrated(x["reps"])
                     for x in calibration["columns"].values())
        L.append("")
        if spread > 1.15:
            L += [f"**The calibration is load-bound**: one column's repetitions differ by up to {spread:.2f}x (the "
                  f"load average in the table), more than the differences between the columns' own work. The "
                  f"equal-time figures below carry that uncertainty; measure again on a quiet machine (delete "
                  f"calibration.json, run `--parts calibrate`, then `--page-only`).", ""]
    else:
        L += ["No calibration yet: times below are the runs' own (loaded) seconds per epoch.", ""]
    if cols:
        L += ["## Equal epochs and equal time", "",
              f"Equal time: {an['equal_time_s'] / 60:.1f} min of training per rank, when the fastest column "
              f"(**{an['fastest']}**) ends; every other column's runs are read off their metrics.jsonl curves "
              f"(at the logged epochs, `train.log_every`, interpolated) at the epoch they reach by then. "
              f"Stay below {an['level']}: the first logged epoch after which no logged value is above it, in "
              f"calibrated minutes (mean over the runs that get there).", "",
              "| column | runs | max\\|r̂\\| at the last epoch | vs hvd | at equal time (epoch) | vs hvd "
              f"| stays below {an['level']} [min] (runs) | s/epoch (source) |", "|---|---|---|---|---|---|---|---|"]
        for c, x in cols.items():
            vh = an["vs_hvd"].get(c)
            cell = (lambda k: verdict(c, "hvd", vh[k], x["final" if k == "equal_epochs" else "at_equal_time"][0],
                                      cols["hvd"]["final" if k == "equal_epochs" else "at_equal_time"][0])
                    if vh else "–")
            st = x["stay_below_time"]
            L.append(f"| {c} | {x['runs']} | {_pm(x['final'])} | {cell('equal_epochs')} | "
                     f"{_pm(x['at_equal_time'])} ({x['equal_time_epoch']:.0f}) | {cell('equal_time')} | "
                     f"{_pm((st[0] / 60, st[1] / 60), 1)} ({x['stay_below_reached']}/{x['runs']}) | "
                     f"{x['s_per_epoch']:.4f} ({x['timing']}) |")
        rank0 = {c: x for c, x in cols.items() if x["curve_of"] == "rank 0"}
        if rank0:
            L += ["", "**Whose generator the curves score.** The last-epoch column scores every rank's generator "
                  "averaged, as a user's prediction; the equal-time and stay-below columns read the metrics.jsonl "
                  "curves, and in " + ", ".join(rank0) + " those are **rank 0's generator alone** (rma-arar-arar "
                  "logs without waiting for other ranks: `quality_of` in metrics.jsonl). The curve's last point "
                  "over the last-epoch figure, mean ratio over the runs (single runs' range): "
                  + ", ".join(f"{c} {_pm(x['curve_end_over_final'], 2)}x "
                              f"({x['curve_end_over_final_range'][0]:.2f}-{x['curve_end_over_final_range'][1]:.2f})"
                              for c, x in rank0.items())
                  + ". Where the mean ratio is well above 1 (ranks that meet only every h epochs spread apart, and "
                  "their mean can be much closer than rank 0's generator), the equal-time figure likely overstates "
                  "the column's error (measured at the last epoch only); where it is near 1 the two agree on "
                  "average, not run by run."]
        L += ["", "Per run (seed order), max|r̂| at the last epoch:", ""]
        L += [f"- {c}: " + ", ".join(f"{v:.4f}" for v in x["final_per_run"]) for c, x in cols.items()]
        L += ["", "![max|r̂| against epochs and calibrated time](paper_table4_converge.png)", "",
              "Fig. 13 analogue: the mean over runs of max|r̂| (± SE, shaded) against epochs (left) and against the "
              "calibrated training time per rank (right; the vertical line is the equal time). Dashed: the controlled "
              "columns. Dotted: the 0.02 level.", ""]
    if an["questions"]:
        L += ["## One controlled question at a time", "", "| question | at equal epochs | at equal time |",
              "|---|---|---|"]
        for q in an["questions"]:
            a, b = q["a"], q["b"]
            L.append(f"| {q['question']} | "
                     + " | ".join(verdict(a, b, q[k], cols[a][f][0], cols[b][f][0])
                                  for k, f in (("equal_epochs", "final"), ("equal_time", "at_equal_time"))) + " |")
        L.append("")
    if cols:
        L += ["Seconds per epoch measured inside the runs (loaded, nice 19; for reference only): "
              + ", ".join(f"{c} {x['in_run_s_per_epoch']:.4f}" for c, x in cols.items()) + ".", ""]
    L += ["Raw numbers: [paper_table4_converge.json](paper_table4_converge.json).", ""]
    md, js, png = (docs / f"paper_table4_converge.{x}" for x in ("md", "json", "png"))
    js.write_text(json.dumps({"profile": prof_name, "settings": prof, "machine": machine, "runs_finished":
                              len(records), "runs_planned": planned, "analysis": an}, indent=1) + "\n")
    md.write_text("\n".join(L))
    written = [md, js]
    if cols:
        figure(an, png)
        written.append(png)
    return written


def load_records(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*__s*.json"))]


def write_page(results: Path, prof_name: str, prof: dict, docs: Path) -> list[Path]:
    from benchmarks.loop_closure import machine

    records = load_records(results)
    cal_path = results / "calibration.json"
    cal = json.loads(cal_path.read_text()) if cal_path.exists() else None
    return page(analyse(records, cal), cal, records, prof_name, prof, docs, machine())


def main(a, name: str) -> int:
    """`paper_table4.py --profile converge[-smoke]` with paper_table4's parsed arguments `a`."""
    prof = PROFILES[name]
    runs = (a.runs or ROOT / "runs" / f"paper_table4_{name.replace('-', '_')}").resolve()
    docs = a.docs
    st = Study(prof, runs, docs / "paper_table4" / "converge", pt4.SMALL if name == "converge-smoke" else [],
               (a.timeout_min or 180.0) * 60)
    parts = [p.strip() for p in (a.parts or "calibrate,table").split(",") if p.strip()]
    if set(parts) - {"calibrate", "table", "control"}:
        raise SystemExit(f"paper_table4: --parts: converge has calibrate, table, control; not "
                         f"{sorted(set(parts) - {'calibrate', 'table', 'control'})}")
    wanted = [c.strip() for c in a.columns.split(",")] if a.columns else [*MAIN, *CONTROL]
    if set(wanted) - set(MAIN) - set(CONTROL):
        raise SystemExit(f"paper_table4: --columns: unknown {sorted(set(wanted) - set(MAIN) - set(CONTROL))}")
    docs.mkdir(parents=True, exist_ok=True)
    if not a.page_only:
        if a.frozen_code:
            st.code, st.commit = snapshot(runs)
            print(f"paper_table4: running sagips from {st.code} (commit {st.commit[:10]})", flush=True)
        if "calibrate" in parts:
            calibrate(st, [c for c in (*MAIN, *CONTROL) if c in wanted])
            if a.commit:
                git_commit([st.results / "calibration.json"], "paper_table4 converge: the calibration (s per epoch)")
        for part, cols in (("table", MAIN), ("control", CONTROL)):
            cols = [c for c in cols if c in wanted and part in parts]
            for k in range(prof["runs"] if cols else 0):
                new = 0
                for c in cols:
                    try:
                        rec, fresh = record(st, c, k)
                    except RunFailed as e:  # the next invocation tries it again
                        print(f"paper_table4: {e}", flush=True)
                        continue
                    new += fresh
                    if fresh:
                        print(f"paper_table4: {c} seed {rec['seed']}: max|r| {rec['final']['max_abs']:.4f} "
                              f"(wall {rec['wall_s']} s)", flush=True)
                        if a.commit:
                            git_commit([st.results / f"{c}__s{k}.json"], f"paper_table4 converge: {c} seed "
                                       f"{rec['seed']} finished, max|r| {rec['final']['max_abs']:.4f}")
                if new:
                    written = write_page(st.results, name, prof, docs)
                    if a.commit:
                        git_commit(written, f"paper_table4 converge: the page after round {k + 1} of {part}")
    written = write_page(st.results, name, prof, docs)
    print(f"paper_table4: wrote {written[0]}", flush=True)
    return 0
