"""The torch-DDP peer (python -m sagips.ddp, gloo on CPU, 2 processes) trains the same pipeline: with every generator
gradient exchanged (comm.exchange_bias=true) it must give the same generators as SAGIPS's allreduce mode, which
averages the same gradients with MPI_Allreduce (2 ranks: the sum and the halving are exact in float32)."""
import json

import torch

from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from tests._mpirun import run_mpi

EPOCHS = 4
ARGS = ["--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", str(EPOCHS),
        "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
        "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
        "--set", "train.log_every=2", "--set", "comm.exchange_bias=true"]


def test_ddp_peer_trains_and_equals_the_allreduce_mode(tmp_path):
    ddp, ar = tmp_path / "ddp", tmp_path / "allreduce"
    r = run_mpi(2, ["-m", "sagips.ddp", *ARGS, "--output-dir", str(ddp)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_mpi(2, ["-m", "sagips.run", *ARGS, "--mode", "allreduce", "--output-dir", str(ar)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((ddp / "run.json").read_text())
    assert info["mode"] == "ddp-gloo" and info["status"] == "complete" and info["exchanged_floats"] == 51206
    assert len(info["train_seconds"]) == 2 and info["epochs"] == EPOCHS
    a, b = list_checkpoints(ddp), list_checkpoints(ar)
    g0 = load_checkpoint(a[0][1])["generator"]
    for rank in (0, 1):
        gd, ga = load_checkpoint(a[rank][EPOCHS])["generator"], load_checkpoint(b[rank][EPOCHS])["generator"]
        assert sorted(gd) == sorted(ga)  # saved unwrapped: the same keys as a SAGIPS checkpoint
        for k in gd:
            assert torch.equal(gd[k], ga[k]), f"rank {rank} {k}: DDP and allreduce differ"
    assert any(not torch.equal(g0[k], gd[k]) for k in g0)  # it trained
