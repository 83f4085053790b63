"""sagips.closure (a user's own closure test, issue 36): on jobs of proxy1d members at known offsets from the truth,
its non-closure s^2 = mean((p^ - p_true)^2 - sigma^2)/bound^2 against a hand computation with the bound computed
apart (the Fisher information of proxy1d, checked against its ML fit in tests/test_ml_covariance.py), and its bad
input as one line."""
import itertools
import json
import math

import numpy as np
import pytest

from sagips.analysis import stats
from sagips.closure import main
from tests.test_uncertainty import proxy1d, series, write_run

EVENTS = 1_000_000  #: (bounds of ~1 % of the parameters: shifts of a few bounds keep them alike)
SEEDS = itertools.count(1000)  #: one data set per job: each job's own seed


def job(path, truth, shift, events=EVENTS, seed=None):
    """Four members 1e-5 apart (so sigma is the data's floor, sqrt(1 + 1/4) bounds at subset_fraction 0.5) around
    truth + shift, on a data set of their own (generated with the job's seed)."""
    offsets = np.outer([1.0, -1.0, 0.5, -0.5], np.abs(truth)) * 1e-5
    seed = next(SEEDS) if seed is None else seed
    for m in range(4):
        write_run(path / f"member{m:03d}", "ensemble", series(np.asarray(truth) + shift, offsets[m:m + 1]), member=m,
                  events=events, seed=seed)
    return path


