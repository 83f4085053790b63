"""The example third-party package examples/toy1d, registered through a real entry point (tests/_plugins.py, no
pip): its reference data follow the analytic density; it trains on 1 rank and resumes bit-identically, trains on 4
ranks in rma-arar-arar, sagips.analyze names its parameters, and a broken variant stops at the first epoch with one
line on every mode's clean-up path."""
import json
import re

import numpy as np
import pytest
import torch

from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.io.metrics import read_metrics
from tests._mpirun import run_mpi, run_py
from tests._plugins import add_to_sys_path, pythonpath, toy_site, write_dist

TINY = ["-m", "sagips.run", "--config", "toy1d:quick", "--no-progress",
        "--set", "environment.reference_events=20000", "--set", "environment.param_samples=8",
        "--set", "environment.events_per_sample=20", "--set", "environment.hidden=16",
        "--set", "environment.layers=2", "--set", "train.quality_samples=64", "--set", "train.log_every=1",
        "--set", "train.state_every=2", "--set", "train.checkpoint_every=2", "--set", "train.lr_final=1"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    paths = toy_site(site)
    write_dist(site, "sagips-toy-variants", {"toy1d_narrow": "tests._toy_variants:Narrow1",
                                             "toy1d_nan": "tests._toy_variants:NaNAtLargeC"})
    return pythonpath(paths), paths


def test_reference_data_follow_the_density(env, tmp_path, monkeypatch):
    from scipy import integrate, stats

    from sagips.data import main as data_main
    from sagips.io.refdata import read_reference

    add_to_sys_path(env[1], monkeypatch)
    out = tmp_path / "toy.h5"
    assert data_main(["toy1d", "--out", str(out), "--events", "50000", "--set", "true_params.a=2.5"]) == 0
    arrays, attrs = read_reference(out, {"events": 1})
    assert list(attrs["true_params"]) == [2.5, -0.4, 0.9] and str(attrs["parameter_names"]) == "a,b,c"
    f = lambda x: 1 - 0.4 * x + 2.5 * x * x * np.exp(-0.9 * x)  # noqa: E731  (the truth, written independently)
    z = integrate.quad(f, 0, 1)[0]
    cdf = np.vectorize(lambda x: integrate.quad(f, 0, min(max(x, 0.0), 1.0))[0] / z)
    assert stats.kstest(arrays["events"][:, 0], cdf).pvalue > 1e-3


def test_sagips_data_refuses_a_density_bad_inside_its_bounds_and_events_given_twice_in_one_line(env, tmp_path,
                                                                                               monkeypatch, capsys):
    """A density NaN inside its bounds (not at the truth) and --events beside --set reference_events were a
    traceback and a silent override (a new user's trial)."""
    from sagips.data import main as data_main

    add_to_sys_path(env[1], monkeypatch)
    assert data_main(["toy1d_nan", "--out", str(tmp_path / "x.h5"), "--events", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"sagips.data: error: density: NaN or infinite values at a=.*c=1\.", err[0]), err
    assert data_main(["toy1d", "--out", str(tmp_path / "y.h5"), "--events", "1000", "--set",
                      "reference_events=5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sagips.data: error: --events 1000 and --set reference_events=5: give the number of events once"]
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()


def test_the_truth_of_a_data_file_made_elsewhere_is_the_runs(env, tmp_path, monkeypatch):
    """docs/analysis.md's closure recipe: data at another truth (sagips.data --set true_params.b=0.3), a run on it:
    run.json's truth and the residuals are the file's, by name; a --set that contradicts the file is one line."""
    from sagips.data import main as data_main

    add_to_sys_path(env[1], monkeypatch)
    data = tmp_path / "b.h5"
    assert data_main(["toy1d", "--out", str(data), "--events", "20000", "--set", "true_params.b=0.3"]) == 0
    out = tmp_path / "run"
    r = run_py(TINY + ["--mode", "ensemble", "--epochs", "1", "--set", f"environment.data_file={data}",
                       "--output-dir", str(out)], env=env[0])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"the truth is data file {data}'s true_params (1.7, 0.3, 0.9)" in r.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["truth"] == [1.7, 0.3, 0.9] and info["truth_known"] is True
    assert info["config"]["environment"]["true_params"] == {"a": 1.7, "b": 0.3, "c": 0.9}
    q = info["final_quality"]
    np.testing.assert_allclose(q["residuals"], [(t - p) / t for t, p in zip([1.7, 0.3, 0.9], q["params"])],
                               rtol=1e-6)
    r = run_py(TINY + ["--epochs", "1", "--set", f"environment.data_file={data}", "--set",
                       "environment.true_params.b=-0.4", "--output-dir", str(tmp_path / "other")], env=env[0])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("sagips: error: environment.true_params.b (--set) differs from the truth that data "
                               f"file {data} was made at (true_params 1.7, 0.3, 0.9)"), lines[0]
    # a --set that agrees with the file is no conflict (the config's other values, the defaults, give way)
    r = run_py(TINY + ["--epochs", "1", "--set", f"environment.data_file={data}", "--set",
                       "environment.true_params.b=0.3", "--set", "environment.true_params.a=1.7", "--output-dir",
                       str(tmp_path / "same")], env=env[0])
    assert r.returncode == 0, r.stderr[-3000:]
    # a file whose truth has too few values (and no names) is one line
    import h5py

    with h5py.File(data, "a") as f:
        f.attrs["true_params"] = [1.7, 0.3]
        del f.attrs["parameter_names"]
    r = run_py(TINY + ["--epochs", "1", "--set", f"environment.data_file={data}", "--output-dir",
                       str(tmp_path / "short")], env=env[0])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "its true_params have 2 values, environment 'toy1d' has 3 parameters (a, b, c)" in lines[0], lines[0]


def test_a_truth_named_by_an_array_and_a_relative_data_path(env, tmp_path, monkeypatch):
    """A user's own file names its parameters as an array of strings (h5py's way of writing a list): the truth is
    taken by name, and names the environment does not have are one line (both were ignored: the truth was read by
    position). A relative data_file is kept absolute in run.json, so --resume works from another directory."""
    import subprocess
    import sys

    import h5py

    from sagips.data import main as data_main
    from tests._mpirun import child_env

    add_to_sys_path(env[1], monkeypatch)
    (tmp_path / "d").mkdir()
    data = tmp_path / "d" / "b.h5"
    assert data_main(["toy1d", "--out", str(data), "--events", "20000", "--set", "true_params.b=0.3"]) == 0
    with h5py.File(data, "a") as f:
        f.attrs["true_params"] = [0.9, 1.7, 0.3]
        f.attrs["parameter_names"] = ["c", "a", "b"]

    def run(args, cwd, tiny=TINY):
        return subprocess.run([sys.executable, *tiny, *args], cwd=cwd, env=child_env(env[0]), capture_output=True,
                              text=True, timeout=120)

    out = tmp_path / "run"
    r = run(["--epochs", "2", "--set", "environment.data_file=d/b.h5", "--output-dir", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["truth"] == [1.7, 0.3, 0.9]
    assert info["config"]["environment"]["data_file"] == str(data)
    (tmp_path / "elsewhere").mkdir()
    # with --config, a resume takes that config's settings: the data file is named by the one line
    r = run(["--resume", "--epochs", "4", "--output-dir", str(out)], tmp_path / "elsewhere")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert (f"the run was trained on data file {data}, and this resume's settings generate the data instead: add "
            f"--set environment.data_file={data}, or resume without --config") in lines[0], lines[0]
    # without it, the run's own settings (the run was started from another directory); a run from before the
    # config kept the path absolute (run.json's own data_file was) resumes alike, with no setting said to differ
    info["config"]["environment"]["data_file"] = "d/b.h5"
    (out / "run.json").write_text(json.dumps(info))
    r = run(["--resume", "--epochs", "4", "--output-dir", str(out)], tmp_path / "elsewhere",
            ["-m", "sagips.run", "--no-progress"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 setting(s) differ from the saved run's, and this run uses the new value(s): train.epochs: 2 -> 4\n" \
        in r.stderr, r.stderr[-3000:]  # (the --epochs given, not the data file's path)
    assert json.loads((out / "run.json").read_text())["epochs"] == 4
    with h5py.File(data, "a") as f:
        f.attrs["parameter_names"] = ["x", "y", "z"]
    r = run(["--epochs", "1", "--set", f"environment.data_file={data}", "--output-dir", str(tmp_path / "bad")],
            tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "its true_params are for parameters x, y, z, environment 'toy1d' has a, b, c" in lines[0], lines[0]


def test_measured_events_outside_the_support_are_refused_in_one_line(env, tmp_path, monkeypatch):
    """Events of a data file that lie outside the density's support (where no synthetic event can be) end the run
    with one line that counts them, on 1 and 2 ranks; an edge event is inside."""
    import h5py

    from sagips.data import main as data_main

    add_to_sys_path(env[1], monkeypatch)
    data = tmp_path / "d.h5"
    assert data_main(["toy1d", "--out", str(data), "--events", "20000"]) == 0
    with h5py.File(data, "a") as f:
        f["events"][:3] = [[0.0], [1.0], [1.0 + 1e-7]]  # on the edges (and float32 rounding beyond one)
    r = run_py(TINY + ["--mode", "ensemble", "--epochs", "1", "--set", f"environment.data_file={data}",
                       "--output-dir", str(tmp_path / "edges")], env=env[0])
    assert r.returncode == 0, r.stderr[-3000:]
    with h5py.File(data, "a") as f:
        f["events"][100:150] = 1.25
        f["events"][150] = -0.5
    for n in (1, 2):
        args = TINY + ["--mode", "ensemble", "--epochs", "1", "--set", f"environment.data_file={data}",
                       "--set", "environment.subset_fraction=1", "--output-dir", str(tmp_path / f"out{n}")]
        r = run_py(args, env=env[0]) if n == 1 else run_mpi(2, args, env=env[0], timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
        assert lines[0] == ("sagips: error: reference data: 51 of the 20000 events this rank keeps lie outside "
                            "toy1d's support [0, 1] "
                            "(e.g. 1.25), where no synthetic event can be: widen the class's `support`, or cut the "
                            "events to it"), lines[0]


def test_one_rank_resumes_bit_identically(env, tmp_path):
    import shutil

    from sagips.io.state import state_path, write_latest

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = run_py(TINY + ["--mode", "ensemble", "--epochs", "4", "--output-dir", str(whole)], env=env[0])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "max |r|" in r.stdout and all(f"\n  {n} " in r.stdout for n in "abc")  # the summary table, by name
    # the same run as if it had been stopped after epoch 2: its state of epoch 4 and its outputs after 2 removed
    shutil.copytree(whole, cut)
    state_path(cut, 0, 4).unlink()
    (cut / "checkpoints" / "rank0000" / "epoch0000004.pt").unlink()
    write_latest(cut, 2, 1)
    r = run_py(["-m", "sagips.run", "--resume", "--no-progress", "--output-dir", str(cut)], env=env[0])
    assert r.returncode == 0, r.stderr[-3000:]
    from sagips.io.state import load_state

    m = torch.as_tensor(load_state(whole, 0, 2)["env_state"]["precondition"])  # training refreshed it (default on)
    assert m.shape == (3, 3) and not torch.allclose(m, torch.eye(3))
    a = load_checkpoint(list_checkpoints(whole)[0][4])["generator"]
    b = load_checkpoint(list_checkpoints(cut)[0][4])["generator"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [m["epoch"] for m in read_metrics(cut / "metrics.jsonl")] == [1, 2, 3, 4]
    assert json.loads((cut / "run.json").read_text())["resumes"][0]["epoch"] == 2


def test_rma_and_analyze(env, tmp_path, monkeypatch):
    out = tmp_path / "rma"
    # started at the box's middle (g_start 0), where toy1d's a and b are -97 % correlated: analyze's note below
    r = run_mpi(2, TINY + ["--epochs", "3", "--set", "comm.inner_size=2", "--set", "environment.g_start=0",
                           "--output-dir", str(out)], env=env[0], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["mode"] == "rma-arar-arar" and info["world_size"] == 2
    assert info["parameter_names"] == ["a", "b", "c"] and info["truth"] == [1.7, -0.4, 0.9]
    assert info["final_quality"]["parameter_names"] == ["a", "b", "c"]
    m = read_metrics(out / "metrics.jsonl")
    assert [x["epoch"] for x in m] == [1, 2, 3] and all(len(x["residuals"]) == 3 for x in m)

    from sagips.analyze import main as analyze_main

    add_to_sys_path(env[1], monkeypatch)
    assert analyze_main([str(out), "--out", str(tmp_path / "report"), "--noise-samples", "32",
                         "--resamples", "5"]) == 0
    md = (tmp_path / "report" / "summary.md").read_text()
    assert all(f"| r̂ ({n}) | {t:g} |" in md for n, t in zip("abc", (1.7, -0.4, 0.9)))
    rows = (tmp_path / "report" / "summary.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["a", "b", "c"]
    assert "a and b are" in md and "were preconditioned" in md  # the default: environment.precondition=fisher
    info["config"]["environment"].pop("precondition")  # a run from before the option: it trained with plain gradients
    (out / "run.json").write_text(json.dumps(info))
    assert analyze_main([str(out), "--out", str(tmp_path / "old"), "--noise-samples", "32", "--resamples", "5"]) == 0
    assert "train with environment.precondition=fisher" in (tmp_path / "old" / "summary.md").read_text()


def test_a_broken_generator_stops_every_rank_with_one_line(env, tmp_path):
    r = run_mpi(2, TINY + ["--set", "environment.name=toy1d_narrow", "--set", "comm.inner_size=2",
                           "--output-dir", str(tmp_path / "bad")], env=env[0], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["sagips: error: build_generator: the generator outputs shape (2, 1) for 2 noise vectors, but "
                      "the environment has 3 parameters (a, b, c): make its last layer 3 wide"]
