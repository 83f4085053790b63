"""Issue 24: the opengate file of a run trained with folds stays inside the crystal's bounds, or is refused."""
import json

import numpy as np
import pytest
import torch

from sagips.config import config_to_dict, load
from sagips_environments.optigan.export import ExportRefused, export_opengate
from sagips_environments.optigan.exported import (environment_for_config, load_plain, outside_fraction,
                                                  sample_like_opengate)

SMALL = ["seed=5", "environment.photons_per_point=300", "environment.grid_side=3", "environment.grid_depths=2",
         "environment.heldout_points=3", "environment.heldout_photons=1000"]


@pytest.fixture(scope="module")
def folded_run(tmp_path_factory):
    """A run directory (run.json + one checkpoint) whose generator leans on its folds: its last layer is scaled up
    so that the network alone puts many photons outside the bounds, as a fold-trained network does."""
    run = tmp_path_factory.mktemp("run")
    config = config_to_dict(load("configs/optigan-quick.yaml", SMALL))
    env, _ = environment_for_config(config)
    torch.manual_seed(0)
    G = env.build_generator()
    with torch.no_grad():
        G.model[6].weight.mul_(60.0)
    (run / "run.json").write_text(json.dumps({"config": config}))
    ck = run / "checkpoints" / "rank0000" / "epoch0000001.pt"
    ck.parent.mkdir(parents=True)
    torch.save({"generator": G.state_dict(), "epoch": 1, "environment": "optigan"}, ck)
    return ck, env


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