def test_the_non_closure_of_jobs_at_known_offsets(tmp_path, capsys):
    env, cfg = proxy1d()
    truth = np.asarray(cfg.true_params)
    b0 = stats.cramer_rao(env.fisher(truth), EVENTS)
    shifts = [3.0 * b0, -2.0 * b0, np.zeros(6)]  # (3 bounds off, 2 below, on the truth)
    dirs = [str(job(tmp_path / f"k{k}", truth, sh)) for k, sh in enumerate(shifts)]
    assert main([*dirs, "--noise-samples", "4", "--final-noise-samples", "4", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    c = json.loads((tmp_path / "c.json").read_text())
    # by hand: each job's bound at its own p^, sigma = the floor, so (p^ - t)^2/b^2 - 1.25 per parameter
    terms = []
    for sh in shifts:
        b = stats.cramer_rao(env.fisher(truth + sh), EVENTS)
        terms.append((sh / b) ** 2 - 1.25)
    terms = np.array(terms)
    np.testing.assert_allclose([p["nonclosure_sq"] for p in c["parameters"]], terms.mean(axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([p["nonclosure_sq_error"] for p in c["parameters"]],
                               terms.std(axis=0, ddof=1) / math.sqrt(3), rtol=1e-4)
    s = np.sqrt(terms.mean(axis=0))
    assert (terms.mean(axis=0) > 2).all()
    np.testing.assert_allclose([p["nonclosure"] for p in c["parameters"]], s, rtol=1e-4)
    # advised where s^2 is above its own error (here every parameter), rounded up to 2 decimals, by name
    assert c["recommended"] == {f"r_{i}": math.ceil(100 * float(v)) / 100 for i, v in enumerate(s)}
    # the pulls: about 3/sqrt(1.25) = 2.7 and 1.8 off, and 0: +-1 sigma covers 1 of 3
    assert all(abs(p["cover1"] - 1 / 3) < 1e-9 for p in c["parameters"])
    assert "σ falls short of the error: set `analysis.nonclosure: " in out and "3 data sets: s² is uncertain" in out
    # jobs on the truth: sigma covers the error, no non-closure
    again = str(job(tmp_path / "k2b", truth, np.zeros(6)))  # (another data set, on the truth too)
    assert main([dirs[2], again, "--noise-samples", "4", "--final-noise-samples", "4"]) == 0
    assert "σ covers the error (s² is nowhere above its own error)" in capsys.readouterr().out
    # one data set: no error for s^2, so no advice, however far
    assert main([dirs[0], "--noise-samples", "4", "--final-noise-samples", "4", "--json",
                 str(tmp_path / "1.json")]) == 0
    assert "one data set: s² has no error" in capsys.readouterr().out
    assert json.loads((tmp_path / "1.json").read_text())["recommended"] is None


def errors(text: str) -> list[str]:
    """The lines of stderr that are not progress ("job k of K")."""
    return [ln for ln in text.strip().splitlines() if " of " not in ln.split(":")[1]]


def test_bad_input_is_one_line(tmp_path, capsys):
    env, cfg = proxy1d()
    truth = np.asarray(cfg.true_params)
    no_bound = job(tmp_path / "nobound", truth, np.zeros(6), events=None)  # (run.json without the data's size)
    assert main([str(no_bound), "--noise-samples", "4", "--final-noise-samples", "4"]) == 2
    err = errors(capsys.readouterr().err)
    assert len(err) == 1 and "Cramér-Rao bound is not known" in err[0]
    assert main([str(tmp_path / "nowhere")]) == 2
    assert len(errors(capsys.readouterr().err)) == 1
    path = job(tmp_path / "notruth", truth, np.zeros(6))  # data that name no truth
    for m in range(4):
        rj = path / f"member{m:03d}" / "run.json"
        rj.write_text(json.dumps(dict(json.loads(rj.read_text()), truth_known=False)))
    assert main([str(path), "--noise-samples", "4", "--final-noise-samples", "4"]) == 2
    err = errors(capsys.readouterr().err)
    assert len(err) == 1 and "no truth" in err[0] and err[0].startswith("sagips.closure: error: ")


def test_no_non_closure_is_advised_for_fits_far_off_or_still_moving(tmp_path, capsys):
    """A non-closure is a systematic of a finished fit: jobs 8 bounds off the truth get advice to train longer, not a
    value to set; so do jobs whose parameters still move (analyze's diagnostic)."""
    env, cfg = proxy1d()
    truth = np.asarray(cfg.true_params)
    b0 = stats.cramer_rao(env.fisher(truth), EVENTS)
    far = [str(job(tmp_path / f"far{k}", truth, sign * 8.0 * b0)) for k, sign in enumerate((1, -1))]
    assert main([*far, "--noise-samples", "4", "--final-noise-samples", "4"]) == 0
    out = capsys.readouterr().out
    assert "have not reached the data's floor" in out and "set `analysis.nonclosure" not in out
    moving = tmp_path / "moving"  # 0.01 bounds an epoch: 2 over the last 20 % of the epochs, at the truth at the end
    offsets = np.outer([1.0, -1.0, 0.5, -0.5], np.abs(truth)) * 1e-5
    for m in range(4):
        write_run(moving / f"member{m:03d}", "ensemble", series(truth - 0.01 * b0 * 1000, offsets[m:m + 1],
                                                                 slope=0.01 * b0), member=m, events=EVENTS)
    assert main([str(moving), far[0], "--noise-samples", "4", "--final-noise-samples", "4"]) == 0
    out = capsys.readouterr().out
    assert "1 job(s) have parameters still moving or not judged" in out and str(moving) in out
    assert "set `analysis.nonclosure" not in out


def test_the_advice_is_what_the_config_and_analyze_read():
    """The advised settings parse: one number where the parameters agree to 10 %, else a mapping of the parameters
    that need one, as sagips.run's --set and the preset (sagips.config) and analyze's --nonclosure read them."""
    import re

    from sagips.analyze import _nonclosure
    from sagips.closure import advice
    from sagips.config import load

    one = advice({"a": 1.0, "b": 1.05})
    assert "`analysis.nonclosure: 1.05`" in one and "--nonclosure 1.05`" in one  # (the larger)
    per = advice({"tau": 0.0, "resolution": 2.5})
    yaml = re.search(r"--set 'analysis.nonclosure=(\{.*?\})'", per).group(1)
    assert load(None, [f"analysis.nonclosure={yaml}"]).analysis.nonclosure == {"resolution": 2.5}
    assert _nonclosure(re.search(r"--nonclosure (\S+)`", per).group(1)) == {"resolution": 2.5}


def test_jobs_still_moving_are_left_out_of_the_estimate(tmp_path, capsys):
    env, cfg = proxy1d()
    truth = np.asarray(cfg.true_params)
    b0 = stats.cramer_rao(env.fisher(truth), EVENTS)
    settled = [str(job(tmp_path / f"s{k}", truth, sign * 1.5 * b0)) for k, sign in enumerate((1, -1))]
    moving = tmp_path / "moving"
    offsets = np.outer([1.0, -1.0, 0.5, -0.5], np.abs(truth)) * 1e-5
    for m in range(4):
        write_run(moving / f"member{m:03d}", "ensemble", series(truth - 0.01 * b0 * 1000, offsets[m:m + 1],
                                                                 slope=0.01 * b0), member=m, events=EVENTS)
    args = ["--noise-samples", "4", "--final-noise-samples", "4"]
    assert main([*settled, *args, "--json", str(tmp_path / "a.json")]) == 0
    assert main([str(moving), *settled, *args, "--json", str(tmp_path / "b.json")]) == 0
    assert "left out above" in capsys.readouterr().out
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert b["left_out"] == [str(moving)] and b["data_sets"] == a["data_sets"] == 2
    assert [p["nonclosure_sq"] for p in b["parameters"]] == [p["nonclosure_sq"] for p in a["parameters"]]


def test_jobs_of_one_data_set_are_refused_and_unfinished_jobs_named(tmp_path, capsys):
    """A closure test averages over data sets: two jobs on one data set (the same seed, or one data file) are one
    line; a job that did not complete (killed: status running) is used at its last checkpoint, and named."""
    env, cfg = proxy1d()
    truth = np.asarray(cfg.true_params)
    a = job(tmp_path / "a", truth, np.zeros(6), seed=7)
    b = job(tmp_path / "b", truth, np.zeros(6), seed=7)
    assert main([str(a), str(b), "--noise-samples", "4", "--final-noise-samples", "4"]) == 2
    err = errors(capsys.readouterr().err)
    assert err == [f"sagips.closure: error: {a} and {b} fitted the same data set (generated with seed 7): a closure "
                   "test needs one job per data set, each made with its own seed"], err
    for m in range(4):
        rj = b / f"member{m:03d}" / "run.json"
        info = json.loads(rj.read_text())
        info["config"]["seed"] = 8
        rj.write_text(json.dumps(dict(info, status="running")))
    assert main([str(a), str(b), "--noise-samples", "4", "--final-noise-samples", "4"]) == 0
    out = capsys.readouterr().out
    assert main([str(a), str(a), "--noise-samples", "4", "--final-noise-samples", "4"]) == 2  # one job twice
    assert errors(capsys.readouterr().err) == [f"sagips.closure: error: {a}: given twice (as {a}): a closure test "
                                               "needs one job per data set"]
    assert f"- 1 job(s) did not complete (killed, stopped, failed or still running), and their fit above is at " \
           f"their last " \
           f"checkpoint: {b} (python -m sagips.analyze JOB names the epoch)" in out, out


def test_a_data_file_is_known_by_its_absolute_path():
    """run.json's reference_data.file (absolute) names the data set, not the config's path, which is relative to
    wherever the job was launched."""
    from sagips.analysis.ensemble import Run, data_identity

    def run(abs_path):
        info = {"config": {"seed": 1, "environment": {"data_file": "data/k.h5"}},
                "reference_data": {"file": abs_path}}
        return Run("r", info, {}, np.ones(2))

    assert data_identity(run("/a/data/k.h5")) != data_identity(run("/b/data/k.h5"))
    assert data_identity(run("/a/data/k.h5")) == data_identity(run("/a/data/k.h5")) == ("file", "/a/data/k.h5")
    assert data_identity(run(None)) == ("file", "data/k.h5")  # (a run.json from before it recorded the path)


def test_members_are_averaged_per_data_set_unless_each_set_is_split():
    """analyze's members of several data sets (ensemble.per_data_set): a data set's members share its error, so
    they are averaged into one; members on disjoint parts of their data set (ensemble.data=split) are independent
    estimates, and stay apart."""
    from sagips.analysis.ensemble import Run, per_data_set

    def run(seed, index=None):
        cfg = {"seed": seed, "environment": {"reference_events": 100}}
        info = {"mode": "ensemble", "config": cfg}
        if index is not None:
            cfg["ensemble"] = {"data": "split"}
            info["reference_data"] = {"split": [index, 4]}
        return Run("r", info, {0: {}, 1: {}}, np.ones(2))  # (2 ranks: 2 members each)

    values = np.arange(16.0).reshape(8, 2)
    runs = [run(1), run(1), run(2), run(2)]
    got, seen, note = per_data_set(runs, values, [0.5] * 8)
    np.testing.assert_allclose(got, [values[:4].mean(0), values[4:].mean(0)])
    assert "the 8 members learned from 2 data sets, 4 members each" in note
    split = [run(1, 0), run(1, 2), run(2, 0), run(2, 2)]  # (each run holds parts index, index + 1 of 4)
    got, _, note = per_data_set(split, values, [0.5] * 8)
    assert note is None and got is values
    assert per_data_set(runs[:2], values[:4], [0.5] * 4)[2] is None  # one data set: unchanged


def test_the_drift_of_data_sets_of_unequal_members_is_that_of_their_means(tmp_path):
    """p^ is the mean of the data sets' means (one of 2 members, one of 1): the drift over the last 20 % is that of
    the same mean, half the moving member's, not a third (the members' own mean)."""
    from sagips.analysis.ensemble import expand_run_dirs, group_uncertainty, load_run, predict_group

    env, cfg = proxy1d()
    truth = np.asarray(cfg.true_params)
    slope = np.zeros(6)
    slope[0] = 1e-4 * abs(truth[0])  # (0.02 |p_0| over epochs 800-1000)
    write_run(tmp_path / "a", "ensemble", series(truth, np.zeros((2, 6))), seed=1, events=EVENTS)
    write_run(tmp_path / "b", "ensemble", series(truth - 1000 * slope, np.zeros((1, 6)), slope=slope), seed=2,
              events=EVENTS)
    g = predict_group("g", [load_run(d) for d in expand_run_dirs([tmp_path / "a", tmp_path / "b"])], 4, 0)
    u, _ = group_uncertainty(g)
    assert u.n_members == 2
    assert float(np.abs(u.drift[0])) == pytest.approx(slope[0] * 200 / 2, rel=2e-3)
