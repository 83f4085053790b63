"""Issue 24: the opengate file of a run trained with folds stays inside the crystal's bounds, or is refused."""
import json

import numpy as np
import pytest
import torch

from sagips.config import config_to_dict, load
from sagips_environments.optigan.export import ExportRefused, export_opengate
from sagips_environments.optigan.exported import (
    environment_for_config,
    load_plain,
    outside_fraction,
    sample_like_opengate,
)

SMALL = ["seed=5", "environment.photons_per_point=300", "environment.grid_side=3", "environment.grid_depths=2",
         "environment.heldout_points=3", "environment.heldout_photons=1000"]


@pytest.fixture(scope="module")
def folded_run(tmp_path_factory):
    """A run directory (run.json + one checkpoint) whose generator leans on its folds: its last layer is scaled up
    so that the network alone puts many photons outside the bounds, as a fold-trained network does."""
    ck, env, _ = _stretched_run(tmp_path_factory.mktemp("run"), "environment.fold_layer=false", seed=0)
    return ck, env


def _stretched_run(run, fold_layer: str, seed: int):
    """(checkpoint, env, G): a run directory whose generator's output layer is scaled 60x, so that its raw outputs
    fall far outside the bounds."""
    config = config_to_dict(load("configs/optigan-quick.yaml", [*SMALL, fold_layer]))
    env, _ = environment_for_config(config)
    torch.manual_seed(seed)
    G = env.build_generator()
    with torch.no_grad():
        G.model[-1].weight.mul_(60.0)
    (run / "run.json").write_text(json.dumps({"config": config}))
    ck = run / "checkpoints" / "rank0000" / "epoch0000001.pt"
    ck.parent.mkdir(parents=True)
    torch.save({"generator": G.state_dict(), "epoch": 1, "environment": "optigan"}, ck)
    return ck, env, G


def _outside(path, env):
    qs = env.heldout_set(0)
    gen = sample_like_opengate(load_plain(path), qs["points"], 2000, seed=3)
    return outside_fraction(gen, *env.bounds())["any"]


def test_the_plain_network_is_refused_with_the_measured_loss(folded_run, tmp_path):
    ck, env = folded_run
    out = tmp_path / "model.pt"
    with pytest.raises(ExportRefused, match=r"scores JS .*\(loss [0-9.]+ points > 0.5.*not written"):
        export_opengate(ck, out, distill_steps=0)
    assert not out.exists()


def test_the_distilled_file_stays_inside_the_bounds(folded_run, tmp_path):
    ck, env = folded_run
    raw = tmp_path / "raw.pt"
    export_opengate(ck, raw, distill_steps=0, check=False)
    out = tmp_path / "model.pt"
    info = export_opengate(ck, out, distill_steps=300, distill_batch=512, force=True)
    before, after = _outside(raw, env), _outside(out, env)
    assert before > 0.5  # the network alone relies on its folds (78% outside)
    assert after < 0.15, f"{100 * after:.1f}% of the distilled file's photons are outside the bounds"
    q = info["quality"]
    assert q["export"]["js"] > q["alone"]["js"]
    assert np.isfinite(q["loss"])


@pytest.fixture(scope="module")
def fold_layer_run(tmp_path_factory):
    """A run directory of a `fold_layer` generator (with energy_bounds) whose raw outputs lie up to several widths
    outside the bounds, so that every hinge of the written fold is used."""
    ck, env, G = _stretched_run(tmp_path_factory.mktemp("fold_layer_run"), "environment.fold_layer=true", seed=1)
    assert G.fold_layer and len(G.model) == 5 and G.bounded
    return ck, env, G


def test_a_fold_layer_generator_is_written_exactly_with_its_folds(fold_layer_run, tmp_path):
    """The file that opengate loads computes the run's folded generator (reflect_into, an independent formula) to
    float rounding, with every photon inside the bounds, and the export's own check sees no loss."""
    from sagips_environments.optigan.env import unfolded
    from sagips_environments.optigan.nets import reflect_into

    ck, env, G = fold_layer_run
    out = tmp_path / "model.pt"
    info = export_opengate(ck, out)  # the default: no distillation for it, and the JS check must pass
    assert info["distill"] is None and abs(info["quality"]["loss"]) < 0.05
    plain = load_plain(out)
    assert [tuple(p.shape) for p in plain.parameters()] == [(128, 13), (128,), (256, 128), (256,), (512, 256),
                                                             (512,), (6, 512), (6,)]  # opengate's layout
    qs = env.heldout_set(0)
    x = torch.cat([torch.randn(3 * 4000, 10, generator=torch.Generator().manual_seed(2)),
                   torch.as_tensor(np.repeat(qs["points"], 4000, axis=0), dtype=torch.float32)], dim=1)
    lo, hi = env.bounds()
    lo_t, hi_t = torch.as_tensor(lo, dtype=torch.float32), torch.as_tensor(hi, dtype=torch.float32)
    with torch.no_grad(), unfolded(G):
        raw = G(x)
    with torch.no_grad():
        want = reflect_into(raw, lo_t, hi_t)
        got = plain(x)
    width = (hi_t - lo_t)[torch.isfinite(hi_t - lo_t)]
    far = ((raw - hi_t) / (hi_t - lo_t)).nan_to_num(0).max(0).values
    assert float(far[:5].min()) > 2  # raw outputs reach at least 2 widths past the bounds in every folded column
    err = float((got - want).abs().max())
    print(f"max |file - folded| = {err:.3g}, widths {width.tolist()}, raw reach {far.tolist()}")
    assert err < 1e-4 * float(width.max())
    assert _outside(out, env) == 0.0
    assert int(torch.load(out, weights_only=True)["epoch"]) == 1
    q = env.quality(G)  # one figure: the run's own is the file's, and it says so
    assert q["export_exact"] and "js_unfolded" not in q and "holds the folds exactly" in env.summary_table(q)


