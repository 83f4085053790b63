"""`python -m sagips.analyze` on real runs: one 4-rank job with --ensemble-size 2 gives two 2-rank runs (members).

One module-scoped mpiexec launch feeds every test; other cases are copies of those runs with run.json or a
checkpoint edited (another label, one rank, a wrong truth, a foreign environment).
"""
import csv
import json
import os
import shutil
import time

import numpy as np
import pytest
import torch

from sagips.analysis.ensemble import expand_run_dirs, group_runs, load_run
from sagips.analyze import main
from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.models import mlp
from tests._mpirun import run_mpi

QUICK = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress",
         "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
         "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
         "--set", "train.log_every=2", "--set", "train.checkpoint_every=2"]
K = 64


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    out = root / "ens"
    with_bar = [a for a in QUICK if a != "--no-progress"]
    r = run_mpi(4, with_bar + ["--mode", "ensemble", "--ensemble-size", "2", "--epochs", "4", "--output-dir",
                               str(out)], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    (root / "stdout.txt").write_text(r.stdout)
    (root / "stderr.txt").write_text(r.stderr)
    return root, out


def edit_json(path, **changes):
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))
    return info


def copy_run(src, dst, ranks=None):
    shutil.copytree(src, dst)
    if ranks is not None:
        for d in (dst / "checkpoints").iterdir():
            if int(d.name[4:]) not in ranks:
                shutil.rmtree(d)
    return dst


def test_members_are_two_runs_with_different_weights(job):
    _, out = job
    members = sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "analysis")  # (the job's analysis:
    # below; the job's lock, .sagips.lock, is a file)
    assert members == ["member000", "member001"]
    infos = [json.loads((out / m / "run.json").read_text()) for m in members]
    assert [i["member"] for i in infos] == [0, 1] and all(i["world_size"] == 2 and i["mode"] == "ensemble"
                                                         for i in infos)
    w = [load_checkpoint(list_checkpoints(out / m)[0][1])["generator"]["0.weight"] for m in members]
    assert not torch.equal(w[0], w[1])  # different seeds per member, from the very first epoch


