"""Bad input at the CLI, end to end: every case of issue #7 gives exit status 2 and ONE line naming what to fix,
before any training (no checkpoints/, no state/, no metrics).

`sagips.run.main(argv)` runs in-process (an MPI world of one rank) and returns the exit status; the library-level
checks behind these cases are in tests/test_config.py and tests/test_refdata.py.
"""
import json

import h5py
import numpy as np
import pytest

from sagips.config import config_to_dict, load
from sagips.run import main
from tests._mpirun import ROOT

TINY = ["--epochs", "1", "--set", "environment.reference_events=2000", "--set", "environment.param_samples=4",
        "--set", "environment.events_per_sample=4", "--no-progress"]


def outputs(out):
    """The run's files and their bytes (not the directory's lock, sagips/io/claim.py: whose job holds it)."""
    return {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".sagips.lock"}


def h5(path, name="events", data=None):
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=np.full((10, 2), 0.5, np.float32) if data is None else data)
    return path


def with_bad(value):
    d = np.full((10, 2), 0.5, np.float32)
    d[3, 1] = value
    return d


def forged_run(out, environment="proxy1d", world_size=1, mode="ensemble", saved_env=None):
    """A run.json as sagips.run writes it (the fields --resume reads), for a run that may not be this one."""
    cfg = config_to_dict(load(None, ["environment.param_samples=4", "environment.events_per_sample=4"]))
    cfg["environment"]["name"] = saved_env or environment
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"sagips_run": 1, "status": "running", "environment": environment,
                                              "world_size": world_size, "mode": mode, "config": cfg}))


