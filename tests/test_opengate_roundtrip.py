"""Issue 24: an exported file run by opengate's own OptiGAN (stand-alone, from a ROOT file) gives back, per gamma
event and in event order, what the file's network computes for that event's emission point. Runs where opengate is
importable (`make opengate-check`), skips elsewhere."""
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("GATEONRTD", "1")  # opengate's import must not download Geant4 data
pytestmark = pytest.mark.skipif(importlib.util.find_spec("opengate") is None or importlib.util.find_spec("uproot")
                                is None, reason="opengate is not installed here (make opengate-check installs it)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_opengate_runs_the_exported_file_on_each_emission_point(tmp_path):
    from opengate_roundtrip import run_opengate, write_phase_file

    from sagips_environments.optigan.nets import OptiGANGenerator
    from sagips_environments.optigan.opengate import PlainGenerator, save_opengate

    torch.manual_seed(3)
    G = OptiGANGenerator()
    with torch.no_grad():  # no noise dependence: every photon of an event is the network at its condition
        G.model[0].weight[:, :10] = 0.0
    save_opengate(tmp_path / "model.pt", G, epoch=7)
    points = np.array([[0.1, 0.0, 0.5], [1.2, 0.7, 2.5], [0.6, 0.3, 1.5]])
    counts = [5, 8, 3]
    write_phase_file(tmp_path / "phase.root", points, counts)
    gen = run_opengate(tmp_path / "phase.root", tmp_path / "model.pt", tmp_path / "og")
    assert [len(g) for g in gen] == counts  # every event kept, the last one too (it has its e- row)
    plain = PlainGenerator()
    plain.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True)["generator_state_dict"])
    for p, g in zip(points, gen):
        with torch.no_grad():
            want = plain(torch.cat([torch.zeros(1, 10), torch.tensor(p, dtype=torch.float32)[None]], 1)).numpy()
        np.testing.assert_allclose(g, np.repeat(want, len(g), 0), rtol=1e-5, atol=1e-5)