def test_the_job_ends_with_the_analysis_of_its_members(job, tmp_path, capsys):
    """The member that ends last analyses the job (sagips/analysis/job.py): p̂ ± σ printed once, and the files in
    OUTPUT_DIR/analysis are those of `python -m sagips.analyze OUTPUT_DIR` with its defaults, run here again."""
    root, out = job
    printed = (root / "stdout.txt").read_text()
    assert printed.count("## Parameters: p̂ ± σ (what to quote)") == 1
    assert printed.count("the table is the mean of all") == 0  # no member prints a table of its own
    assert f"the job's analysis (summary.md, summary.json, figures) is in {out / 'analysis'}" in printed
    bars = (root / "stderr.txt").read_text()
    assert "ensemble member 0 of 2" in bars and "member 1 of 2" not in bars  # one progress bar per job
    assert bars.count("sagips: 2 members of ensemble on 2 rank(s) each") == 1  # one start-up line per job, member 0's
    tokens = {json.loads((out / m / "run.json").read_text())["job"] for m in ("member000", "member001")}
    assert len(tokens) == 1 and None not in tokens
    assert [p.name for p in (out / "analysis").glob(".claimed-*")] == [f".claimed-{tokens.pop()}"]
    assert main([str(out), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    mine, cli = (json.loads((d / "summary.json").read_text())["groups"][0]["uncertainty"]
                 for d in (out / "analysis", tmp_path / "again"))
    assert mine["n_members"] == 4  # 2 members of 2 ranks, which are independent in --mode ensemble
    for key in ("p_hat", "sigma", "members", "drift"):
        np.testing.assert_allclose(mine[key], cli[key], rtol=1e-12, err_msg=key)
    first = next(line for line in printed.splitlines() if line.startswith("| r_0 |"))
    assert first.split(" | ")[2].startswith(f"{mine['p_hat'][0]:.2f}")
    # a spread part that is the data's floor, not the members' own, says so in its column (here: 4 epochs)
    assert mine["floored"][0] and first.split(" | ")[4].endswith(" (the data floor)")


@pytest.fixture(scope="module")
def analysis(job):
    """The CLI on the job directory (it expands to its two members) plus a 1-rank copy of member000's rank 0,
    grouped by world size: two groups, two world sizes (so analysis_rate.png too)."""
    root, out = job
    single = copy_run(out / "member000", root / "single", ranks=[0])
    info = edit_json(single / "run.json", world_size=1)
    edit_json(single / "run.json", train_seconds=info["train_seconds"][:1])
    rep = root / "report"
    rc = main([str(out), str(single), "--out", str(rep), "--noise-samples", str(K), "--resamples", "20",
               "--group-by", "world_size"])
    assert rc == 0
    return rep, json.loads((rep / "summary.json").read_text())


def test_cli_writes_every_file(analysis):
    rep, s = analysis
    for name in ("summary.md", "summary.csv", "summary.json", "residuals_vs_time.png", "convergence.png",
                 "rmse_vs_spread.png", "analysis_rate.png"):
        assert (rep / name).stat().st_size > 0, name
    assert (rep / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # (saved under a temporary name)
    assert not list(rep.glob(".*.tmp"))  # every file renamed into place: a kill leaves none half-written
    assert [(g["name"], g["n_runs"]) for g in s["groups"]] == [("2 ranks", 2), ("1 rank", 1)]
    g = s["groups"][0]
    assert g["epochs"] == [1, 2, 4] and len(g["time_s"]) == 3 and g["time_s"] == sorted(g["time_s"])
    assert g["rmse_vs_spread"]["sizes"] == [2] and len(g["rmse_vs_spread"]["rmse_1e3"][0]) == 20
    assert s["groups"][1]["final"]["residual_sigma_1e3"] == [0.0] * 6  # one run: no spread
    assert s["groups"][1]["rmse_vs_spread"]["sizes"] == []
    assert sorted(r["world_size"] for r in s["analysis_rate_by_world_size"]) == [1, 2]
    md = (rep / "summary.md").read_text()
    assert "| r̂_5 |" in md and "![analysis_rate](analysis_rate.png)" in md
    # the Table IV table: the 2-run group with its members' spread, the single run with none (not "± 0.0")
    row = next(line for line in md.splitlines() if line.startswith("| r̂_0 |")).split(" | ")
    assert " ± " in row[2] and row[3].endswith("(one run: no spread between runs) |") and " ± " not in row[3]
    assert next(line for line in md.splitlines() if line.startswith("| mean σ_i/abs(p_i) |")).endswith("| n/a (one run) |")
    assert "A group of one run has no spread between runs here" in md


def test_csv_matches_json(analysis):
    rep, s = analysis
    rows = list(csv.reader((rep / "summary.csv").open()))
    assert rows[0] == ["parameter", "truth", "2 ranks residual [1e-3]", "2 ranks sigma [1e-3]",
                       "1 rank residual [1e-3]", "1 rank sigma [1e-3]", "2 ranks p_hat", "2 ranks p_hat sigma",
                       "1 rank p_hat", "1 rank p_hat sigma"]
    assert [r[0] for r in rows[1:]] == [f"r_{i}" for i in range(6)]
    for j, g in enumerate(s["groups"]):
        fin, u = g["final"], g["uncertainty"]
        np.testing.assert_allclose([float(r[2 + 2 * j]) for r in rows[1:]], fin["residual_1e3"], rtol=1e-12)
        np.testing.assert_allclose([float(r[3 + 2 * j]) for r in rows[1:]], fin["residual_sigma_1e3"], rtol=1e-12)
        np.testing.assert_allclose([float(r[6 + 2 * j]) for r in rows[1:]], u["p_hat"], rtol=1e-12)
        np.testing.assert_allclose([float(r[7 + 2 * j]) for r in rows[1:]], u["sigma"], rtol=1e-12)
    np.testing.assert_allclose([float(r[1]) for r in rows[1:]], s["groups"][0]["truth"])


def test_numbers_match_a_direct_computation(job, analysis):
    """Rebuild the generators by hand from the checkpoints; p = G(n) * (max - min) + min, averaged over ranks."""
    _, out = job
    _, s = analysis
    info = json.loads((out / "member000" / "run.json").read_text())
    env = info["config"]["environment"]
    lo, hi = torch.tensor(env["param_min"]), torch.tensor(env["param_max"])
    noise = torch.randn((K, env["noise_dim"]), generator=torch.Generator().manual_seed(0))  # --seed 0
    noise = noise * env["noise_scale"]  # the generator's noise is N(0, noise_scale^2) (the quick preset: 0.01)
    runs = []
    for m in ("member000", "member001"):
        per_rank = []
        for rank, eps in sorted(list_checkpoints(out / m).items()):
            G = mlp(env["noise_dim"], 6, env["hidden"], env["layers"], out_act=torch.nn.Sigmoid())
            G.load_state_dict(load_checkpoint(eps[4])["generator"])
            with torch.no_grad():
                per_rank.append((G(noise) * (hi - lo) + lo).double().numpy())
        runs.append(np.mean(per_rank, axis=0))
    preds = np.stack(runs)                                   # (M=2, K, 6)
    p_hat = preds.mean(0).mean(0)
    sigma = np.abs(preds[0] - preds[1]).mean(0) / 2          # population std of two values: |a - b| / 2
    truth = np.array(info["truth"])
    g = s["groups"][0]
    np.testing.assert_allclose(g["final"]["p_hat"], p_hat, rtol=1e-5)
    np.testing.assert_allclose(g["final"]["sigma"], sigma, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.array(g["final"]["residual_1e3"]) / 1e3, (truth - p_hat) / truth, rtol=1e-4,
                               atol=1e-7)
    # the time of an epoch: the mean time_s over both runs' ranks
    t = [load_checkpoint(p[4])["time_s"] for m in ("member000", "member001")
         for p in list_checkpoints(out / m).values()]
    assert g["final"]["time_s"] == pytest.approx(np.mean(t))
    # eq. 9 per run from run.json
    r0 = next(r for r in s["runs"] if r["run"].endswith("member000"))
    assert r0["analysis_rate"] == pytest.approx(2 * info["events_per_epoch"] * 4 / max(info["train_seconds"]))
    # and the group's mean and std over its runs' rates (summary.md's Groups table)
    per_run = [r["analysis_rate"] for r in s["runs"] if r["group"] == g["name"]]
    assert g["analysis_rate"]["per_run"] == pytest.approx(per_run) and len(per_run) == 2
    assert g["analysis_rate"]["mean"] == pytest.approx(np.mean(per_run)) and np.mean(per_run) > 1e3
    assert g["analysis_rate"]["std"] == pytest.approx(np.std(per_run))


def test_group_by_label_and_mode(job):
    root, out = job
    labelled = copy_run(out / "member001", root / "labelled")
    edit_json(labelled / "run.json", label="other", mode="arar-arar")
    runs = [load_run(p) for p in expand_run_dirs([out, labelled])]
    assert [r.path.name for r in runs] == ["member000", "member001", "labelled"]
    by_label = group_runs(runs, "label")
    assert {k: [r.path.name for r in v] for k, v in by_label.items()} == {
        "(no label)": ["member000", "member001"], "other": ["labelled"]}
    assert list(group_runs(runs, "mode")) == ["ensemble", "arar-arar"]
    assert list(group_runs(runs, "world_size")) == ["2 ranks"]


@pytest.mark.parametrize("status,says", [
    ("running", "status running: still training, or killed; its last record was written 3.0 h ago"),
    ("stopped", "stopped at epoch 2: --resume continues it"),
    ("failed", "failed: rank 1: FaultDrill: fault drill at epoch 3")])
def test_runs_of_unequal_length_are_analysed_at_their_last_common_epoch_and_named(job, tmp_path, capsys, status,
                                                                                  says):
    _, out = job
    short = copy_run(out / "member000", tmp_path / "short")
    for rank, eps in list_checkpoints(short).items():
        eps[4].unlink()  # this run stopped at epoch 2; member001 went on to 4
    edit_json(short / "run.json", status=status, stopped_at_epoch=2, error="rank 1: FaultDrill: fault drill at epoch 3")
    old = time.time() - 3 * 3600  # (a run killed from outside 3 h ago: its newest record's age is named)
    for f in ("run.json", "metrics.jsonl"):
        os.utime(short / f, (old, old))
    rc = main([str(short), str(out / "member001"), "--out", str(tmp_path / "r"), "--noise-samples", "8",
               "--final-noise-samples", "16", "--resamples", "5"])
    assert rc == 0
    u = json.loads((tmp_path / "r" / "summary.json").read_text())["groups"][0]["uncertainty"]
    assert u["epoch"] == 2
    note = next(n for n in u["notes"] if "the last checkpoint all 2 runs share" in n)
    assert f"{out / 'member001'} (to epoch 4)" in note and str(short) not in note, note
    assert note in capsys.readouterr().out and note in (tmp_path / "r" / "summary.md").read_text()
    assert f"{short} ({says}) did not complete: p̂ ± σ is at epoch 2, not at the end of training" in u["notes"]
    assert not any(str(out / "member001") in n for n in u["notes"] if "did not complete" in n)


def _bad(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sagips.analyze: error: "), err
    return lines[0]


def test_bad_input_no_checkpoints(job, tmp_path, capsys):
    _, out = job
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(out / "member000" / "run.json", empty / "run.json")
    assert "no checkpoints" in _bad(capsys, [str(empty), "--out", str(tmp_path / "r")])
    assert "no such directory" in _bad(capsys, [str(tmp_path / "absent"), "--out", str(tmp_path / "r")])
    (tmp_path / "nothing").mkdir()
    assert "not a sagips.run output" in _bad(capsys, [str(tmp_path / "nothing"), "--out", str(tmp_path / "r")])


def test_bad_input_mismatched_truths(job, tmp_path, capsys):
    _, out = job
    other = copy_run(out / "member001", tmp_path / "other")
    edit_json(other / "run.json", truth=[2.0, -0.5, 3.0, 1.0, -0.5, 4.0])
    msg = _bad(capsys, [str(out / "member000"), str(other), "--out", str(tmp_path / "r")])
    assert "mismatched truths" in msg and "group 'ensemble'" in msg
    assert not (tmp_path / "r").exists()
    # a run on measured data (its file named no truth) and one of known truth fit different data
    measured = copy_run(out / "member001", tmp_path / "measured")
    edit_json(measured / "run.json", truth_known=False)
    msg = _bad(capsys, [str(out / "member000"), str(measured), "--out", str(tmp_path / "r")])
    assert f"{out / 'member000'} ran on data of known truth, {measured} on measured data" in msg, msg
    assert not (tmp_path / "r").exists()


def test_bad_input_different_environments(job, tmp_path, capsys):
    _, out = job
    # a checkpoint that says it comes from another environment
    foreign = copy_run(out / "member001", tmp_path / "foreign")
    path = list_checkpoints(foreign)[1][2]
    ck = load_checkpoint(path)
    ck["environment"] = "optigan"
    torch.save(ck, path)
    msg = _bad(capsys, [str(out / "member000"), str(foreign), "--out", str(tmp_path / "r"), "--noise-samples", "8"])
    assert "environment 'optigan'" in msg and str(path) in msg
    # runs whose run.json name different environments
    renamed = copy_run(out / "member001", tmp_path / "renamed")
    edit_json(renamed / "run.json", environment="optigan")
    msg = _bad(capsys, [str(out / "member000"), str(renamed), "--out", str(tmp_path / "r")])
    assert "different environments" in msg


def test_members_of_several_data_sets_count_one_per_data_set(job, tmp_path, capsys):
    """Two runs of 2 independent ranks each, on two data sets (another seed): the ranks of one data set share its
    statistical error, so sigma's members part is the spread of the 2 data sets' means, s/sqrt(2) = |p_A - p_B|/2,
    against each run analysed alone (before, the 4 ranks were counted as independent: sigma too small)."""
    _, out = job
    other = copy_run(out / "member001", tmp_path / "other")
    info = json.loads((other / "run.json").read_text())
    assert info["mode"] == "ensemble" and info["world_size"] == 2  # (each run: 2 members of one data set)
    edit_json(other / "run.json", config=dict(info["config"], seed=info["config"]["seed"] + 17))
    noise = ["--noise-samples", "8", "--final-noise-samples", "8"]

    def analysed(*dirs, out_dir):
        assert main([*map(str, dirs), "--out", str(tmp_path / out_dir), *noise]) == 0, capsys.readouterr().err
        capsys.readouterr()
        return json.loads((tmp_path / out_dir / "summary.json").read_text())["groups"][0]["uncertainty"]

    a, b = analysed(out / "member000", out_dir="a"), analysed(other, out_dir="b")
    both = analysed(out / "member000", other, out_dir="ab")
    pa, pb = np.array(a["p_hat"]), np.array(b["p_hat"])
    np.testing.assert_allclose(both["p_hat"], (pa + pb) / 2, rtol=1e-9)
    np.testing.assert_allclose(both["members"], np.abs(pa - pb) / 2, rtol=1e-6)
    assert both["n_members"] == 2 and any("the 4 members learned from 2 data sets, 2 members each" in n
                                          for n in both["notes"]), both["notes"]


def test_unreadable_or_damaged_files_are_one_line(job, tmp_path, capsys, monkeypatch):
    _, out = job
    bad = copy_run(out / "member001", tmp_path / "bad")
    path = list_checkpoints(bad)[1][max(list_checkpoints(bad)[1])]
    os.truncate(path, 100)  # a damaged newest checkpoint: named, and what to do
    msg = _bad(capsys, [str(bad), "--out", str(tmp_path / "r"), "--noise-samples", "8"])
    assert f"{path}: cannot load checkpoint (" in msg and "move it away to analyse the run without it" in msg
    import pathlib

    import sagips.analysis.ensemble as ens

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(bad / "checkpoints" / "rank0001"))

    monkeypatch.setattr(ens, "list_checkpoints", denied)  # (as root, chmod 000 denies nothing)
    msg = _bad(capsys, [str(bad), "--out", str(tmp_path / "r")])
    assert msg.endswith(f"{bad / 'checkpoints' / 'rank0001'}: cannot read it (Permission denied)"), msg
    monkeypatch.setattr(pathlib.Path, "iterdir", denied)
    assert _bad(capsys, [str(bad), "--out", str(tmp_path / "r")]).endswith(f"{bad}: cannot read it (Permission denied)")
