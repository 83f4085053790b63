"""environment.events_per_sample=auto (issue 36, item 3): a ParametricEnvironment sizes its synthetic batch from the
data a rank keeps and the generator's weight-average window, so that a weak parameter's training noise falls under
its statistical error; the run prints and records the value, and computes it alike from a data file."""
from __future__ import annotations

import json
import re
import math

import h5py
import numpy as np
import pytest

from sagips.config import ConfigError, from_dict
from sagips.parametric import AUTO_EVENTS_RANGE, AUTO_EVENTS_RATIO, auto_events_per_sample
from tests._mpirun import run_mpi, run_py
from tests._plugins import add_to_sys_path, pythonpath, smear_site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return smear_site(tmp_path_factory.mktemp("site"))


@pytest.fixture()
def smear(site, monkeypatch):
    add_to_sys_path(site, monkeypatch)
    from sagips.environment import get_environment

    return get_environment("smear1d")


def test_the_rule_by_hand():
    assert AUTO_EVENTS_RATIO == 10 and AUTO_EVENTS_RANGE == (100, 4096)
    # 1M events, each of 4 ranks keeping half; 64 parameter sets; train.ema 0.995 (a 200-epoch window)
    assert auto_events_per_sample(500_000, 64, 0.995) == 391  # ceil(10 * 500000 / (64 * 200)) = ceil(390.6)
    assert auto_events_per_sample(5_000_000, 64, 0.995) == 3907
    assert auto_events_per_sample(50_000_000, 64, 0.995) == 4096  # bounded
    assert auto_events_per_sample(20_000, 64, 0.995) == 100  # never under the old default
    assert auto_events_per_sample(500_000, 64, 0.0) == 100  # no weight average: no window to size against


def test_auto_is_the_default_and_bad_values_are_one_line(smear):
    cfg = from_dict(smear.Config, {}, "environment.")
    assert cfg.events_per_sample == "auto"
    assert from_dict(smear.Config, {"events_per_sample": 50}, "environment.").events_per_sample == 50
    for bad, msg in ((0, "must be >= 1"), ("many", "expected an integer or 'auto'"), (2.5, "expected")):
        with pytest.raises(ConfigError) as e:
            from_dict(smear.Config, {"events_per_sample": bad}, "environment.")
        assert str(e.value).startswith("environment.events_per_sample: ") and msg in str(e.value)
        assert "\n" not in str(e.value)


def test_size_batch_resizes_the_synthetic_and_the_real_batch(smear):
    cfg = from_dict(smear.Config, {"param_samples": 8, "reference_events": 20_000}, "environment.")
    cfg.name = "smear1d"
    env = smear(cfg, "cpu", 0)
    assert env.events_per_sample == 100  # provisional, from the config: 10 * 10000 / (8 * 200) = 62.5 -> 100
    rec = env.size_batch(40_000, 0.99)  # a 100-epoch window: ceil(10 * 40000 / 800) = 500
    assert rec == {"events_per_sample": 500, "events_kept": 40_000, "param_samples": 8, "window_epochs": 100.0,
                   "ratio": 10.0}
    assert env.events_per_epoch == 4000
    env.attach_data({"events": np.zeros((1000, 1), np.float32)}, {}, np.random.default_rng(0))
    G = env.build_generator()
    assert env.synthesize(G).shape == (4000, 1) and env.real_batch().shape == (4000, 1)
    fixed = from_dict(smear.Config, {"events_per_sample": 7}, "environment.")
    fixed.name = "smear1d"
    env = smear(fixed, "cpu", 0)
    assert env.size_batch(40_000, 0.99) is None and env.events_per_epoch == 64 * 7