# (id, extra argv, setup(tmp_path, out) -> extra argv or None, fragments the one line must contain)
CASES = [
    ("fp16 on a CPU", ["--set", "train.device=cpu", "--set", "train.amp=fp16"], None,
     ["train.amp=fp16 needs CUDA (this rank runs on cpu)", "use train.amp=bf16 or none"]),
    ("CUDA graphs on a CPU", ["--set", "train.device=cpu", "--set", "train.cuda_graph=on"], None,
     ["train.cuda_graph=on needs a CUDA device (this rank runs on cpu)", "auto or off"]),
    ("unknown key", ["--set", "train.lr_gg=1e-4"], None, ["unknown config key 'train.lr_gg'"]),
    ("unknown key in a preset", [], lambda t, o: ["--config", str(_yaml(t, "train:\n  learning_rate: 1\n"))],
     ["train.learning_rate"]),
    ("wrong type (int)", ["--set", "train.log_every=ten"], None, ["train.log_every", "integer"]),
    ("wrong type (number)", ["--set", "train.lr_g=abc"], None, ["train.lr_g", "number"]),
    ("wrong type (list)", ["--set", "environment.true_params=3"], None, ["environment.true_params", "list"]),
    ("h = 0", ["--set", "comm.outer_every=0"], None, ["comm.outer_every", ">= 1"]),
    ("h < 0", ["--set", "comm.outer_every=-1"], None, ["comm.outer_every", ">= 1"]),
    ("epochs = 0", ["--epochs", "0"], None, ["train.epochs", ">= 1"]),
    ("inner size > world", ["--mode", "arar-arar", "--set", "comm.inner_size=2"], None,
     ["comm.inner_size=2", "larger than the ranks"]),
    ("unknown environment", ["--set", "environment.name=nope"], None, ["environment.name", "'nope'", "proxy1d"]),
    ("missing preset", ["--config", "/nonexistent/preset.yaml"], None, ["/nonexistent/preset.yaml", "no such file"]),
    ("preset is a directory", [], lambda t, o: ["--config", str(t)], ["--config", "cannot read"]),
    ("preset is not text", [], lambda t, o: ["--config", str(_binary(t / "preset.yaml"))],
     ["--config", "not valid YAML"]),
    ("preset is a bad YAML date", [], lambda t, o: ["--config", str(_yaml(t, "seed: 2001-13-45\n"))],
     ["--config", "not valid YAML"]),
    ("missing data file", ["--set", "environment.data_file=/nonexistent/ref.h5"], None,
     ["/nonexistent/ref.h5", "no such file"]),
    ("corrupt data file", [], lambda t, o: _data(_corrupt(t / "bad.h5")), ["bad.h5", "not a readable HDF5"]),
    ("data file is a directory", [], lambda t, o: _data(t), ["is a directory, not an HDF5 file"]),
    ("wrong dataset name", [], lambda t, o: _data(h5(t / "bad.h5", name="evts")), ["no dataset 'events'", "evts"]),
    ("wrong shape", [], lambda t, o: _data(h5(t / "bad.h5", data=np.ones((10, 3), np.float32))),
     ["'events'", "(10, 3)", "expected (N>0, 2)"]),
    ("empty dataset", [], lambda t, o: _data(h5(t / "bad.h5", data=np.ones((0, 2), np.float32))), ["(0, 2)"]),
    # a rank checks the rows it reads (issue 23: its own subset only): subset_fraction=1 reads row 3
    ("NaN in the data", ["--set", "environment.subset_fraction=1"],
     lambda t, o: _data(h5(t / "bad.h5", data=with_bad(np.nan))), ["NaN/Inf", "row 3"]),
    ("Inf in the data", ["--set", "environment.subset_fraction=1"],
     lambda t, o: _data(h5(t / "bad.h5", data=with_bad(-np.inf))), ["NaN/Inf", "row 3"]),
    ("resume: a run of another environment", ["--resume", "--config", "configs/proxy1d-quick.yaml"],
     lambda t, o: forged_run(o, environment="optigan"), ["environment 'optigan'", "not 'proxy1d'"]),
    ("resume: saved config of an environment not installed", ["--resume"],
     lambda t, o: forged_run(o, environment="nosuchenv"), ["environment.name", "'nosuchenv'"]),
    ("resume: another number of ranks", ["--resume"], lambda t, o: forged_run(o, world_size=4),
     ["had 4 ranks", "mpiexec -n 4"]),
    ("resume: another mode", ["--resume", "--mode", "allreduce"], lambda t, o: forged_run(o),
     ["mode 'ensemble'", "--mode ensemble"]),
    ("resume: no state saved", ["--resume"], lambda t, o: forged_run(o), ["no complete training state"]),
    ("resume: no run", ["--resume"], None, ["holds no run"]),
    ("resume: unreadable run.json", ["--resume"], lambda t, o: _torn_run_json(o),
     ["cannot read the config", "run.json"]),
    ("resume and overwrite", ["--resume", "--overwrite"], lambda t, o: forged_run(o), ["exclude each other"]),
    ("output dir holds another run", [], lambda t, o: forged_run(o),
     ["already holds a run", "it saved no training state to resume", "--overwrite"]),
    ("output dir is a file", [], lambda t, o: o.write_text("not a directory") and None,
     ["--output-dir", "is a file, not a directory"]),
    # a data file's truth is the run's (python -m sagips.data writes it): one that cannot be is one line
    ("data's truth: 5 values", [], lambda t, o: _data(_truth(t, [2.0, -0.5, 3.0, 1.0, -0.5])),
     ["true_params have 5 values", "6 parameters: is it a file of another environment? set environment.name"]),
    ("data's truth: another environment's names", [],
     lambda t, o: _data(_truth(t, [2.0, -0.5, 3.0, 1.0, -0.5, 4.0], ["mu", "sigma", "a", "b", "c", "d"])),
     ["true_params have 6 values (for mu, sigma, a, b, c, d), environment 'proxy1d' has 6 parameters (r_0, r_1",
      "set environment.name"]),
    ("data's truth: NaN", [], lambda t, o: _data(_truth(t, [2.0, -0.5, 3.0, np.nan, -0.5, 4.0])),
     ["attribute true_params", "not a list of finite numbers"]),
    ("data's truth: words", [], lambda t, o: _data(_truth(t, "p0=2")),
     ["attribute true_params", "not a list of finite numbers"]),
    ("data's truth: zero", [], lambda t, o: _data(_truth(t, [2.0, -0.5, 3.0, 0.0, -0.5, 4.0])),
     ["its true_params (2, -0.5, 3, 0, -0.5, 4) do not fit", "non-zero"]),
    ("data's truth against a --set", ["--set", "environment.true_params=[2.1875, -0.5, 3.0, 1.09375, -0.5, 4.0]"],
     lambda t, o: _data(_truth(t, [2.0, -0.5, 3.0, 1.09375, -0.5, 4.0])),
     ["environment.true_params (--set) differs from the truth that data file", "true_params 2, -0.5"]),
    ("ensemble size does not divide", ["--ensemble-size", "2"], None,
     ["ensemble.members=2 (--ensemble-size) does not divide", "launch a multiple of 2 ranks"]),
    ("delayed rank does not exist", ["--set", "pipeline.delay_ranks=[3]"], None, ["pipeline.delay_ranks", "rank 3"]),
    ("non-closure names no parameter", ["--set", "analysis.nonclosure={r_2: 0.5, p9: 1}"], None,
     ["analysis.nonclosure names 'p9'", "r_0, r_1"]),
    ("negative non-closure", ["--set", "analysis.nonclosure={r_2: -1}"], None, ["analysis.nonclosure", ">= 0"]),
]


