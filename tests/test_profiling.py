"""train.profile / --profile: named ranges in a torch.profiler trace (CPU), NVTX push/pop on CUDA, no-op when off."""
import json
from collections import Counter

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sagips.config import load
from sagips.profiling import NAMES, NO_RANGE, Ranges
from sagips.trainer import Trainer
from sagips_environments.proxy1d import Proxy1D

SMALL = ["environment.param_samples=8", "environment.events_per_sample=16", "train.progress=false",
         "train.quality_samples=16", "environment.d_steps=2", "train.log_every=2", "train.checkpoint_every=100",
         "train.state_every=100"]


def make_trainer(tmp_path, profile_on, epochs=2):
    cfg = load(None, SMALL + [f"train.profile={str(profile_on).lower()}"], {"train.epochs": epochs})
    arrays, attrs = Proxy1D.generate_reference(cfg.environment, 0, n_events=2000)
    env = Proxy1D(cfg.environment, "cpu", seed=1)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    return Trainer(cfg, env, 0, 1, str(tmp_path), exchange=lambda buf, epoch, weight=1.0: {}, is_root=False)


def traced_names(trainer) -> Counter:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.fit(progress=False)
    return Counter(e.name for e in prof.events() if e.name.startswith("sagips/"))


def test_profile_ranges_show_up_in_a_torch_profiler_trace(tmp_path):
    tr = make_trainer(tmp_path, True, epochs=2)
    n = traced_names(tr)
    k = tr.env.n_critic
    assert k == 2
    assert n == {"sagips/epoch": 2, "sagips/critic": 2 * k, "sagips/generator": 2, "sagips/data": 2 * (k + 1),
                 "sagips/exchange": 2, "sagips/log": 2}  # log at epoch 1 and at the last
    assert set(n) == set(NAMES)


def test_profile_off_adds_nothing(tmp_path):
    tr = make_trainer(tmp_path, False, epochs=2)
    assert tr.ranges("sagips/epoch") is NO_RANGE and tr.ranges("x") is tr.ranges("y")
    assert traced_names(tr) == Counter()


class FakeNVTX:
    def __init__(self):
        self.calls, self.depth = [], 0

    def range_push(self, name):
        self.depth += 1
        self.calls.append(("push", name, self.depth))

    def range_pop(self):
        self.calls.append(("pop", None, self.depth))
        self.depth -= 1


def test_nvtx_push_pop_are_balanced_and_nested_even_on_errors():
    nvtx = FakeNVTX()
    rng = Ranges(True, "cpu", nvtx=nvtx)
    with rng("sagips/generator"):
        with rng("sagips/data"):
            pass
        with pytest.raises(ValueError):
            with rng("sagips/exchange"):
                raise ValueError("boom")
    assert [c[:2] for c in nvtx.calls] == [("push", "sagips/generator"), ("push", "sagips/data"), ("pop", None),
                                          ("push", "sagips/exchange"), ("pop", None), ("pop", None)]
    assert nvtx.depth == 0
    assert Ranges(True, "cpu").nvtx is None  # no NVTX on a CPU device
    assert Ranges(False, "cuda", nvtx=nvtx).nvtx is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NVTX ranges need CUDA (none on this host)")
def test_nvtx_on_cuda(tmp_path):
    rng = Ranges(True, torch.device("cuda", 0))
    assert rng.nvtx is torch.cuda.nvtx
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with rng("sagips/epoch"):
            x = torch.ones(1024, device="cuda")
            with rng("sagips/data"):
                (x @ x).item()
    names = {e.name for e in prof.events()}
    assert {"sagips/epoch", "sagips/data"} <= names


def test_cli_profile_flag_sets_train_profile(tmp_path):
    from sagips.run import main, parse_args

    assert parse_args(["--profile"]).profile and not parse_args([]).profile
    out = tmp_path / "run"
    assert main(["--profile", "--epochs", "1", "--no-progress", "--output-dir", str(out),
                 "--set", "environment.reference_events=2000", "--set", "environment.param_samples=4",
                 "--set", "environment.events_per_sample=8", "--set", "train.quality_samples=8",
                 "--set", "train.threads=1"]) == 0
    assert json.loads((out / "run.json").read_text())["config"]["train"]["profile"] is True