def _run(site, out, *sets, ranks=1, mode="ensemble", flags=()):
    args = ["-m", "sagips.run", "--config", "smear1d:quick", "--mode", mode, *flags, "--no-progress", "--epochs", "2",
            "--output-dir", str(out), "--set", "environment.param_samples=8", "--set", "environment.hidden=8",
            "--set", "environment.layers=1", "--set", "train.quality_samples=8"]
    for s in sets:
        args += ["--set", s]
    if ranks == 1:
        r = run_py(args, env=pythonpath(site), timeout=180)
    else:
        r = run_mpi(ranks, args, env=pythonpath(site), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads((out / ("member001" if "--ensemble-size" in flags else "") / "run.json").read_text())


def test_a_run_sizes_it_from_the_data_it_keeps(site, tmp_path):
    # generated data: 20,000 events, half kept, a 10-epoch weight average: ceil(10 * 10000 / (8 * 10)) = 1250
    r, info = _run(site, tmp_path / "gen", "environment.reference_events=20000", "train.ema=0.9")
    assert info["config"]["environment"]["events_per_sample"] == "auto"  # what the user asked for
    assert info["batch_sized"]["events_per_sample"] == 1250 == math.ceil(10 * 10_000 / (8 * 10))
    assert info["events_per_epoch"] == 8 * 1250
    assert "events_per_sample auto: 1250 (the synthetic events of a 10-epoch weight average: 10.0 x the 10,000 " \
           "events a rank keeps)" in r.stderr + r.stdout
    # a data file of 40,000 events (not reference_events), a quarter kept, a 20-epoch window: 625
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["events"] = np.random.default_rng(0).exponential(1.0, (40_000, 1)).astype(np.float32)
    r_file, info_file = _run(site, tmp_path / "file", f"environment.data_file={path}",
                             "environment.subset_fraction=0.25", "train.ema=0.95")
    assert info_file["batch_sized"]["events_kept"] == 10_000 and info_file["batch_sized"]["events_per_sample"] == 625
    assert info_file["events_per_epoch"] == 8 * 625
    # measured data (a file without true_params) name no truth: run.json and the end of the run say so
    from sagips.io.refdata import NO_TRUTH, truth_known

    assert info["truth_known"] is True and info_file["truth_known"] is False
    assert NO_TRUTH in r_file.stdout and NO_TRUTH not in r.stdout
    # its table: the predicted values only, no truth (a placeholder) and no residuals against it
    assert "residual" not in r_file.stdout.split("generators")[1].split("sagips: note")[0]
    assert re.search(r"parameter +predicted\n", r_file.stdout) and "residual (p-p^)/p" in r.stdout
    with h5py.File(path, "a") as f:  # a file that names its truth, as python -m sagips.data writes one
        f.attrs["true_params"] = [1.0, 0.2]
    assert truth_known(path) and truth_known(None)


def test_split_data_and_a_split_batch_are_sized_as_one_rank_would_be(site, tmp_path):
    """ensemble.data=split: each member keeps its part of the data (20,000 / 2 parts, all of it: 10,000 kept, not
    20,000); train.split_batch: the rule counts the config's 8 parameter sets, not the 4 of each of the 2 ranks, so
    that the ranks' synthetic events together are what one rank's would be."""
    _, info = _run(site, tmp_path / "split", "environment.reference_events=20000", "environment.subset_fraction=1.0",
                   "ensemble.data=split", "train.ema=0.9", ranks=2, flags=("--ensemble-size", "2"))
    assert info["batch_sized"]["events_kept"] == 10_000 and info["batch_sized"]["events_per_sample"] == 1250
    _, info = _run(site, tmp_path / "sb", "environment.reference_events=20000", "train.ema=0.9",
                   "train.split_batch=true", ranks=2, mode="allreduce")
    assert info["batch"]["per_rank"] == 4 and info["batch_sized"]["param_samples"] == 8
    assert info["batch_sized"]["events_per_sample"] == 1250 and info["events_per_epoch"] == 4 * 1250


def test_resume_with_networks_of_another_size_is_one_line(site, tmp_path):
    """A run resumed with --config whose networks differ from the saved ones (e.g. a run from before the defaults
    became 64 x 3) is refused in one line that says what to do, not with torch's list of tensors."""
    out = tmp_path / "run"  # a number given is kept as it is
    _, info = _run(site, out, "environment.reference_events=20000", "environment.events_per_sample=30",
                   "train.state_every=1")
    assert info["batch_sized"] is None and info["events_per_epoch"] == 8 * 30
    args = ["-m", "sagips.run", "--config", "smear1d:quick", "--mode", "ensemble", "--resume", "--no-progress",
            "--epochs", "4", "--output-dir", str(out), "--set", "environment.param_samples=8", "--set",
            "environment.hidden=16", "--set", "environment.layers=1", "--set", "environment.reference_events=20000"]
    r = run_py(args, env=pythonpath(site), timeout=180)
    assert r.returncode == 2, r.stderr[-2000:]
    (err,) = [ln for ln in r.stderr.splitlines() if ln.strip()]  # one line, not torch's list of tensors
    assert "--resume: the saved generator does not fit this config's networks (size mismatch" in err
    assert "resume without --config" in err
    # a resume that succeeds names what differs from the saved run (here the batch 30 -> auto, and the epochs)
    args[args.index("environment.hidden=16")] = "environment.hidden=8"
    r = run_py(args, env=pythonpath(site), timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    (note,) = [ln for ln in r.stderr.splitlines() if "setting(s) differ from the saved run's" in ln]
    assert "environment.events_per_sample: 30 -> 'auto'" in note and "train.epochs: 2 -> 4" in note
    assert "output_dir" not in note and "environment.hidden" not in note