def _yaml(tmp_path, text):
    p = tmp_path / "preset.yaml"
    p.write_text(text)
    return p


def _torn_run_json(out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text('{"sagips_run": 1, "config": {"mode": "ens')


def _binary(path):
    path.write_bytes(b"train:\n  epochs: \xff\xfe\x00\x81\n")
    return path


def _corrupt(path):
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"garbage" * 50)
    return path


def _truth(tmp_path, truth, names=None):
    """A data file that names its truth (attribute true_params, as python -m sagips.data writes it)."""
    path = h5(tmp_path / "ref.h5", data=np.random.default_rng(0).uniform(0.1, 0.9, (50, 2)).astype(np.float32))
    with h5py.File(path, "a") as f:
        f.attrs["true_params"] = truth
        if names is not None:
            f.attrs["parameter_names"] = names
    return path


def _data(path):
    return ["--set", f"environment.data_file={path}"]


@pytest.mark.parametrize("case, argv, setup, fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(case, argv, setup, fragments, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # presets are given relative to the repository, as in the docs
    out = tmp_path / "out"
    had_run = False
    extra = []
    if setup is not None:
        extra = setup(tmp_path, out) or []
        had_run = (out / "run.json").exists()
    status = main(TINY + argv + extra + ["--output-dir", str(out)])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert status == 2, f"{case}: exit {status}; stderr: {cap.err[-2000:]}"
    assert len(lines) == 1, f"{case}: expected one line, got {cap.err!r}"
    assert lines[0].startswith("sagips: error: "), lines[0]
    for frag in fragments:
        assert frag in lines[0], f"{case}: {frag!r} not in {lines[0]!r}"
    assert cap.out == ""
    # nothing was trained, nothing was written
    for name in ("checkpoints", "state", "metrics.jsonl"):
        assert not (out / name).exists(), f"{case}: {name} was created"
    assert (out / "run.json").exists() == had_run


def test_only_a_run_with_its_state_is_offered_a_resume(tmp_path):
    from sagips.config import ConfigError
    from sagips.run import check_output_dir

    forged_run(tmp_path)
    with pytest.raises(ConfigError, match="it saved no training state to resume, so --overwrite to replace it"):
        check_output_dir(str(tmp_path), False, False)
    (tmp_path / "state").mkdir()
    with pytest.raises(ConfigError, match="pass --resume to continue it, --overwrite to replace it"):
        check_output_dir(str(tmp_path), False, False)


def test_a_data_files_truth_is_the_runs(tmp_path, capsys):
    """Data made at another truth (python -m sagips.data --true-params ...): run.json's truth, its residuals and
    analyze's pulls are against the file's truth, not the config's default (they make generated data)."""
    truth = [2.0, -0.5, 3.0, 1.09375, -0.5, 4.0]
    data = _truth(tmp_path, np.array(truth))
    out = tmp_path / "out"
    assert main(TINY + _data(data) + ["--output-dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"sagips: the truth is data file {data}'s true_params (2, -0.5, 3, 1.09375, -0.5, 4)" in err
    info = json.loads((out / "run.json").read_text())
    assert info["truth"] == truth and info["truth_known"] is True
    assert info["config"]["environment"]["true_params"] == truth
    q = info["final_quality"]
    np.testing.assert_allclose(q["residuals"], [(t - p) / t for t, p in zip(truth, q["params"])], rtol=1e-6)
    # the same truth named twice is no conflict, and says nothing
    again = tmp_path / "again"
    assert main(TINY + _data(data) + ["--set", f"environment.true_params={truth}", "--output-dir", str(again)]) == 0
    assert "the truth is data file" not in capsys.readouterr().err


def test_resume_beyond_its_epochs_is_refused_and_a_complete_run_has_nothing_to_do(tmp_path, capsys):
    """--resume of a run at epoch 2: --epochs 1 is one line, no --epochs has nothing to do (one line, exit 0), and
    --epochs 3 trains on in the precision its start resolved."""
    out = tmp_path / "out"
    assert main(TINY + ["--epochs", "2", "--set", "train.state_every=1", "--set", "train.amp=auto", "--output-dir",
                        str(out)]) == 0
    capsys.readouterr()
    metrics = (out / "metrics.jsonl").read_text()
    started = json.loads((out / "run.json").read_text())
    assert main(["--resume", "--epochs", "1", "--no-progress", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is at epoch 2 already, beyond train.epochs=1" in err[0] and "--epochs 2" in err[0], err
    (out / "analysis").mkdir(exist_ok=True)
    (out / "analysis" / "summary.md").write_text("p^ +- sigma")  # (the run's analysis: a job script that always
    assert main(["--resume", "--no-progress", "--output-dir", str(out)]) == 0  # resumes must not remove it)
    assert (out / "analysis" / "summary.md").read_text() == "p^ +- sigma"
    cap = capsys.readouterr()
    assert cap.err.strip() == f"sagips: {out} is complete at train.epochs=2: nothing to resume (give a larger " \
                              f"--epochs to train on)" and cap.out == ""
    assert (out / "metrics.jsonl").read_text() == metrics and json.loads((out / "run.json").read_text())[
        "status"] == "complete"
    # trained on: the precision its start resolved (train.amp=auto) is kept, and so is that start's record
    assert main(["--resume", "--epochs", "3", "--no-progress", "--output-dir", str(out)]) == 0
    resumed = json.loads((out / "run.json").read_text())
    assert resumed["status"] == "complete" and resumed["resumes"][0]["epoch"] == 2
    assert resumed["config"]["train"]["amp"] == "auto" and resumed["precision"] == started["precision"]


@pytest.mark.parametrize("change", ["environment.reference_events=3000",
                                    "environment.true_params=[2.2,-0.5,3,1.1,-0.5,4]"])
def test_a_resume_on_other_generated_data_names_the_settings_that_make_them(tmp_path, capsys, change):
    """Generated data made with another truth or size: the refusal was 'data file generated data is not the data this
    run was trained on ...; resume with the original file' (no file involved; a new user's trial)."""
    out = tmp_path / "out"
    assert main(TINY + ["--epochs", "2", "--set", "train.state_every=1", "--output-dir", str(out)]) == 0
    capsys.readouterr()
    assert main(TINY + ["--resume", "--epochs", "3", "--set", change, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sagips: error: --resume: the generated reference data are not the "
                                               "ones this run was trained on (layout "), err
    assert err[0].endswith("a setting that makes them changed (environment.true_params, environment.reference_events, "
                           "--seed, or the environment's code); resume with the run's values")


def test_a_refused_resume_leaves_the_run_untouched(tmp_path, capsys):
    """--resume with networks of another size: the saved state is refused in one line (exit 2), before the job's
    analysis or any state is removed."""
    out = tmp_path / "out"
    assert main(TINY + ["--epochs", "2", "--set", "train.state_every=1", "--output-dir", str(out)]) == 0
    (out / "analysis").mkdir()
    (out / "analysis" / "summary.md").write_text("p^ +- sigma")
    before = outputs(out)
    capsys.readouterr()
    assert main(TINY + ["--resume", "--epochs", "3", "--set", "environment.hidden=16", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit this config's networks" in err[0], err
    assert outputs(out) == before


@pytest.mark.parametrize("bad", [["--set", "environment.data_file=missing.h5"],
                                 ["--set", "analysis.nonclosure={r_9: 1}"]], ids=["data file", "parameter name"])
def test_overwrite_with_bad_input_leaves_the_run_untouched(tmp_path, capsys, bad):
    """--overwrite removes the old outputs only once every input is checked: bad input found while the data are
    loaded or the run is built is one line, exit 2, and the old run is still there."""
    out = tmp_path / "out"
    assert main(TINY + ["--epochs", "2", "--output-dir", str(out)]) == 0
    (out / "analysis").mkdir()
    (out / "analysis" / "summary.md").write_text("p^ +- sigma")
    before = outputs(out)
    capsys.readouterr()
    assert main(TINY + bad + ["--overwrite", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sagips: error: "), err
    assert outputs(out) == before
    assert main(TINY + ["--overwrite", "--output-dir", str(out)]) == 0  # (and a good one replaces it)
    assert not (out / "analysis").exists() and json.loads((out / "run.json").read_text())["epochs"] == 1


def test_unknown_mode_is_refused_by_argparse(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--mode", "horovod", "--output-dir", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    # argparse prints its usage, then ONE error line that names the flag, the value and the choices
    assert "argument --mode: invalid choice: 'horovod'" in err[-1] and "rma-arar-arar" in err[-1]
    assert err[0].startswith("usage:")
    assert not (tmp_path / "out").exists()
