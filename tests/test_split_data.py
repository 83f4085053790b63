"""ensemble.data=split (issue 36): the members learn from disjoint parts of one data set, so that they are independent
estimates and sagips.analyze's sigma is their standard error s/sqrt(M).

The parts are checked against the file itself (column 1 holds the row number): disjoint, covering every row, each
rank's subset inside its part; without split the subsets are those of before (tests/test_shard.py pins them). A real
2-member toy1d job records its parts, and analyze turns its members' scatter into s/sqrt(M)."""
import json
import math

import h5py
import numpy as np
import pytest

from sagips.analysis import stats
from sagips.io import shard
from sagips.io.refdata import DataError
from tests._mpirun import run_mpi
from tests._plugins import add_to_sys_path, pythonpath, toy_site
from tests.test_toy1d_e2e import TINY

ROWS, CHUNK = 20000, 256


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("split") / "ref.h5"
    ev = np.stack([np.random.default_rng(0).random(ROWS), np.arange(ROWS)], axis=1).astype(np.float32)
    with h5py.File(p, "w") as f:
        f.create_dataset("events", data=ev, chunks=(CHUNK, 2))
    return p


def rows_of(path, layout, ranges):
    return shard.read_subset(str(path), layout, ranges, {"events": 2})["events"][:, 1].astype(np.int64)


@pytest.mark.parametrize("mode", ["blocks", "rows"])
@pytest.mark.parametrize("parts", [2, 3, 8])
def test_parts_are_disjoint_and_cover_the_file(data_file, mode, parts):
    layout = shard.read_layout(data_file, {"events": 2})
    got = [rows_of(data_file, layout, shard.member_part(layout, mode, (7, i, parts))) for i in range(parts)]
    every = np.concatenate(got)
    assert len(every) == ROWS and np.array_equal(np.sort(every), np.arange(ROWS))  # disjoint and complete
    unit = CHUNK if mode == "blocks" else 1
    assert max(map(len, got)) - min(map(len, got)) < 2 * unit  # fair shares: one unit, and the short last block
    if mode == "blocks":  # whole chunks
        assert all(np.all(r[::CHUNK] % CHUNK == 0) for r in got)
    assert not np.array_equal(got[0], np.arange(len(got[0])))  # dealt in a random order, not cut in stretches
    # another seed deals another way; the same seed the same way
    assert not np.array_equal(shard.member_part(layout, mode, (8, 0, parts)),
                              shard.member_part(layout, mode, (7, 0, parts)))
    assert np.array_equal(shard.member_part(layout, mode, (7, 1, parts)), shard.member_part(layout, mode, (7, 1, parts)))


@pytest.mark.parametrize("mode", ["blocks", "rows"])
def test_a_ranks_subset_is_its_fraction_of_its_part(data_file, mode):
    layout = shard.read_layout(data_file, {"events": 2})
    part = set(rows_of(data_file, layout, shard.member_part(layout, mode, (3, 1, 4))))
    for seed in (11, 12):
        mine = rows_of(data_file, layout, shard.subset_ranges(seed, layout, 0.5, mode, (3, 1, 4)))
        assert set(mine) <= part and len(mine) == round(0.5 * len(part)) and len(set(mine)) == len(mine)
    whole = rows_of(data_file, layout, shard.subset_ranges(11, layout, 1.0, mode, (3, 1, 4)))
    assert set(whole) == part


def test_more_parts_than_blocks_is_one_line(data_file):
    layout = shard.read_layout(data_file, {"events": 2})
    with pytest.raises(DataError) as e:
        shard.member_part(layout, "blocks", (1, 0, 200))  # 20000 rows in 79 blocks
    assert "\n" not in str(e.value) and "data.subset=rows" in str(e.value) and "200 parts" in str(e.value)
    assert len(shard.member_part(layout, "rows", (1, 0, 200))) == ROWS // 200


