"""benchmarks/coverage.py's --smoke profile (issue 36, item 4): data, a 2-member job, sagips.analyze and the ML fit
for 1 replica of smear1d, its JSON, resume (a rerun trains nothing), and the page generated whole."""
import copy
import json
import math
import re
import sys

import numpy as np
import pytest

from benchmarks import coverage


def test_smoke_profile_writes_replicas_resumes_and_the_page(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    real, left = coverage.replica, []

    def replica(args, case, k, work, env):  # what a finished replica leaves in the study's work directory
        rec = real(args, case, k, work, env)
        left.extend(p.name for p in work.iterdir() if p.name.startswith(case))
        return rec

    monkeypatch.setattr(coverage, "replica", replica)
    assert coverage.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert left == []  # its data file and run are gone: a study's disk is one replica's, whatever K is
    files = sorted((tmp_path / "coverage").glob("*.json"))
    assert [f.name for f in files] == ["smear1d-smoke-000.json"]
    rec = json.loads(files[0].read_text())
    assert rec["names"] == ["tau", "resolution"] and rec["gan"]["n_members"] == 2
    assert rec["gan"]["spread_from"] == "members" and all(s > 0 for s in rec["ml"]["sigma"])
    assert abs(rec["ml"]["p"][0] - 1.0) < 6 * rec["ml"]["sigma"][0]  # the ML fit of 4,000 events finds tau
    # p^ on the larger final noise batch, whose Monte-Carlo error is a part of sigma; the t interval of 1 dof
    assert rec["gan"]["noise_samples"] == 16384 and len(rec["gan"]["sampling"]) == 2
    assert all(s >= m for s, m in zip(rec["gan"]["sigma"], rec["gan"]["sampling"]))
    # strict JSON, and t factors of at least 1 degree of freedom (members 2): at most scipy.stats.t.ppf(0.8413, 1);
    # the Gaussian's 1 (within rounding) where the simulator's Cramér-Rao bound floors sigma (known, not sampled)
    assert "NaN" not in files[0].read_text() and "Infinity" not in files[0].read_text()
    assert all(1.0 - 1e-9 <= k <= 1.8374 for k in rec["gan"]["k68"]) and rec["gan"]["cramer_rao"] is not None
    stamps = [f.stat().st_mtime_ns for f in files]

    def no_training(*a, **k):
        raise AssertionError("a finished replica was trained again")

    monkeypatch.setattr(coverage, "replica", no_training)
    assert coverage.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert [f.stat().st_mtime_ns for f in files] == stamps
    page = (tmp_path / "coverage.md").read_text()
    assert "## smear1d (profile " in page and "| tau | 1 |" in page and "coverage.notes.md" in page
    assert "| *exact σ, M = 2 members* |" in page


def test_smoke_run_workflow_reports_the_floor_without_tuning(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert coverage.main(["--smoke", "--workflow", "run", "--out", str(tmp_path)]) == 0
    files = sorted((tmp_path / "coverage").glob("*.json"))
    assert [f.name for f in files] == ["smear1d-run-smoke-000.json"]
    rec = json.loads(files[0].read_text())
    assert rec["profile"]["workflow"] == "run" and rec["profile"]["config"] is None
    # one run of 2 exchanging ranks: one member, sigma from its ranks
    assert rec["gan"]["n_members"] == 1 and rec["gan"]["spread_from"] == "ranks"
    page = (tmp_path / "coverage.md").read_text()
    assert "## smear1d: the floor without tuning (profile " in page and "| tau | 1 |" in page


def test_a_run_in_the_default_mode_quotes_its_independent_ranks_as_members(tmp_path, monkeypatch):
    """--run-mode ensemble: one run of sagips.run's default mode, whose ranks are independent members (analyze's
    sigma from their spread, not the lower bound of exchanging ranks); its profile and page name the mode."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert coverage.main(["--smoke", "--workflow", "run", "--run-mode", "ensemble", "--out", str(tmp_path)]) == 0
    rec = json.loads(next((tmp_path / "coverage").glob("*.json")).read_text())
    assert rec["profile"]["run_mode"] == "ensemble"
    assert rec["gan"]["n_members"] == 2 and rec["gan"]["spread_from"] == "members"
    page = (tmp_path / "coverage.md").read_text()
    assert "one run of 2 ranks, ensemble," in page and "(the independent ranks' spread, as members" in page
    with pytest.raises(SystemExit):  # the ensemble workflow has its own mode
        coverage.parse_args(["--run-mode", "ensemble"])


def test_frozen_code_and_split_members(tmp_path):
    """--frozen-code runs the study from an export of HEAD (the record names its commit; the records still go to
    --out), and members on disjoint parts of the data (ensemble.data=split) give sigma = s/sqrt(M)."""
    import math
    import subprocess

    from tests._mpirun import ROOT, run_py

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    r = run_py(["benchmarks/coverage.py", "--smoke", "--frozen-code", "--out", str(tmp_path), "--set",
                "ensemble.data=split", "--set", "environment.subset_fraction=1.0"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"running from {ROOT / 'runs' / 'coverage' / ('code-' + head[:12])}" in r.stdout
    (rec,) = [json.loads(f.read_text()) for f in (tmp_path / "coverage").glob("*.json")]
    assert rec["code"] == head and rec["gan"]["n_members"] == 2
    assert rec["gan"]["factor"] == 1 / math.sqrt(2)  # independent members: the standard error of their mean


def test_studies_started_together_share_one_intact_export(tmp_path):
    """benchmarks/frozen.py: three processes export HEAD into one folder at once; each gets the same commit and
    the folder holds HEAD's files, with no leftover temporary folder."""
    import multiprocessing as mp
    import subprocess

    from benchmarks import frozen

    code = tmp_path / "code-x"
    with mp.get_context("spawn").Pool(3) as pool:
        shas = pool.map(_export, [code] * 3)
    assert len(set(shas)) == 1 and shas[0] == frozen.head()
    assert [p.name for p in tmp_path.iterdir()] == ["code-x"]
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", shas[0], "sagips"], cwd=frozen.ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(str(p.relative_to(code)) for p in (code / "sagips").rglob("*") if p.is_file()) == sorted(listed)


def _export(code):
    from benchmarks import frozen

    return frozen.export(code)[1]


def test_profiles_started_apart_by_default_never_resume_older_records(tmp_path, monkeypatch):
    """From coverage.STARTED_APART_FROM on, smear1d's and toy1d's members start apart by default: a profile without an
    environment.g_start setting is then a profile of its own (id and record names), so that a rerun never takes the
    records that the same settings made at the box's middle for its own."""
    from sagips.parametric import ParametricConfig, ParametricEnvironment

    assert ParametricConfig().g_start == coverage.STARTED_APART  # the page's claim is the library's default
    assert ParametricConfig().noise_scale == 0 and ParametricEnvironment.config_defaults["train"]["lr_g"] == 3e-4
    args = coverage.parse_args(["--case", "smear1d", "--out", str(tmp_path)])
    new = coverage.profile(args, "smear1d")
    assert new["g_start"] == 0.8
    assert coverage.record_path(tmp_path, args, "smear1d", 3).name == f"smear1d-{new['id']}-003.json"
    explicit = coverage.parse_args(["--case", "toy1d", "--set", "environment.precondition=fisher", "--set",
                                    "environment.g_start=0.8", "--out", str(tmp_path)])
    sized = coverage.profile(explicit, "toy1d")  # the batch sized from the data (SIZED_FROM on): a profile apart
    assert sized["sized"] == coverage.SIZED and sized["id"] != "0e92873fcb71"
    assert sized["critic"] == coverage.CRITIC  # the critic on the data's scale (CRITIC_SCALED_FROM on): the same
    assert sized["point"] == coverage.POINT  # a generator of one point (POINT_FROM on): the same
    with monkeypatch.context() as m:  # as before the batch was sized from the data and the critic scaled by it
        m.setattr(coverage, "sized_by_default", lambda a, case: False)
        m.setattr(coverage, "critic_scaled", lambda case: False)
        m.setattr(coverage, "point_by_default", lambda a, case: False)
        assert coverage.profile(explicit, "toy1d")["id"] == "0e92873fcb71"  # an explicit start: its records' id
    named = coverage.parse_args(["--case", "smear1d", "--set", "environment.events_per_sample=100", "--out",
                                 str(tmp_path)])
    assert "sized" not in coverage.profile(named, "smear1d")  # a batch named in --set: not today's defaults
    restate = [a for s in coverage.POINT_SET["smear1d"] for a in ("--set", s)]
    restated = coverage.parse_args(["--case", "smear1d", *restate, "--out", str(tmp_path)])
    assert "point" not in coverage.profile(restated, "smear1d")  # restated in --set: a profile of its own, at defaults
    assert coverage.at_defaults("smear1d", coverage.profile(restated, "smear1d"))

    def one(setting):  # a profile that names one of the two settings takes the other from the defaults: marked
        return coverage.profile(coverage.parse_args(["--case", "smear1d", "--set", setting, "--out", str(tmp_path)]),
                                "smear1d")

    assert one("environment.noise_scale=0.0")["point"] == coverage.POINT  # (its value as YAML reads it)
    assert coverage.at_defaults("smear1d", one("environment.noise_scale=0.0"))
    assert coverage.at_defaults("smear1d", one("train.lr_g=0.0003"))
    now = one("train.lr_g=1e-3")
    assert not coverage.at_defaults("smear1d", now)  # the old rate: not today's defaults
    with monkeypatch.context() as m:  # the same --set before the defaults changed (a spread generator): another id
        m.setattr(coverage, "point_by_default", lambda a, case: False)
        assert one("train.lr_g=1e-3")["id"] != now["id"]
    proxy = coverage.parse_args(["--case", "proxy1d", "--out", str(tmp_path)])
    assert not {"g_start", "critic", "point"} & set(coverage.profile(proxy, "proxy1d"))  # not a ParametricEnvironment
    assert coverage.record_path(tmp_path, proxy, "proxy1d", 0).name == "proxy1d-000.json"
    monkeypatch.setattr(coverage, "started_apart", lambda a, case: False)  # as before the defaults changed
    monkeypatch.setattr(coverage, "sized_by_default", lambda a, case: False)
    monkeypatch.setattr(coverage, "critic_scaled", lambda case: False)
    monkeypatch.setattr(coverage, "point_by_default", lambda a, case: False)
    assert coverage.profile(args, "smear1d")["id"] == "6acd8c3da6b4" != new["id"]  # the middle start's records
    assert coverage.record_path(tmp_path, args, "smear1d", 3).name == "smear1d-003.json"


def test_the_summary_shows_the_profiles_that_ran_todays_defaults():
    """The page's summary picks, per case and workflow, the largest profile that ran the shipped defaults: the
    members started apart (and toy1d preconditioned), the batch sized from the data, no other setting; and says
    'not measured' where none did. The records on disk are from before the batch and the critic's scale came from the
    data: here they pose as made after both (their profiles marked `sized` and `critic`); as they are, none is at
    today's defaults, nor without all three marks (the third: a generator of one point at lr_g 3e-4)."""
    from pathlib import Path

    from sagips.config import load
    from sagips.parametric import DensityConfig, ParametricConfig, ParametricEnvironment

    for case, sets in coverage.SAME_AS_DEFAULT.items():  # each restated setting is the library's or preset's today
        preset = load(str(Path(coverage.ROOT) / coverage.CASES[case][0])) if case == "proxy1d" else None
        for s in sets:
            key, value = s.split("=", 1)
            section, name = key.split(".", 1)
            if preset is not None:  # proxy1d: the setting of its preset, configs/proxy1d-quick.yaml
                assert coverage.restates(s, f"{key}={getattr(getattr(preset, section), name)}"), s
            elif section == "train":  # a ParametricEnvironment's training default (a density's own lr_g)
                own = {"lr_g": ParametricEnvironment.DENSITY_LR_G} if case == "toy1d" else {}
                assert own.get(name, ParametricEnvironment.config_defaults["train"][name]) == float(value), s
            else:
                cfg = DensityConfig() if case == "toy1d" else ParametricConfig()
                assert str(getattr(cfg, name)) == value or getattr(cfg, name) == float(value), s
    folder = Path(coverage.__file__).resolve().parents[1] / "docs" / "benchmarks" / "coverage"

    def records(name):
        rs = [json.loads(p.read_text()) for p in sorted(folder.glob(f"{name}-[0-9][0-9][0-9].json"))]
        assert not any(coverage.at_defaults(r["case"], r["profile"]) for r in rs if "critic" not in r["profile"])
        for r in rs:
            r["profile"]["sized"] = coverage.SIZED
            assert not coverage.at_defaults(r["case"], r["profile"])  # sized, but the critic on raw events
            r["profile"]["critic"] = coverage.CRITIC
            assert not coverage.at_defaults(r["case"], r["profile"])  # a generator spread over its noise, at 1e-3
            r["profile"]["point"] = coverage.POINT
        return rs

    default, middle = records("smear1d-3ae62d8d97a4"), records("smear1d")  # started apart / at the box's middle
    toy_now, toy_plain = records("toy1d-0e92873fcb71"), records("toy1d")  # preconditioned, apart / plain, middle
    toy_middle = records("toy1d-c4eaca352bd9")  # preconditioned, at the middle
    toy_long = records("toy1d-b0bed3456504")  # train.epochs=4000: not a default
    assert len(default) == len(middle) == len(toy_now) == len(toy_middle) == 20 and toy_plain and toy_long
    assert [coverage.at_defaults(rs[0]["case"], rs[0]["profile"]) for rs in
            (default, middle, toy_now, toy_plain, toy_middle, toy_long)] == [True, False, True, False, False, False]
    run_now = records("smear1d-run-2caa46ae9ac0")  # one run of 4 ranks at the defaults (the study adds data sets)
    assert run_now and coverage.at_defaults("smear1d", run_now[0]["profile"])
    run_mode = records("smear1d-run-d3c1f3ff1210")  # one run in sagips.run's default mode (--run-mode ensemble)
    assert run_mode and coverage.at_defaults("smear1d", run_mode[0]["profile"])
    small = copy.deepcopy(default[:3])  # a smaller profile at the defaults (by default, not restated): the larger
    for r in small:  # one is shown (they differ in more than their data seeds: never pooled)
        r["profile"].update(id="000000000000", set=[], g_start=coverage.STARTED_APART)
    # proxy1d's preset since the forty-second session: the lead, which its profiles ran by --set on the earlier
    # preset (lr_g 3e-4 on raw events for 4,000 epochs, whose records are no longer today's)
    proxy = [json.loads(p.read_text()) for p in sorted(folder.glob("proxy1d-fbc9e2c4f529-[0-9][0-9][0-9].json"))]
    assert len(proxy) >= 20 and coverage.at_defaults("proxy1d", proxy[0]["profile"])
    assert all(coverage.trained_as_today(r) for r in proxy)
    assert not coverage.at_defaults("proxy1d", dict(proxy[0]["profile"], set=["train.lr_g=3e-4"]))
    before = [json.loads(p.read_text()) for p in sorted(folder.glob("proxy1d-054f4872d7b7-[0-9][0-9][0-9].json"))]
    assert before and not coverage.at_defaults("proxy1d", before[0]["profile"])
    lines = coverage.summary(middle + small + toy_plain + toy_middle + toy_long + default + toy_now + run_now + run_mode
                             + proxy + before)
    res = [ln for ln in lines if ln.startswith("| smear1d | resolution | 3ae62d8d97a4 | 20 | 4 |")]
    assert len(res) == 1 and "| 80 % (56–94) |" in res[0]  # 16 of 20 covered: scipy's exact 95 % interval
    # the width's 95 % interval at K = 20: w sqrt(19 / chi2) with the tables' chi2_19 quantiles 32.852 and 8.907
    w, lo, hi = (float(v) for v in re.search(r"\| ([0-9.]+) \(([0-9.]+)–([0-9.]+)\) \|", res[0]).groups())
    assert abs(lo - w * (19 / 32.852) ** 0.5) <= 0.006 and abs(hi - w * (19 / 8.907) ** 0.5) <= 0.006
    assert any(ln.startswith("| toy1d | c | 0e92873fcb71 | 20 | 4 |") for ln in lines)
    assert any(ln.startswith(f"| smear1d | tau | 2caa46ae9ac0 | {len(run_now)} | 4 |") for ln in lines)
    others = ("6acd8c3da6b4", "c4eaca352bd9", "b0bed3456504", "000000000000")
    assert not any(pid in ln for ln in lines for pid in others)
    assert any(ln.startswith(f"| proxy1d | r_5 | fbc9e2c4f529 | {len(proxy)} | 4 |") for ln in lines)
    assert not any("054f4872d7b7" in ln for ln in lines)
    assert any(ln.startswith(f"| smear1d | resolution | d3c1f3ff1210 | {len(run_mode)} | 4 |") for ln in lines)
    # toy1d's and proxy1d's one run; toy1d's and proxy1d's one run in the default mode
    assert sum("not measured" in ln for ln in lines) == 4
    assert not any(coverage.at_defaults("smear1d", dict(r["profile"], events=4000)) for r in default[:1])
    # a pull that is not finite (sigma 0): the interval counts the 19 finite pulls
    broken = copy.deepcopy(default)
    g = broken[0]["gan"]
    g["members"][0] = g["drift"][0] = g["sampling"][0] = 0.0
    tau = [ln for ln in coverage.summary(broken) if ln.startswith("| smear1d | tau |")]
    assert len(tau) == 1 and "; 19 finite)" in tau[0]


def test_a_seed_offset_trains_other_noise_on_the_same_data(tmp_path):
    """--seed-offset: data set k keeps seed 1000+k, training gets 1000+k+OFFSET; a profile and records of its own."""
    args = coverage.parse_args(["--case", "smear1d", "--workflow", "run", "--seed-offset", "1000", "--out",
                                str(tmp_path)])
    plain = coverage.parse_args(["--case", "smear1d", "--workflow", "run", "--out", str(tmp_path)])
    prof = coverage.profile(args, "smear1d")
    assert prof["seed_offset"] == 1000 and prof["id"] != coverage.profile(plain, "smear1d")["id"]
    assert "seed_offset" not in coverage.profile(plain, "smear1d")  # older profiles keep their ids
    assert coverage.record_path(tmp_path, args, "smear1d", 2).name == f"smear1d-run-{prof['id']}-002.json"
    assert "training seed 1000+k+1000" in coverage.seeds_of(prof)


def test_data_seeds_draw_other_data_sets_in_a_profile_of_their_own(tmp_path, monkeypatch):
    """--data-seeds BASE: data set k is made with seed BASE+k and trained with it; a profile and records of their
    own, named in the page's heading; the default (1000) keeps the older profiles' ids."""
    import sagips.data

    args = coverage.parse_args(["--case", "proxy1d", "--data-seeds", "2000", "--out", str(tmp_path)])
    plain = coverage.parse_args(["--case", "proxy1d", "--out", str(tmp_path)])
    prof = coverage.profile(args, "proxy1d")
    assert prof["data_seeds"] == 2000 and "data_seeds" not in coverage.profile(plain, "proxy1d")
    assert prof["id"] != coverage.profile(plain, "proxy1d")["id"]
    assert coverage.record_path(tmp_path, args, "proxy1d", 3).name == f"proxy1d-{prof['id']}-003.json"
    assert coverage.seeds_of(prof) == ", data seeds 2000+k"
    assert coverage.seeds_of(coverage.profile(plain, "proxy1d")) == ""
    made = []

    class Made(Exception):
        pass

    def data_main(argv):  # what the replica asks sagips.data for
        made.append(argv[argv.index("--seed") + 1])
        raise Made

    monkeypatch.setattr(sagips.data, "main", data_main)
    with pytest.raises(Made):
        coverage.replica(args, "proxy1d", 3, tmp_path, {})
    assert made == ["2003"]


def test_the_pages_sigma_is_analyzes_rule_from_a_records_parts():
    """benchmarks/coverage.parts_now replays stats.uncertainty from what a record keeps: the same sigma and dof for
    members above and below the data's floor, and for one coupled run whose ranks' spread is training noise."""
    from sagips.analysis import stats

    values = np.array([[1.0, 10.0], [1.001, 10.4], [0.999, 9.6], [1.0, 10.0]])
    bound, drift, mc = np.array([0.05, 0.05]), np.array([0.0, 0.12]), np.array([0.01, 0.02])
    u = stats.uncertainty(values, np.full(2, np.nan), 1, drift, 0.5, True, mc, bound=bound)
    # the second's drift is under its spread but 2.4 bounds: in sigma by the bounds rule (stats.DRIFT_BOUNDS), which
    # parts_now must apply with the record's bound as analyze does
    assert u.spread[1] > drift[1] > stats.DRIFT_BOUNDS * bound[1] and u.drift_added.tolist() == [False, True]
    rec = {"subset_fraction": 0.5, "profile": {"set": [], "members": 4},
           "gan": {"spread_from": "members", "members": u.members.tolist(), "scatter": u.scatter.tolist(),
                   "drift": drift.tolist(), "sampling": mc.tolist(), "n_members": 4, "cramer_rao": bound.tolist(),
                   "sigma": u.sigma.tolist()}}
    for i in range(2):
        sigma, spread, floored, sampled = coverage.parts_now(rec, i)
        assert sigma == pytest.approx(u.sigma[i], rel=1e-12) and floored == bool(u.floored[i])
        dof = stats.effective_dof(np.array([sampled]), np.array([sigma]), 4, True)[0]
        assert dof == pytest.approx(u.dof[i], rel=1e-12)
    one = stats.uncertainty(values[:1], np.array([0.02, 0.03]), 4, drift, stats.seen_fraction(0.5, 4), True, mc,
                            bound=bound)
    rec["gan"].update(spread_from="ranks", ranks=[0.02, 0.03], n_members=1)
    for i in range(2):
        assert coverage.sigma_now(rec, i) == pytest.approx(one.sigma[i], rel=1e-12)


def test_t_normalised_pulls_of_an_exact_sigma_have_unit_width_and_the_verdict_reads_them():
    """Pulls of an exact sigma with d degrees of freedom follow Student's t (numpy's sampler, std sqrt(d / (d - 2))):
    their t-normalised width is 1 whatever d is, so the verdict's width is met; a sigma 1.5x too small is not."""
    rng = np.random.default_rng(7)
    for d in (3.0, 6.0, np.inf):
        pull = rng.standard_t(d, 20000) if np.isfinite(d) else rng.standard_normal(20000)
        z = coverage.t_normalised(pull, np.full(pull.size, d))
        assert np.std(z) == pytest.approx(1.0, abs=0.02)
        if d == 3.0:  # (the pulls themselves: Student's t_3, std 1.73)
            assert np.std(pull) > 1.5
        row = {"pull_width_t": float(np.std(z)), "pull_width": float(np.std(pull)), "n": 20,
               "cover1": float(np.mean(np.abs(pull) <= 1))}
        assert coverage.calibration_verdict(row) == "met"  # (t_3 covers 61 % at +-1, within 58-78 %)
        row["pull_width_t"] = float(np.std(coverage.t_normalised(1.5 * pull, np.full(pull.size, d))))
        assert coverage.calibration_verdict(row) == "missed"
        # a width that misses as the ML fit's own pulls on the same data sets do (same side) says so; else not
        assert coverage.calibration_verdict(dict(row, ml_pull_width=1.4)) == \
            "missed (width; the ML fit's pulls on these data sets: 1.40)"
        assert coverage.calibration_verdict(dict(row, ml_pull_width=0.7)) == "missed"
        assert coverage.calibration_verdict(dict(row, ml_pull_width=1.0)) == "missed"


def test_a_coverage_that_misses_as_the_ml_fits_own_does_says_so():
    """The ML fit's own coverage of +-1 sigma_ML on the same data sets (a hand count from the records) stands beside
    the GAN's; a coverage that misses the target on the same side as it does says so in the verdict, else not."""
    folder = coverage.ROOT / "docs" / "benchmarks" / "coverage"
    recs = [json.loads(p.read_text()) for p in sorted(folder.glob("proxy1d-054f4872d7b7-[0-9][0-9][0-9].json"))]
    for i, row in enumerate(coverage.stats_of(recs)):
        hand = sum(abs(r["ml"]["p"][i] - r["truth"][i]) <= r["ml"]["sigma"][i] for r in recs) / len(recs)
        assert row["ml_cover1"] == pytest.approx(hand, abs=1e-12)
    row = {"pull_width_t": 0.9, "n": 40, "cover1": 0.85}
    assert coverage.calibration_verdict(row) == "missed"
    assert coverage.calibration_verdict(dict(row, ml_cover1=0.82)) == \
        "missed (±1σ; the ML fit's own ±1σ_ML covers 82 % of these data sets)"
    assert coverage.calibration_verdict(dict(row, ml_cover1=0.70)) == "missed"  # the ML fit meets it: a real miss
    assert coverage.calibration_verdict(dict(row, cover1=0.5, ml_cover1=0.82)) == "missed"  # the other side
    both = dict(row, pull_width_t=0.7, ml_pull_width=0.75, ml_cover1=0.8)
    assert coverage.calibration_verdict(both) == ("missed (width; the ML fit's pulls on these data sets: 0.75; ±1σ; "
                                                  "the ML fit's own ±1σ_ML covers 80 % of these data sets)")
    assert coverage.calibration_verdict(dict(row, cover1=0.7, ml_cover1=0.9)) == "met"
    # a miss the ML fit does not share is named beside one it does
    assert coverage.calibration_verdict(dict(row, pull_width_t=0.7, ml_pull_width=1.0, ml_cover1=0.82)) == \
        "missed (width; ±1σ; the ML fit's own ±1σ_ML covers 82 % of these data sets)"


def test_a_preset_changed_under_a_study_is_never_resumed_nor_summarised(tmp_path, monkeypatch):
    """A profile's id names its --set, not the preset's contents: each record carries a digest of the preset's
    settings, a rerun refuses to resume records of other settings (one line, what to do), and the summary leaves
    them out; a comment edited in the preset changes nothing."""
    preset = coverage.ROOT / "configs" / "proxy1d-quick.yaml"
    today = coverage.preset_digest("configs/proxy1d-quick.yaml")
    assert today and coverage.preset_digest(str(preset)) == today and coverage.preset_digest(None) is None
    commented = tmp_path / "commented.yaml"
    commented.write_text("# a new comment\n" + preset.read_text())
    assert coverage.preset_digest(str(commented)) == today
    edited = tmp_path / "edited.yaml"
    edited.write_text(preset.read_text().replace("lr_d: 1.0e-3", "lr_d: 2.0e-3"))
    assert coverage.preset_digest(str(edited)) not in (None, today)

    args = coverage.parse_args(["--case", "proxy1d", "--replicas", "2", "--out", str(tmp_path)])
    prof = coverage.profile(args, "proxy1d")
    rec = {"case": "proxy1d", "replica": 0, "profile": prof, "preset": "0123456789ab"}
    (tmp_path / "coverage").mkdir()
    coverage.record_path(tmp_path, args, "proxy1d", 0).write_text(json.dumps(rec))

    def no_training(*a, **k):
        raise AssertionError("a replica was trained on top of records of another preset")

    monkeypatch.setattr(coverage, "replica", no_training)
    with pytest.raises(SystemExit, match=r"preset configs/proxy1d-quick.yaml changed since replica 0 of profile "
                                         rf"{prof['id']} was made: move .* before resuming"):
        coverage.main(["--case", "proxy1d", "--replicas", "2", "--out", str(tmp_path)])
    assert coverage.stale_preset([rec], today) is rec
    assert coverage.stale_preset([dict(rec, preset=today)], today) is None
    assert coverage.stale_preset([{k: v for k, v in rec.items() if k != "preset"}], today) is None  # older records
    folder = coverage.ROOT / "docs" / "benchmarks" / "coverage"
    proxy = [json.loads(p.read_text()) for p in sorted(folder.glob("proxy1d-fbc9e2c4f529-[0-9][0-9][0-9].json"))]
    assert any(ln.startswith("| proxy1d | r_0 | fbc9e2c4f529 |") for ln in coverage.summary(proxy))
    proxy[-1]["preset"] = "0123456789ab"  # one record of other settings: the profile is not today's preset
    lines = coverage.summary(proxy)
    assert not any("fbc9e2c4f529" in ln for ln in lines) and any(ln.startswith("| proxy1d |") and "not measured" in ln
                                                                 for ln in lines)


def test_at_typical_data_undoes_a_narrow_draw_of_data_sets():
    """An honest sigma on data sets whose ML errors happen to scatter narrowly (0.6 of sigma_ML): its pulls are
    narrow (~0.7), and `at_typical_data` (the GAN's error regressed on the ML fit's, the ML errors standardised) gives
    the width of typical data sets, 1; a sigma 1.5x too large reads 0.67 there. The verdict names it."""
    rng = np.random.default_rng(3)
    k = 400
    t, ms = np.zeros(k), np.ones(k)
    mp = 0.6 * rng.standard_normal(k)  # the narrow draw
    p = mp + 0.5 * rng.standard_normal(k)  # the GAN: the data's error plus its own
    s = np.full(k, np.sqrt(1 + 0.25))  # its honest sigma
    dof = np.full(k, np.inf)
    assert np.std(p / s) == pytest.approx(0.70, abs=0.05)
    typ = coverage.at_typical_data(t, p, s, mp, ms, dof)
    assert typ["slope"] == pytest.approx(1.0, abs=0.1) and typ["width_t"] == pytest.approx(1.0, abs=0.07)
    assert typ["cover1"] == pytest.approx(0.68, abs=0.05)
    assert coverage.at_typical_data(t, p, 1.5 * s, mp, ms, dof)["width_t"] == pytest.approx(0.67, abs=0.05)
    assert coverage.at_typical_data(t[:4], p[:4], s[:4], mp[:4], ms[:4], dof[:4]) is None  # too few data sets
    row = {"pull_width_t": 0.7, "n": 20, "cover1": 0.9, "ml_pull_width": 0.6, "typical": typ}
    assert coverage.calibration_verdict(row) == ("missed (width; the ML fit's pulls on these data sets: 0.60; ±1σ; "
                                                 f"on typical data sets, a model: width {typ['width_t']:.2f}, ±1σ "
                                                 f"{100 * typ['cover1']:.0f} %)")


def test_a_killed_study_stops_its_job_and_leaves_no_work_directory(tmp_path):
    """A SIGTERM to the study (`kill`, a batch system's wall time) stops the training job it runs (no rank is left
    running) and removes the work directory: a replica's data and run, ~1 GB for proxy1d, in a TMPDIR that may be
    memory. Before, the study died at once and both stayed."""
    import os
    import signal
    import subprocess
    import time

    from tests._mpirun import ROOT, child_env

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.Popen([sys.executable, "benchmarks/coverage.py", "--smoke", "--out", str(tmp_path / "out"),
                          "--set", "train.epochs=100000", "--set", "train.checkpoint_every=1000"],
                         cwd=ROOT, env=child_env({"TMPDIR": str(tmp)}), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not list(tmp.glob("sagips-coverage-*/smear1d-000-run/**/metrics.jsonl")):  # the job trains
            assert p.poll() is None, p.communicate()[1][-2000:]
            assert time.time() - t0 < 180, "the smoke's job did not start training"
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)  # the study alone, not its process group
        err = p.communicate(timeout=120)[1]
        assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert list(tmp.glob("sagips-coverage-*")) == []  # (torch keeps a cache of its own there)
        assert running(str(tmp)) == [], "ranks of the study's job still run"
        assert not list((tmp_path / "out" / "coverage").glob("*.json"))  # no record of an unfinished replica
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for pid in running(str(tmp)):  # `timeout` runs the job in a process group of its own
            os.kill(pid, signal.SIGKILL)


def running(text: str) -> list[int]:
    """The processes whose command line holds `text` (/proc, as pgrep -f)."""
    from pathlib import Path

    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:  # ended meanwhile
            pass
    return pids


def test_profiles_that_differ_only_in_their_data_seeds_pool_in_the_summary(monkeypatch):
    """--data-seeds draws other data sets of one calibration: the summary pools them (K adds up, one record per
    seed), and its numbers are those of the pooled records computed directly; another setting never pools."""
    from pathlib import Path

    folder = Path(coverage.__file__).resolve().parents[1] / "docs" / "benchmarks" / "coverage"
    rs = [json.loads(p.read_text()) for p in sorted(folder.glob("smear1d-8f7da98cea43-[0-9][0-9][0-9].json"))]
    for r in rs:  # made before the generator of one point became the default: posing as made after
        r["profile"]["point"] = coverage.POINT
    assert len(rs) >= 12 and coverage.at_defaults("smear1d", rs[0]["profile"])
    first, second = copy.deepcopy(rs[:6]), copy.deepcopy(rs[4:10])  # two studies; seeds 1004 and 1005 in both
    for r in second:
        r["profile"] = dict(r["profile"], data_seeds=1004, id="0123456789ab")
    other = copy.deepcopy(rs[6:9])
    for r in other:  # another setting: never pooled with the others
        r["profile"] = dict(r["profile"], members=8, id="ba9876543210")
    lines = coverage.summary(second + other + first)
    tau = [ln for ln in lines if ln.startswith("| smear1d | tau |")]
    assert len(tau) == 1 and tau[0].startswith("| smear1d | tau | 8f7da98cea43+0123456789ab | 10 | 4 |")
    direct = coverage.stats_of(rs[:10])[0]  # the ten distinct data sets, as one profile
    assert f"| {direct['pull_mean']:+.2f} | {direct['pull_width_t']:.2f} (" in tau[0]
    assert coverage.settings_of(first[0]["profile"]) == coverage.settings_of(second[0]["profile"])
    # a study of the same settings under a preset that has changed since: dropped before pooling, hiding nothing
    stale = copy.deepcopy(rs[10:])
    for r in stale:
        r.update(profile=dict(r["profile"], data_seeds=3000, id="5a1e5a1e5a1e"), preset="0123456789ab")
    monkeypatch.setattr(coverage, "preset_digest", lambda config: "fedcba987654")
    for r in first + second:
        r["preset"] = "fedcba987654"
    tau = [ln for ln in coverage.summary(stale + second + first) if ln.startswith("| smear1d | tau |")]
    assert len(tau) == 1 and tau[0].startswith("| smear1d | tau | 8f7da98cea43+0123456789ab | 10 | 4 |")
    assert coverage.settings_of(first[0]["profile"]) != coverage.settings_of(other[0]["profile"])


def test_the_nonclosure_a_calibration_measures_and_the_one_it_applies():
    """coverage.nonclosure_sq against a hand computation: members that all saw the whole data set, sigma =
    sqrt(members^2 + bound^2) = sqrt(1.25) bounds, a GAN 1.2 bounds from the ML fit (sigma_ML = bound) measure
    1.2^2 + 1 - 1.25 = 1.19 bounds^2; applied (analysis.nonclosure = sqrt(1.19)), sigma grows by exactly that, so the
    error beyond it is 0. Which value a record gets: its runs' own, else for the preset at today's defaults the
    preset's current one (configs/proxy1d-quick.yaml), else none."""
    from pathlib import Path

    b = np.array([0.01, 0.04])
    recs = []
    for k in range(6):
        ml = np.array([1.0, 2.0]) + 0.3 * b * (-1) ** k
        recs.append({"case": "proxy1d", "subset_fraction": 1.0, "names": ["a", "b"], "truth": [1.0, 2.0],
                     "profile": {"set": [], "members": 4},
                     "gan": {"spread_from": "members", "members": (0.5 * b).tolist(), "scatter": b.tolist(),
                             "drift": [0.0, 0.0], "sampling": [0.0, 0.0], "n_members": 4, "cramer_rao": b.tolist(),
                             "p_hat": (ml + 1.2 * b * (-1) ** (k // 2)).tolist(), "nonclosure": 0.0,
                             "sigma": (math.sqrt(1.25) * b).tolist()},
                     "moving": [False, False], "ml": {"p": ml.tolist(), "sigma": b.tolist()}})
    for i in range(2):
        assert coverage.sigma_now(recs[0], i) == pytest.approx(math.sqrt(1.25) * b[i], rel=1e-12)
        assert coverage.nonclosure_sq(recs, i) == pytest.approx(1.44 + 1 - 1.25, rel=1e-12)
        # against the truth: errors (0.3 +- 1.2) bounds, half 1.5 and half 0.9 wide: (2.25 + 0.81) / 2 - 1.25
        assert coverage.nonclosure_sq(recs, i, against="truth") == pytest.approx(1.53 - 1.25, rel=1e-12)
    for r in recs:
        r["gan"]["nonclosure"] = math.sqrt(1.19)
    for i in range(2):
        assert coverage.sigma_now(recs[0], i) == pytest.approx(math.sqrt(1.25 + 1.19) * b[i], rel=1e-12)
        assert coverage.sigma_now(recs[0], i, 0.0) == pytest.approx(math.sqrt(1.25) * b[i], rel=1e-12)
        assert coverage.nonclosure_sq(recs, i) == pytest.approx(1.19, rel=1e-12)  # (measured without it)
    line = coverage.nonclosure_line(coverage.stats_of(recs))
    assert "a 1.09, b 1.09; over all parameters 1.09" in line and "Applied to σ above: 1.09 bounds" in line
    assert "sagips.closure measures it" in line and "a 0.53, b 0.53; over all parameters 0.53" in line
    recs[0]["moving"], recs[1]["moving"] = [None, True], [None, False]  # not judged is neither moving nor settled
    a_row, b_row = coverage.stats_of(recs)
    assert (a_row["moving"], a_row["not_judged"], b_row["moving"], b_row["not_judged"]) == (0, 2, 1, 0)
    assert coverage.judged_cell(a_row) == " (+2 not judged)" and coverage.judged_cell(b_row) == ""
    recs[0]["gan"]["nonclosure"] = 0.0  # records made with two values: the line says so, never their mean
    assert "Applied to σ above: varies by record (0; 1.09 bounds)." in coverage.nonclosure_line(
        coverage.stats_of(recs))
    recs[0]["gan"]["nonclosure"] = {"b": 0.5}  # per parameter: b's sigma gains it, a's not
    assert coverage.sigma_now(recs[0], 0) == pytest.approx(math.sqrt(1.25) * b[0], rel=1e-12)
    assert coverage.sigma_now(recs[0], 1) == pytest.approx(math.sqrt(1.25 + 0.25) * b[1], rel=1e-12)
    # which non-closure a real record gets
    folder = Path(coverage.__file__).resolve().parents[1] / "docs" / "benchmarks" / "coverage"
    preset = json.loads((folder / "proxy1d-054f4872d7b7-000.json").read_text())  # (from before the option)
    variant = json.loads((folder / "proxy1d-bc9f9d4b5757-000.json").read_text())
    # (the preset's records until the forty-second session: of the earlier preset, at its settings)
    assert "nonclosure" not in preset["gan"] and not coverage.at_defaults("proxy1d", preset["profile"])
    assert coverage.at_earlier_defaults(preset, coverage.earlier_preset(preset))
    assert coverage.nonclosure_of(preset) == 0.7 and coverage.nonclosure_of(variant) == 0.0
    today = dict(preset, preset=coverage.preset_digest("configs/proxy1d-quick.yaml"),
                 profile=dict(preset["profile"], set=[]))  # today's preset, as it is: its non-closure today
    assert coverage.nonclosure_of(today) == 0.4
    # never to a superseded profile, nor to records of a preset whose training settings have changed since
    assert coverage.nonclosure_of(dict(preset, superseded=True)) == 0.0
    assert coverage.nonclosure_of(dict(preset, preset="0123456789ab")) == 0.0
    assert coverage.nonclosure_of(dict(preset, profile=dict(preset["profile"], workflow="run"))) == 0.7
    preset["gan"]["nonclosure"] = 0.25
    assert coverage.nonclosure_of(preset) == 0.25


def test_records_of_an_earlier_preset_that_restate_todays_by_set_are_todays():
    """EARLIER_PRESETS: each earlier digest, which its records carry, is rebuilt from today's preset file and the
    settings in which it differed; a record of it whose --set gives each such key today's value trained today's
    preset (the summary pools it), one that leaves a key out did not; and each is read with the non-closure that
    analyze read it with (the earlier preset's where it ran that preset's settings, none where it ran others)."""
    import hashlib

    for cfg, earlier in coverage.EARLIER_PRESETS.items():
        for digest, diff in earlier.items():
            raw = {k: v for k, v in coverage.preset_settings(cfg).items() if k != "analysis"}
            for key, value in diff.items():
                if key.startswith("analysis."):
                    continue
                section, name = key.split(".", 1)
                raw[section].pop(name) if value is None else raw[section].__setitem__(name, value)
            assert hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:12] == digest
            assert digest != coverage.preset_digest(cfg)
    folder = coverage.ROOT / "docs" / "benchmarks" / "coverage"

    def recs(pid):
        return [json.loads(p.read_text()) for p in sorted(folder.glob(f"proxy1d-{pid}-[0-9][0-9][0-9].json"))]

    lead, before, partial = recs("fbc9e2c4f529"), recs("054f4872d7b7"), recs("bc9f9d4b5757")  # partial: 4,000 epochs
    assert lead[0]["preset"] == "2e6825a91887" and "train.epochs=6000" in lead[0]["profile"]["set"]
    assert all(coverage.trained_as_today(r) for r in lead)
    assert not any(coverage.trained_as_today(r) for r in partial if r["preset"])
    assert not coverage.trained_as_today(dict(lead[0], preset="0123456789ab"))  # an unknown preset
    # analyze's non-closure: the run's own where it carried one; else the earlier preset's where the record ran its
    # settings (the preset then, 0.7), and none for a variant of it
    assert coverage.nonclosure_of(lead[0]) == 0.0  # (its runs carried analysis.nonclosure=0)
    assert [coverage.nonclosure_of(r) for r in (before[0], before[-1])] == [0.7, 0.7]  # (no digest; the digest)
    assert coverage.nonclosure_of(partial[0]) == 0.0
    assert coverage.today_nonclosure("configs/proxy1d-quick.yaml") == 0.4


def test_the_summary_reads_records_under_todays_non_closure():
    """Profiles that differ only in analysis settings are one training: pooled, and every pull recomputed with the
    preset's analysis.nonclosure of today (0.4 bounds added in quadrature), not each record's own (0 and
    0.7 along d): by hand from the records' parts."""
    folder = coverage.ROOT / "docs" / "benchmarks" / "coverage"
    rs = [json.loads(p.read_text()) for pid in ("fbc9e2c4f529", "5a0ae2905849")
          for p in sorted(folder.glob(f"proxy1d-{pid}-[0-9][0-9][0-9].json"))]
    assert {json.dumps(r["gan"]["nonclosure"], sort_keys=True) for r in rs} == {
        "0.0", '{"r_3": 0.7, "r_4": 0.7, "r_5": 0.7}'}
    assert coverage.settings_of(rs[0]["profile"]) == coverage.settings_of(rs[-1]["profile"])
    line = next(ln for ln in coverage.summary(rs) if ln.startswith("| proxy1d | r_3 |"))
    assert f"| {len(rs)} | 4 |" in line
    i = rs[0]["names"].index("r_3")
    s0 = np.array([coverage.sigma_now(r, i, 0.0) for r in rs])
    bound = np.array([r["gan"]["cramer_rao"][i] for r in rs])
    s = np.sqrt(s0 ** 2 + (0.4 * bound) ** 2)  # (no drift enters where s0 already holds it: both from the parts)
    pull = np.array([r["gan"]["p_hat"][i] - r["truth"][i] for r in rs]) / s
    assert np.array([coverage.sigma_now(r, i, 0.4) for r in rs]) == pytest.approx(s, rel=1e-9)
    assert f"| {np.std(pull, ddof=1):.2f} |" in line and f" {100 * np.mean(np.abs(pull) <= 1):.0f} % (" in line
    own = coverage.stats_of(rs)[i]
    assert own["pull_width"] != pytest.approx(float(np.std(pull, ddof=1)), abs=1e-3)  # (each record's own differs)


def test_todays_training_resumes_reads_and_pools_as_today():
    """Review of the forty-second session: a study at today's preset resumes records of the earlier preset whose
    --set restates today's (and refuses those that do not); a proxy1d record from before digests (which preset it
    trained is not known) is not today's; a run row reads sigma under today's non-closure, as an ensemble row does;
    an unreadable preset leaves each record its own."""
    folder = coverage.ROOT / "docs" / "benchmarks" / "coverage"

    def recs(pattern):
        return [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]

    today = coverage.preset_digest("configs/proxy1d-quick.yaml")
    lead, partial = recs("proxy1d-fbc9e2c4f529-0*.json"), recs("proxy1d-bc9f9d4b5757-0*.json")
    assert coverage.stale_preset(lead, today) is None  # resumed at HEAD: the same training
    assert coverage.stale_preset(partial, today) is partial[0]  # 4,000 epochs: refused
    old = dict(lead[0], preset=None)  # (no digest)
    assert not coverage.trained_as_today(old) and coverage.stale_preset([old], today) is None
    smear = recs("smear1d-run-651acc1d689d-0*.json")
    assert smear and coverage.trained_as_today(dict(smear[0], preset=None))  # no earlier presets: as before
    # a run profile that only set the analysis: today's defaults, read under today's non-closure (0: no preset)
    plain = [ln for ln in coverage.summary(smear) if "| 651acc1d689d |" in ln]
    odd = copy.deepcopy(smear)
    for r in odd:
        r["profile"]["set"] = ["analysis.nonclosure=3"]
        r["gan"]["nonclosure"] = 3.0
    assert [ln for ln in coverage.summary(odd) if "| 651acc1d689d |" in ln] == plain and len(plain) == 2
    assert coverage.floor_rows(odd[0]["profile"], odd)[0]["cover1"] != coverage.floor_rows(
        odd[0]["profile"], odd, 0.0)[0]["cover1"]  # (its own 3 bounds cover more)
    assert coverage.today_nonclosure(None) == 0.0 and coverage.today_nonclosure("nosuch:preset") is None
