"""benchmarks/paper_table4.py (issue 20): --smoke runs every column end to end and writes the page; the verdicts
follow the numbers."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from sagips.io.state import load_state
from tests._bench import ROOT, load_benchmark
from tests._mpirun import child_env

pt4 = load_benchmark("paper_table4")


#: the smoke's columns: those its assertions read (the other columns are plain modes, run end to end by
#: tests/test_run_e2e.py; their command lines are checked by test_every_columns_command_line_is_accepted)
SMOKE_COLUMNS = ("hvd", "arar-arar", "arar-arar-weights", "N1-whole-batch", "N2-arar-split")


def test_smoke_runs_its_columns_and_writes_the_page(tmp_path):
    docs, runs = tmp_path / "docs", tmp_path / "runs"
    p = subprocess.run([sys.executable, "benchmarks/paper_table4.py", "--smoke", "--docs", str(docs), "--runs",
                        str(runs), "--columns", ",".join(SMOKE_COLUMNS)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(d.name for d in runs.iterdir() if d.is_dir() and not d.name.startswith("analysis")) == sorted(
        SMOKE_COLUMNS)  # only the columns asked for ran
    page = (docs / "paper_table4.md").read_text()
    assert "| residual | hvd | arar-arar | arar-arar-weights |" in page
    assert "| N2-arar-split |" in page and "- **arar-arar against hvd**" in page
    assert "- **N2-arar-split against N = 1**" in page and "weights against gradients" in page
    rec = {c: json.loads((docs / "paper_table4" / f"{c}__s0.json").read_text()) for c in SMOKE_COLUMNS}
    # eq. 10 in the study: N = 2 trains on half the parameter sets per rank, N = 1 on all of them
    assert rec["N2-arar-split"]["batch"] == {"key": "environment.param_samples", "split": True, "requested": 16,
                                             "ranks_averaged": 2, "per_rank": 8, "effective": 16}
    assert rec["N1-whole-batch"]["batch"]["per_rank"] == 16 and rec["N1-whole-batch"]["members"] == 2
    # hvd: one data-parallel GAN (both networks the same on both ranks); outer_sync=weights with h = 1: every
    # generator the same after the last (outer) epoch
    hvd = [load_state(runs / "hvd" / "s0", r, 3) for r in (0, 1)]
    for net in ("generator", "discriminator"):
        assert all(torch.equal(hvd[0][net][k], hvd[1][net][k]) for k in hvd[0][net])
    w = [load_state(runs / "arar-arar-weights" / "s0", r, 3)["generator"] for r in (0, 1)]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])
    out = json.loads((docs / "paper_table4.json").read_text())
    assert set(out["table"]) == {"hvd", "arar-arar", "arar-arar-weights"}
    assert set(out["split"]) == {"N1-whole-batch", "N2-arar-split"}


@pytest.mark.parametrize("col", pt4.TABLE_COLUMNS + pt4.SPLIT_COLUMNS)
def test_every_columns_command_line_is_accepted(col, capsys):
    """Each column's launch resolves to a valid configuration (sagips.run --help-config: the keys and values a run
    would check first), at the smoke's size and at the study's."""
    from sagips.run import main as run_main

    for prof, extra in ((pt4.PROFILES["smoke"], pt4.SMALL), (pt4.PROFILES["full"], [])):
        n, args = pt4.column_launch(col, prof)
        argv = ["--config", pt4.PRESET, *args, *(x for s in extra for x in ("--set", s)), "--help-config"]
        assert run_main(argv) == 0, capsys.readouterr().err
        assert n == (2 if col in pt4.SPLIT_COLUMNS else prof["ranks"])


def test_an_unknown_column_is_one_line():
    p = subprocess.run([sys.executable, "benchmarks/paper_table4.py", "--smoke", "--columns", "hvd,rma"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env=child_env())
    assert p.returncode == 2 and "--columns: not a column of the parts" in p.stderr and "'rma'" in p.stderr


def _group(name, residual_1e3, times=(10.0, 20.0), max_abs=(0.5, 0.1)):
    r = np.asarray(residual_1e3, float) / 1e3
    return {"name": name, "final": {"residual_1e3": list(residual_1e3)}, "time_s": list(times),
            "residual": [list(np.full(len(r), m)) for m in max_abs[:-1]] + [list(r)]}


def test_verdicts_follow_the_numbers():
    table = {"groups": [_group("hvd", [95, 94, 26, 212, 138, 99]), _group("arar", [2, 3, 0, 26, 18, 111]),
                        _group("arar-arar", [3, 8, 1, 20, 14, 9]), _group("arar-arar-weights", [3, 8, 1, 10, 14, 9])]}
    one = _group("N1-whole-batch", [50, 0, 0, 0, 0, 0], times=(100.0, 200.0), max_abs=(0.5, 0.05))
    fast = _group("N2-arar-split", [40, 0, 0, 0, 0, 0], times=(60.0, 120.0), max_abs=(0.04, 0.04))
    slow = _group("N2-rma-split", [80, 0, 0, 0, 0, 0], times=(60.0, 120.0), max_abs=(0.5, 0.08))
    v = pt4.verdicts(table, {"groups": [one, fast, slow]})
    assert v["arar-arar_vs_hvd"]["better_on"] == 6 and v["arar_vs_hvd"]["better_on"] == 5
    assert abs(v["arar-arar_vs_hvd"]["ratio_max_abs"] - 212 / 20) < 1e-9
    assert v["weights_vs_gradients"]["rms_weights"] < v["weights_vs_gradients"]["rms_gradients"]
    assert v["N2-arar-split_vs_N1"]["N2_reaches_at_s"] == 60.0
    assert v["N2-rma-split_vs_N1"]["N2_reaches_at_s"] is None


# ----------------------------------------------------------------------------------------------- --profile converge
cv = load_benchmark("paper_table4_converge")


def _converge(*args, docs, runs):
    return subprocess.run([sys.executable, "benchmarks/paper_table4.py", "--profile", "converge-smoke", "--docs",
                           str(docs), "--runs", str(runs), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=child_env())


def test_converge_smoke_records_resumes_and_writes_the_page(tmp_path):
    docs, runs = tmp_path / "docs", tmp_path / "runs"
    p = _converge("--columns", "hvd", docs=docs, runs=runs)  # calibration + 2 seeds: 3 launches of 2 ranks
    assert p.returncode == 0, p.stderr[-3000:]
    results = docs / "paper_table4" / "converge"
    recs = [json.loads((results / f"hvd__s{k}.json").read_text()) for k in (0, 1)]
    assert [r["seed"] for r in recs] == [1000, 1001] and all(r["precision"] == "float32" for r in recs)
    r = recs[0]
    assert r["curve"]["epoch"] == [1, 2, 3, 4] and len(r["curve"]["max_abs"]) == 4 and r["epochs"] == 4
    assert r["final"]["max_abs"] == max(abs(x) for x in r["final"]["residuals"]) and r["reference_fraction"] == 1.0
    assert "--set train.amp=none" in r["command"] and "--set label=hvd" in r["command"]
    cal = json.loads((results / "calibration.json").read_text())
    assert cal["columns"]["hvd"]["s_per_epoch"] > 0 and cal["reps"] == 1
    # resume: nothing runs again; a run that finished before its record was written is read back, not rerun
    before = (results / "hvd__s0.json").read_text()
    (results / "hvd__s1.json").unlink()
    p = _converge("--columns", "hvd", docs=docs, runs=runs)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (results / "hvd__s0.json").read_text() == before
    again = json.loads((results / "hvd__s1.json").read_text())
    assert again["wall_s"] is None and again["final"] == recs[1]["final"]
    page = (docs / "paper_table4_converge.md").read_text()
    assert "**Runs finished: 2 of 26 planned**" in page and "| hvd | 2 |" in page and "(calibration) |" in page
    out = json.loads((docs / "paper_table4_converge.json").read_text())["analysis"]
    assert out["fastest"] == "hvd" and out["columns"]["hvd"]["final_per_run"] == [x["final"]["max_abs"] for x in recs]


def _record(col, k, final, curve, times=None):
    e = [0, 50, 100] if len(curve) == 3 else [0, 40, 60, 100]
    return {"column": col, "run": k, "seed": 1000 + k, "epochs": 100, "final": {"max_abs": final},
            "curve": {"epoch": e, "max_abs": curve, "time_s": times or [0.0] * len(e)}}


def _study():
    """hvd is closer at equal epochs, rma-arar-arar (2x faster per epoch) at equal time; arar ties hvd."""
    recs = []
    for k in range(3):
        recs.append(_record("hvd", k, 0.010 + 0.002 * k, [1.0, 0.05 + 0.01 * k, 0.010 + 0.002 * k]))
        recs.append(_record("hvd-split", k, 0.010 + 0.002 * k, [1.0, 0.05 + 0.01 * k, 0.010 + 0.002 * k]))
        recs.append(_record("rma-arar-arar", k, 0.02 + 0.01 * k, [1.0, 0.015, 0.02 + 0.01 * k]))
        recs.append(_record("arar", k, 0.005 + 0.01 * k, [1.0, 0.08, 0.04, 0.005 + 0.01 * k], [0, 8, 12, 20]))
    cal = {"began": "b", "ended": "e", "epochs": 200, "ranks": 4, "reps": 2, "columns": {
        c: {"reps": [{"s_per_epoch": t, "load_before": 1.0, "load_after": 2.0},  # the fastest repetition counts
                     {"s_per_epoch": 1.1 * t, "load_before": 3.0, "load_after": 3.0}]}
        for c, t in (("hvd", 0.2), ("hvd-split", 0.2), ("rma-arar-arar", 0.1))}}  # arar: in-run 12 s / 60 epochs
    return recs, cal


def test_converge_statistics_by_hand():
    assert cv.mean_se([0.010, 0.012, 0.014]) == pytest.approx((0.012, 0.002 / 3 ** 0.5))
    assert np.isnan(cv.mean_se([0.5])[1]) and not cv.compare((0.5, float("nan")), (0.1, 0.0))["significant"]
    c = cv.compare((0.030, 0.01 / 3 ** 0.5), (0.012, 0.002 / 3 ** 0.5))
    assert c["diff"] == pytest.approx(0.018) and c["se"] == pytest.approx(0.0058878, rel=1e-4) and c["significant"]
    assert not cv.compare((0.015, 0.01 / 3 ** 0.5), (0.012, 0.002 / 3 ** 0.5))["significant"]  # 0.003 < 2 x 0.0059
    assert cv.stays_below_from([0, 50, 100], [1.0, 0.015, 0.02], 0.02) == 50
    assert cv.stays_below_from([0, 50, 100], [1.0, 0.015, 0.03], 0.02) is None  # dipped below, did not stay
    assert cv.stays_below_from([0, 50], [0.01, 0.01], 0.02) == 0
    assert cv.seconds_per_epoch([0, 40, 60, 100], [0, 8, 12, 20]) == pytest.approx(0.2)  # from epoch 40 (> 100/4)
    assert cv.calibrated([{"s_per_epoch": 0.3}, {"s_per_epoch": 0.2}, {"s_per_epoch": 0.25}]) == 0.2


def test_converge_equal_epochs_and_equal_time_by_hand(tmp_path):
    recs, cal = _study()
    an = cv.analyse(recs, cal)
    col = an["columns"]
    assert list(col) == ["hvd", "rma-arar-arar", "arar", "hvd-split"]
    # equal epochs: run.json's final max|r|; hvd 0.012 +- 0.0012, rma 0.030 +- 0.0058: hvd closer (3.1 SE)
    assert col["hvd"]["final"] == pytest.approx((0.012, 0.002 / 3 ** 0.5))
    assert col["rma-arar-arar"]["final"] == pytest.approx((0.030, 0.01 / 3 ** 0.5))
    eq = an["vs_hvd"]["rma-arar-arar"]["equal_epochs"]
    assert eq["diff"] == pytest.approx(0.018) and eq["significant"]
    assert not an["vs_hvd"]["arar"]["equal_epochs"]["significant"]  # 0.015 vs 0.012: within 2 SE
    # equal time: rma ends first, at 100 x 0.1 s = 10 s; hvd (0.2 s/epoch) is then at epoch 50 and arar (in-run
    # 0.2 s/epoch) at epoch 50, which it interpolates between 0.08 at 40 and 0.04 at 60: 0.06
    assert an["fastest"] == "rma-arar-arar" and an["equal_time_s"] == pytest.approx(10.0)
    assert col["arar"]["timing"] == "in-run (loaded)" and col["arar"]["s_per_epoch"] == pytest.approx(0.2)
    assert col["hvd"]["equal_time_epoch"] == pytest.approx(50) and col["arar"]["equal_time_epoch"] == pytest.approx(50)
    assert col["hvd"]["at_equal_time"] == pytest.approx((0.06, 0.01 / 3 ** 0.5))
    assert col["rma-arar-arar"]["at_equal_time"] == pytest.approx((0.030, 0.01 / 3 ** 0.5))
    assert col["arar"]["at_equal_time_per_run"] == pytest.approx([0.06] * 3)
    et = an["vs_hvd"]["rma-arar-arar"]["equal_time"]  # -0.03 +- 0.0082: rma closer at equal time
    assert et["diff"] == pytest.approx(-0.03) and et["se"] == pytest.approx(0.0081650, rel=1e-4) and et["significant"]
    # reach and stay below 0.02: hvd at epoch 100 (20 s) in every run; rma only in run 0, at epoch 50 (5 s)
    assert col["hvd"]["stay_below_time"] == pytest.approx((20.0, 0.0)) and col["hvd"]["stay_below_reached"] == 3
    assert col["rma-arar-arar"]["stay_below_reached"] == 1 and col["rma-arar-arar"]["stay_below_time"][0] == 5.0
    assert col["hvd"]["curve"]["mean"] == pytest.approx([1.0, 0.06, 0.012])
    # the controlled questions present: rma against hvd-split (= hvd here), hvd-split against hvd (the same)
    q = {(x["a"], x["b"]): x for x in an["questions"]}
    assert set(q) == {("rma-arar-arar", "hvd-split"), ("hvd-split", "hvd")}
    assert q[("rma-arar-arar", "hvd-split")]["equal_time"] == pytest.approx(et)
    assert q[("hvd-split", "hvd")]["equal_epochs"]["diff"] == 0 and not q[("hvd-split", "hvd")]["equal_epochs"][
        "significant"]
    assert cv.verdict("arar", "hvd", an["vs_hvd"]["arar"]["equal_epochs"], 0.015, 0.012).startswith(
        "no significant difference (arar − hvd = +0.0030 ± 0.0059)")
    assert cv.verdict("rma-arar-arar", "hvd", et, 0.03, 0.06) == (
        "**rma-arar-arar** closer, 2.00x (rma-arar-arar − hvd = -0.0300 ± 0.0082: 3.7 SE)")
    machine = {"cpu_model": "test CPU", "cores": 2, "torch": "x", "torch_cpu_capability": "AVX2", "vector_flags": []}
    written = cv.page(an, cal, recs, "converge", cv.PROFILES["converge"], tmp_path, machine)
    text = written[0].read_text()
    assert "**Runs finished: 12 of 65 planned**" in text and "provisional" in text
    assert "| rma-arar-arar | 3 | 0.0300 ± 0.0058 | **hvd** closer, 2.50x" in text
    assert "| split_batch in hvd (hvd-split against hvd) | no significant difference" in text


def test_git_commit_only_its_paths_and_waits_for_the_index_lock(tmp_path):
    import threading

    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "root"], check=True)
    mine, other = tmp_path / "mine.json", tmp_path / "other.txt"
    mine.write_text("{}\n")
    other.write_text("someone else's\n")
    subprocess.run([*git, "add", "other.txt"], check=True)  # staged by another engineer: must stay out
    lock = tmp_path / ".git" / "index.lock"
    lock.write_text("")
    threading.Timer(0.3, lock.unlink).start()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert cv.git_commit([mine], "a record", repo=tmp_path, wait_s=0.1)
        assert not cv.git_commit([mine], "again", repo=tmp_path, wait_s=0.1)  # nothing changed
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    show = subprocess.run([*git, "show", "--name-only", "--format=%s", "HEAD"], capture_output=True, text=True).stdout
    assert show.split() == ["a", "record", "mine.json"]
    assert "other.txt" in subprocess.run([*git, "diff", "--cached", "--name-only"], capture_output=True,
                                         text=True).stdout


def test_converge_says_whose_generator_each_curve_scores(tmp_path):
    """rma-arar-arar's metrics.jsonl scores rank 0's generator alone: the page names those columns and how far the
    curve's last point lies from the all-rank final figure; the other columns' curves are the final's estimator."""
    recs, cal = _study()
    for r in recs:
        r["ranks"], r["curve"]["quality_ranks"] = 4, (1 if r["column"] == "rma-arar-arar" else 4)
    recs.append({**_record("ensemble", 0, 0.01, [1.0, 0.1, 0.01], [0, 10, 20]), "ranks": 4, "members": 4})
    recs[-1]["curve"]["quality_ranks"] = 1
    an = cv.analyse(recs, cal)
    col = an["columns"]
    assert [col[c]["curve_of"] for c in ("hvd", "rma-arar-arar", "ensemble")] == ["all ranks", "rank 0",
                                                                                  "the members' mean"]
    # this study's rma curves end at the final figure (ratio 1); make run 0's end at 3x its final
    recs[2]["curve"]["max_abs"][-1] = 3 * recs[2]["final"]["max_abs"]
    an = cv.analyse(recs, cal)
    assert an["columns"]["rma-arar-arar"]["curve_end_over_final"][0] == pytest.approx(5 / 3)
    assert an["columns"]["hvd"]["curve_end_over_final"] == pytest.approx((1.0, 0.0))
    machine = {"cpu_model": "test CPU", "cores": 2, "torch": "x", "torch_cpu_capability": "AVX2", "vector_flags": []}
    text = cv.page(an, cal, recs, "converge", cv.PROFILES["converge"], tmp_path, machine)[0].read_text()
    assert "in rma-arar-arar those are **rank 0's generator alone**" in text
    assert "rma-arar-arar 1.67 ± 0.67x (1.00-3.00)" in text
    assert "not run by run.\n\nPer run (seed order), max|r̂| at the last epoch:\n\n- hvd: " in text