def test_a_state_is_checked_with_the_generator_it_exports(fold_layer_run, tmp_path):
    """A training state (state/rankR/epochE.pt) exports its weight average, and the check scores that same generator,
    not the raw one beside it; here a DDP state as older versions wrote it (every key `module.`-prefixed)."""
    ck, env, G = fold_layer_run
    (tmp_path / "run.json").write_text((ck.parents[2] / "run.json").read_text())
    ema = G.state_dict()
    raw = {k: v + 0.3 if v.is_floating_point() and k.startswith("model.") else v for k, v in ema.items()}
    state = tmp_path / "state" / "rank0000" / "epoch0000001.pt"
    state.parent.mkdir(parents=True)
    torch.save({"generator": {f"module.{k}": v for k, v in raw.items()}, "epoch": 1, "environment": "optigan",
                "generator_ema": {f"module.{k}": v for k, v in ema.items()}}, state)
    info = export_opengate(state, tmp_path / "model.pt")  # (the raw generator's score would refuse the file)
    assert info["distill"] is None and abs(info["quality"]["loss"]) < 0.05
    export_opengate(ck, tmp_path / "ck.pt")  # the same generator from its checkpoint
    x = torch.cat([torch.randn(256, 10), torch.rand(256, 3)], 1)
    with torch.no_grad():
        torch.testing.assert_close(load_plain(tmp_path / "model.pt")(x), load_plain(tmp_path / "ck.pt")(x))


def test_fold_layer_refuses_what_it_cannot_write():
    from sagips.config import ConfigError

    with pytest.raises(ConfigError, match="fold_layer cannot write unit_direction"):
        load("configs/optigan-quick.yaml", [*SMALL, "environment.fold_layer=true", "environment.unit_direction=true"])
    with pytest.raises(ConfigError, match="fold_layer=true needs environment.output_bounds=reflect"):
        load("configs/optigan-quick.yaml", [*SMALL, "environment.fold_layer=true", "environment.output_bounds=none",
                                            "environment.energy_bounds=false"])


def test_the_check_does_not_need_the_runs_starting_generator(tmp_path, monkeypatch):
    """A fine-tuned run's environment.init_generator (a path relative to where it started, or moved since) is not
    needed to score the export: it is not read, and does not fail the export."""
    (tmp_path / "run").mkdir()
    ck, env, _ = _stretched_run(tmp_path / "run", "environment.fold_layer=false", seed=0)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    info["config"]["environment"]["init_generator"] = "runs/old/model_3341.pt"  # (not there)
    (tmp_path / "run" / "run.json").write_text(json.dumps(info))
    monkeypatch.chdir(tmp_path)
    q = export_opengate(ck, tmp_path / "model.pt", distill_steps=0, force=True)["quality"]
    assert np.isfinite(q["export"]["js"]) and np.isfinite(q["run"]["js"])


def test_the_runs_relative_files_are_found_from_another_directory(tmp_path):
    """run.json's `cwd` (where the run started): a relative heldout_file is read from there, so the export may run
    from anywhere; data_file is the run's absolute path; an absolute path, and a run.json without `cwd` (an older
    run), are left as they are."""
    from sagips_environments.optigan.export import _run_config

    env = {"name": "optigan", "heldout_file": "data/held.h5", "data_file": "data/ref.h5", "init_generator": None}
    info = {"config": {"environment": env}, "cwd": "/work/start", "data_file": "/data/ref.h5"}
    (tmp_path / "run.json").write_text(json.dumps(info))
    got = _run_config(tmp_path)["environment"]
    assert got["heldout_file"] == "/work/start/data/held.h5" and got["data_file"] == "/data/ref.h5"
    assert got["init_generator"] is None and got["name"] == "optigan"
    info["config"]["environment"]["heldout_file"] = "/abs/held.h5"
    del info["cwd"]
    (tmp_path / "run.json").write_text(json.dumps(info))
    assert _run_config(tmp_path)["environment"]["heldout_file"] == "/abs/held.h5"
    info["config"]["environment"]["heldout_file"] = "data/held.h5"
    (tmp_path / "run.json").write_text(json.dumps(info))
    assert _run_config(tmp_path)["environment"]["heldout_file"] == "data/held.h5"