def test_split_members_are_independent_in_analyze(tmp_path, monkeypatch):
    """A real job: 2 members of 1 rank (--mode ensemble), toy1d's data generated per rank, split. Each records its
    part; their rows, rebuilt from the file that the seed gives, are disjoint; analyze's factor is 1/sqrt(2)."""
    site = tmp_path / "site"
    site.mkdir()
    paths = toy_site(site)
    out = tmp_path / "job"
    # (started at the box's middle, g_start 0, where toy1d's a and b are strongly correlated: the note below)
    r = run_mpi(2, TINY + ["--mode", "ensemble", "--ensemble-size", "2", "--epochs", "2", "--set",
                           "ensemble.data=split", "--set", "environment.subset_fraction=1.0", "--set",
                           "environment.g_start=0", "--output-dir", str(out)], env=pythonpath(paths), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ensemble.data=split keeps" not in r.stderr  # (subset_fraction 1: every event once)
    infos = [json.loads((out / f"member{m:03d}" / "run.json").read_text()) for m in (0, 1)]
    assert [i["reference_data"]["split"] for i in infos] == [[0, 2], [1, 2]]
    assert sum(i["reference_data"]["rows"] for i in infos) == 20000  # every event once

    from sagips.analyze import main as analyze_main

    add_to_sys_path(paths, monkeypatch)
    assert analyze_main([str(out), "--out", str(tmp_path / "rep"), "--noise-samples", "16", "--resamples", "2",
                         "--final-noise-samples", "16"]) == 0
    u = json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]["uncertainty"]
    assert u["n_members"] == 2 and u["factor"] == pytest.approx(1 / math.sqrt(2))
    np.testing.assert_allclose(u["members"], np.asarray(u["scatter"]) / math.sqrt(2), rtol=1e-6)
    assert any("disjoint parts" in n for n in u["notes"])
    # toy1d's a and b are strongly correlated in the data's information: analyze notes it exactly where an
    # independent quadrature (benchmarks/toy1d.fisher) at the same p^ says |corr| >= 0.95
    from benchmarks import toy1d

    cov = np.linalg.inv(toy1d.fisher(np.asarray(u["p_hat"])))
    corr_ab = cov[0, 1] / math.sqrt(cov[0, 0] * cov[1, 1])
    noted = [n for n in u["notes"] if n.startswith("a and b are ") and "correlated" in n]
    assert bool(noted) == (abs(corr_ab) >= 0.95) and abs(corr_ab) > 0.9, (corr_ab, u["notes"])
    assert not noted or f"{100 * corr_ab:+.0f} %" in noted[0]
    assert "disjoint parts of one data set" in (tmp_path / "rep" / "summary.md").read_text()
    # the Cramer-Rao bound of all 20,000 events, against the independent quadrature at the same p^
    assert all(i["reference_data"]["events"] == 20000 for i in infos)
    np.testing.assert_allclose(u["cramer_rao"], np.sqrt(np.diag(cov) / 20000), rtol=1e-3)
    assert "the Cramér-Rao bound of the data" in (tmp_path / "rep" / "summary.md").read_text()


