"""The torch-DDP peer (python -m sagips.ddp, gloo on CPU, 2 processes) trains the same pipeline: with every generator
gradient exchanged (comm.exchange_bias=true) it must give the same generators as SAGIPS's allreduce mode, which
averages the same gradients with MPI_Allreduce (2 ranks: the sum and the halving are exact in float32). The DDP run
is cut at epoch 2 and continued with `python -m sagips.ddp --resume`, so the equality also holds its resume to be
bit-identical to an uninterrupted run (rank 1 from a state with the DDP wrapper's `module.` keys, as older versions
wrote it)."""
import json

import pytest
import torch

from sagips.config import ConfigError, load
from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.io.state import load_state, state_path
from sagips.run import check_resumable
from tests._mpirun import run_mpi

EPOCHS = 4
ARGS = ["--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", str(EPOCHS),
        "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
        "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
        "--set", "train.log_every=2", "--set", "comm.exchange_bias=true",
        "--set", "train.lr_final=1"]  # (no decay over train.epochs: a run cut at epoch 2 then resumed is the same run)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """Epochs 1-2, then --resume to EPOCHS (the baseline's run.json says mode ddp-gloo)."""
    ddp = tmp_path_factory.mktemp("ddp") / "run"
    r = run_mpi(2, ["-m", "sagips.ddp", *ARGS, "--epochs", "2", "--set", "train.state_every=1", "--output-dir",
                    str(ddp)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    st = load_state(ddp, 1, 2)
    assert not any(k.startswith("module.") for k in st["generator"])  # saved unwrapped, as a checkpoint is
    # rank 1 resumes from the state as the versions before wrote it (the DDP wrapper's `module.` keys)
    st["generator"] = {f"module.{k}": v for k, v in st["generator"].items()}
    torch.save(st, state_path(ddp, 1, 2))
    r = run_mpi(2, ["-m", "sagips.ddp", "--resume", "--epochs", str(EPOCHS), "--no-progress", "--output-dir",
                    str(ddp)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return ddp


@pytest.fixture(scope="module")
def allreduce_run(tmp_path_factory):
    ar = tmp_path_factory.mktemp("allreduce") / "run"
    r = run_mpi(2, ["-m", "sagips.run", *ARGS, "--mode", "allreduce", "--output-dir", str(ar)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return ar


def test_ddp_peer_trains_and_equals_the_allreduce_mode(ddp_run, allreduce_run):
    ddp, ar = ddp_run, allreduce_run
    info = json.loads((ddp / "run.json").read_text())
    assert info["mode"] == "ddp-gloo" and info["status"] == "complete" and info["exchanged_floats"] == 51206
    assert info["resumes"][0]["epoch"] == 2
    assert len(info["train_seconds"]) == 2 and info["epochs"] == EPOCHS
    a, b = list_checkpoints(ddp), list_checkpoints(ar)
    g0 = load_checkpoint(a[0][1])["generator"]
    for rank in (0, 1):
        gd, ga = load_checkpoint(a[rank][EPOCHS])["generator"], load_checkpoint(b[rank][EPOCHS])["generator"]
        assert sorted(gd) == sorted(ga)  # saved unwrapped: the same keys as a SAGIPS checkpoint
        for k in gd:
            assert torch.equal(gd[k], ga[k]), f"rank {rank} {k}: DDP and allreduce differ"
    assert any(not torch.equal(g0[k], gd[k]) for k in g0)  # it trained


def test_each_launcher_refuses_the_others_run_in_one_line(ddp_run, allreduce_run):
    cfg = load(None, base=json.loads((ddp_run / "run.json").read_text())["config"])
    with pytest.raises(ConfigError, match="used mode 'ddp-gloo'; resume it with python -m sagips.ddp"):
        check_resumable(str(ddp_run), cfg, 2)
    with pytest.raises(ConfigError, match="used mode 'allreduce'; resume it with python -m sagips.run"):
        check_resumable(str(allreduce_run), cfg, 2, baseline="ddp")
