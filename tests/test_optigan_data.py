"""optiGAN reference files: the data CLI writes the training and held-out HDF5 files; GATE ROOT files are read."""
import json

import numpy as np
import pytest

from sagips.io.refdata import read_reference
from sagips_environments.optigan import data as optigan_data
from sagips_environments.optigan.mc import Crystal

DATASETS = {"photons": 6, "conditions": 3}
TINY = ["--photons-per-point", "200", "--grid-side", "2", "--depths", "2", "--heldout-points", "3",
        "--heldout-photons", "100", "--seed", "5"]


def test_data_cli_writes_training_and_heldout_files(tmp_path, capsys):
    out = tmp_path / "optigan.h5"
    assert optigan_data.main(["--out", str(out)] + TINY) == 0
    arrays, attrs = read_reference(out, DATASETS)
    assert arrays["photons"].shape == (6 * 200, 6) and arrays["conditions"].shape == (6 * 200, 3)
    pts = np.unique(arrays["conditions"], axis=0)
    assert len(pts) == 6 and np.allclose(sorted(set(pts[:, 2])), [1.0, 2.0])
    assert attrs["columns"] == "X,Y,dX,dY,dZ,EKine" and int(attrs["photons_per_point"]) == 200
    assert json.loads(str(attrs["crystal"]))["n_crystal"] == 2.15
    assert (arrays["photons"][:, 4] >= Crystal().cos_critical - 1e-6).all()
    held_path = tmp_path / "optigan_heldout.h5"
    assert optigan_data.heldout_path(str(out)) == str(held_path)
    held, h_attrs = read_reference(held_path, DATASETS)
    assert held["photons"].shape == (300, 6) and int(h_attrs["heldout"]) == 1
    hp = np.unique(held["conditions"], axis=0)
    assert len(hp) == 3 and not any((np.abs(pts - p).max(1) < 1e-6).any() for p in hp)  # off the grid
    assert "optigan_heldout.h5" in capsys.readouterr().out


def test_a_run_on_its_files_ends_with_its_own_table(tmp_path, monkeypatch, capsys):
    """optiGAN's files name no truth (it predicts no parameters): the end of the run is its own table, not the
    predicted-parameter table of measured data (a review: KeyError 'params' after the training had finished), and
    run.json keeps the files' paths absolute (a resume may start in another directory)."""
    from sagips.run import main
    from tests.test_optigan_train import TINY as TRAIN

    out = tmp_path / "optigan.h5"
    assert optigan_data.main(["--out", str(out)] + TINY) == 0
    monkeypatch.chdir(tmp_path)
    sets = [a for s in TRAIN + ["environment.data_file=optigan.h5", "environment.heldout_file=optigan_heldout.h5"]
            for a in ("--set", s)]
    assert main(sets + ["--epochs", "2", "--output-dir", str(tmp_path / "run")]) == 0
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "complete" and "js" in capsys.readouterr().out.lower()
    env = info["config"]["environment"]
    assert env["data_file"] == str(out) and env["heldout_file"] == str(tmp_path / "optigan_heldout.h5")


def test_data_cli_rejects_bad_values(tmp_path, capsys):
    assert optigan_data.main(["--out", str(tmp_path / "x.h5"), "--reflectivity", "1.5"]) == 2
    assert "--reflectivity" in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


def test_add_cli_hooks_into_a_parent_parser(tmp_path):
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="env", required=True)
    optigan_data.add_cli(sub)
    args = p.parse_args(["optigan", "--out", str(tmp_path / "a.h5")] + TINY + ["--heldout-points", "0"])
    assert args.run(args) == 0
    assert (tmp_path / "a.h5").exists() and not (tmp_path / "a_heldout.h5").exists()


# ------------------------------------------------------------------------------------------------ GATE ROOT files
def _write_phase_space(path, n, with_vertex):
    uproot = pytest.importorskip("uproot", reason="uproot is not installed (pip install -e .[root])")
    rng = np.random.default_rng(0)
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    branches = {"Position_X": rng.uniform(-1.5, 1.5, n) + 10.0, "Position_Y": rng.uniform(-1.5, 1.5, n),
                "Position_Z": np.full(n, 3.0), "Direction_X": d[:, 0], "Direction_Y": d[:, 1], "Direction_Z": d[:, 2],
                "KineticEnergy": rng.uniform(2e-6, 3e-6, n), "EventID": np.arange(n, dtype=np.int32)}
    if with_vertex:
        branches.update({"TrackVertexPosition_X": np.full(n, 10.5), "TrackVertexPosition_Y": np.full(n, 0.25),
                         "TrackVertexPosition_Z": np.full(n, 1.0)})
    with uproot.recreate(path) as f:
        f["Phase"] = branches
    return branches


def test_gate_reader_maps_the_columns(tmp_path):
    from sagips_environments.optigan.gate import read_phase_space

    path = str(tmp_path / "phsp.root")
    b = _write_phase_space(path, 400, with_vertex=True)
    keep = b["Direction_Z"] > 0
    # condition from the TrackVertexPosition branches, in the crystal frame (origin subtracted)
    photons, conds = read_phase_space(path, origin=(10.0, 0.0, 0.0))
    assert photons.shape == (keep.sum(), 6) and conds.shape == (keep.sum(), 3)
    np.testing.assert_allclose(photons[:, 0], b["Position_X"][keep] - 10.0, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(photons[:, 4], b["Direction_Z"][keep], rtol=1e-6)
    np.testing.assert_allclose(photons[:, 5], b["KineticEnergy"][keep] * 1e6, rtol=1e-6)  # MeV -> eV
    np.testing.assert_allclose(conds, np.tile([0.5, 0.25, 1.0], (keep.sum(), 1)), atol=1e-6)
    # a condition given per file wins
    _, conds2 = read_phase_space(path, condition=(0.1, 0.0, 2.0))
    assert np.allclose(conds2, [0.1, 0.0, 2.0])


def test_gate_reader_needs_a_condition(tmp_path):
    from sagips_environments.optigan.gate import parse_spec, read_phase_space

    path = str(tmp_path / "novertex.root")
    _write_phase_space(path, 50, with_vertex=False)
    with pytest.raises(ValueError, match="TrackVertexPosition"):
        read_phase_space(path)
    assert parse_spec(f"{path}:0.25,0,0.5") == (path, (0.25, 0.0, 0.5))
    out = tmp_path / "gate.h5"
    assert optigan_data.main(["--out", str(out), "--gate", f"{path}:0.25,0,0.5"]) == 0
    arrays, attrs = read_reference(out, DATASETS)
    assert np.allclose(arrays["conditions"], [0.25, 0.0, 0.5]) and "GATE" in str(attrs["source"])