def test_the_factor_of_disjoint_parts_is_exact_for_training_noise_too():
    """Monte Carlo of the estimator model of stats.members_factor: members on disjoint parts of one data set, each
    with training noise as large as its statistical error; s/sqrt(M) is the rms error of the mean, while the
    shared-data factor (half-sampling) would overstate it."""
    rng = np.random.default_rng(1)
    m, trials, n = 8, 20000, 4000
    x = rng.normal(size=(trials, n))  # each trial: one data set of n events, truth 0
    parts = x.reshape(trials, m, n // m).mean(axis=2)  # each member's statistical estimate from its own part
    est = parts + rng.normal(scale=parts.std(), size=parts.shape)  # + its training noise, as large
    err = est.mean(axis=1)
    s = est.std(axis=1, ddof=1)
    ratio = math.sqrt(np.mean(err ** 2) / np.mean((s * stats.members_factor(None, m, shared_data=False)) ** 2))
    assert ratio == pytest.approx(1.0, abs=0.03)


def _runs(tmp_path, jobs, data_file=None):
    """Synthetic members, loaded as analyze loads them: jobs = [(seed, [part index per member], parts)], all on
    environment.data_file `data_file` (None: data generated from the seed)."""
    from sagips.analysis.ensemble import expand_run_dirs, load_run
    from tests.test_uncertainty import proxy1d, series, write_run

    truth = np.asarray(proxy1d()[1].true_params)
    for j, (seed, parts, n) in enumerate(jobs):
        for m, i in enumerate(parts):
            path = tmp_path / f"job{j}" / f"member{m:03d}"
            write_run(path, "ensemble", {1: truth[None], 2: truth[None]}, seed=seed, member=m, split=[i, n])
            if data_file:
                info = json.loads((path / "run.json").read_text())
                info["config"]["environment"]["data_file"] = data_file
                (path / "run.json").write_text(json.dumps(info))
    return [load_run(d) for d in expand_run_dirs([tmp_path / f"job{j}" for j in range(len(jobs))])]


def test_only_the_parts_of_one_split_count_as_independent(tmp_path):
    from sagips.analysis.ensemble import _members, disjoint_parts

    # the 4 parts of one job: independent (analyze's factor is then 1/sqrt(M): the real job above)
    assert disjoint_parts(_runs(tmp_path / "a", [(1, [0, 1, 2, 3], 4)]))
    # two jobs with the same seed hold the same two parts twice: one data set, half-sampled, where a rank keeps
    # its 0.5 of a part of 2: a quarter of the set
    runs = _runs(tmp_path / "b", [(1, [0, 1], 2), (1, [0, 1], 2)])
    assert not disjoint_parts(runs)
    assert _members(runs, [np.zeros((1, 6))] * 4)[1] == [pytest.approx(0.25)] * 4
    # two jobs with different seeds on one data file deal their parts apart: parts of the two overlap
    assert not disjoint_parts(_runs(tmp_path / "c", [(1, [0, 1], 2), (2, [0, 1], 2)], "/data/ref.h5"))
    # a job whose members are not all parts of one split (a part missing is fine, a part twice is not)
    assert disjoint_parts(_runs(tmp_path / "d", [(1, [0, 2], 3)]))
    assert not disjoint_parts(_runs(tmp_path / "e", [(1, [1, 1], 2)]))


def test_a_split_with_nothing_to_split_is_one_line(tmp_path):
    from tests._mpirun import run_py

    r = run_py(["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--epochs", "1", "--no-progress",
                "--set", "ensemble.data=split", "--output-dir", str(tmp_path / "x")], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "ensemble.data=split: there is nothing to split" in errors[0], r.stderr[-2000:]


def test_split_ranks_cannot_share_a_node_window(tmp_path):
    r = run_mpi(2, ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--epochs", "1", "--no-progress",
                    "--mode", "ensemble", "--set", "ensemble.data=split", "--set", "data.share=node",
                    "--output-dir", str(tmp_path / "x")], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = {line for line in r.stderr.splitlines() if "error" in line}
    assert len(errors) == 1 and "use data.share=rank" in errors.pop(), r.stderr[-2000:]


def test_a_split_that_keeps_part_of_each_part_says_so(tmp_path):
    r = run_mpi(2, ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--epochs", "1", "--no-progress",
                    "--mode", "ensemble", "--ensemble-size", "2", "--set", "ensemble.data=split",
                    "--set", "environment.reference_events=4000", "--set", "environment.param_samples=4",
                    "--set", "environment.events_per_sample=10", "--set", "train.quality_samples=8",
                    "--output-dir", str(tmp_path / "x")], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    notes = [line for line in r.stderr.splitlines() if "ensemble.data=split keeps" in line]
    assert len(notes) == 1 and "environment.subset_fraction=0.5 of each part" in notes[0]
