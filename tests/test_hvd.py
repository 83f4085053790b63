"""Issue 20: mode hvd (the paper's Horovod baseline: one data-parallel GAN) and train.split_batch (eq. 10)."""
import copy
import json

import pytest
import torch

from sagips.config import ConfigError, load
from sagips.io.state import load_state, state_epochs
from sagips.run import data_parallel_settings
from sagips_environments.proxy1d.env import Proxy1D
from tests._mpirun import run_mpi

EPOCHS = 4
QUICK = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", str(EPOCHS),
         "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
         "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
         "--set", f"train.state_every={EPOCHS}", "--set", "train.log_every=2"]


def final_states(out, n):
    assert all(EPOCHS in state_epochs(out, r) for r in range(n)), [state_epochs(out, r) for r in range(n)]
    return [load_state(out, r, EPOCHS) for r in range(n)]


def same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


# N = 2 without the split: tests/test_paper_table4.py (the hvd column of --smoke)
@pytest.mark.parametrize("n,split", [(3, True)])
def test_hvd_keeps_both_networks_identical_on_every_rank(tmp_path, n, split):
    """Both networks' gradients averaged every step (biases too) and every rank on all the data: after training,
    every rank's generator AND critic are bit-identical, although each rank drew its own batches. With
    train.split_batch the batch per rank is 1/n of the preset's, and run.json records both."""
    out = tmp_path / "hvd"
    args = QUICK + ["--mode", "hvd", "--output-dir", str(out)] + (["--set", "train.split_batch=true"] if split else [])
    r = run_mpi(n, args, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    states = final_states(out, n)
    for s in states[1:]:
        assert same(states[0]["generator"], s["generator"])
        assert same(states[0]["discriminator"], s["discriminator"])
    assert not torch.equal(states[0]["rng_torch"], states[1]["rng_torch"])  # the ranks did draw different batches
    info = json.loads((out / "run.json").read_text())
    assert info["mode"] == "hvd" and info["reference_fraction"] == 1.0
    per_rank = 16 // n if split else 16
    assert info["batch"] == {"key": "environment.param_samples", "split": split, "requested": 16,
                             "ranks_averaged": n, "per_rank": per_rank, "effective": per_rank * n}
    assert info["events_per_epoch"] == per_rank * 20
    assert info["config"]["environment"]["param_samples"] == 16  # what the user asked for (--resume derives again)


def test_hvd_on_one_rank_with_all_the_data_is_the_ensemble(tmp_path):
    """hvd at N = 1 is one GAN on all the data: bit-identical to ensemble with environment.subset_fraction=1."""
    got = {}
    for mode, sets in (("hvd", []), ("ensemble", ["--set", "environment.subset_fraction=1"])):
        out = tmp_path / mode
        r = run_mpi(1, QUICK + ["--mode", mode, "--output-dir", str(out), *sets], timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        got[mode] = final_states(out, 1)[0]
    for net in ("generator", "discriminator", "opt_g", "opt_d"):
        a, b = got["hvd"][net], got["ensemble"][net]
        if net.startswith("opt"):
            a, b = ({k: v for p in s["state"].values() for k, v in p.items()} for s in (a, b))
        assert same(a, b), net


def _cfg(*sets):
    return load("configs/proxy1d-quick.yaml", list(sets))


@pytest.mark.parametrize("ranks", [1, 2, 4, 5])
def test_split_batch_divides_the_batch_by_the_ranks_averaged(ranks):
    cfg = _cfg("train.split_batch=true", "mode=arar")
    env_cfg, batch = data_parallel_settings(cfg, Proxy1D, ranks)
    assert env_cfg.param_samples == 64 // ranks and cfg.environment.param_samples == 64
    assert batch["per_rank"] == 64 // ranks and batch["effective"] == (64 // ranks) * ranks
    env = Proxy1D(env_cfg, torch.device("cpu"), seed=0)
    per_set = cfg.environment.events_per_sample  # the preset's
    assert env.events_per_epoch == (64 // ranks) * per_set  # events per epoch per rank: 1/N of one rank's


def test_split_batch_errors_name_the_fix():
    with pytest.raises(ConfigError, match=r"environment.param_samples=64 is smaller than the 65 ranks"):
        data_parallel_settings(_cfg("train.split_batch=true"), Proxy1D, 65)

    class NoBatch(Proxy1D):
        batch_key = None

    with pytest.raises(ConfigError, match=r"names no batch to split; set its Environment.batch_key"):
        data_parallel_settings(_cfg("train.split_batch=true"), NoBatch, 2)
    env_cfg, batch = data_parallel_settings(_cfg(), NoBatch, 2)  # without split_batch: nothing to record
    assert batch is None and env_cfg.param_samples == 64


def test_hvd_uses_all_the_data_without_changing_the_config():
    cfg = _cfg("mode=hvd")
    before = copy.deepcopy(cfg.environment)
    env_cfg, batch = data_parallel_settings(cfg, Proxy1D, 3)
    assert env_cfg.subset_fraction == 1.0 and cfg.environment == before and batch["split"] is False


def test_outer_sync_weights_needs_outer_epochs():
    with pytest.raises(ConfigError, match=r"comm.outer_sync=weights needs a mode with outer epochs "
                                          r"\(arar-arar or rma-arar-arar\), not arar"):
        _cfg("mode=arar", "comm.outer_sync=weights")
    assert _cfg("mode=rma-arar-arar", "comm.outer_sync=weights").comm.outer_sync == "weights"
