"""Issue 20, item 3: comm.outer_sync=weights. An outer epoch averages the generator's weights and Adam moments over
all ranks, so every rank's generator is bit-identical after it; a resume across one is bit-exact."""
import torch

from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.io.state import load_state, read_latest, state_epochs
from tests._mpirun import run_mpi

ARGS = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress",
        "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
        "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
        "--set", "comm.outer_every=3", "--set", "comm.outer_sync=weights", "--set", "train.log_every=1"]


def same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def moments(state: dict) -> dict:
    return {f"{i}.{k}": v for i, p in state["opt_g"]["state"].items() for k, v in p.items() if k.startswith("exp_")}


def test_an_outer_epoch_makes_every_generator_identical(tmp_path):
    """4 ranks as 2 RMA groups of 2: after epoch 2 the generators differ (between the groups, and inside a group,
    where RMA combines what has arrived); after the outer epoch 3 every rank's generator, biases included, its
    weight average (what the checkpoints hold) and its Adam moments are the same bytes."""
    out = tmp_path / "w"
    r = run_mpi(4, ARGS + ["--mode", "rma-arar-arar", "--set", "comm.inner_size=2", "--epochs", "3",
                           "--set", "train.state_every=1", "--output-dir", str(out)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(state_epochs(out, k)[-2:] == [2, 3] for k in range(4)), [state_epochs(out, k) for k in range(4)]
    before = [load_state(out, k, 2) for k in range(4)]
    after = [load_state(out, k, 3) for k in range(4)]
    assert not same(before[0]["generator"], before[2]["generator"])  # the groups trained apart until the outer epoch
    for s in after[1:]:
        assert same(after[0]["generator"], s["generator"])
        assert same(after[0]["generator_ema"], s["generator_ema"])  # the checkpointed one (the preset's train.ema)
        assert same(moments(after[0]), moments(s)) and moments(s)


def test_resume_across_an_outer_epoch_is_bit_exact(tmp_path):
    """2 groups of one rank, outer epochs 3 and 6: a run that fails at epoch 5 (after its states of epochs 2 and 4)
    and is resumed ends bit-identical to an uninterrupted one."""
    common = ARGS + ["--mode", "arar-arar", "--set", "comm.inner_size=1", "--epochs", "8",
                     "--set", "train.state_every=2", "--set", "train.checkpoint_every=2", "--set", "train.lr_final=0.5"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    r = run_mpi(2, common + ["--output-dir", str(ref)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_mpi(2, common + ["--output-dir", str(cut), "--set", "pipeline.fail_epoch=5",
                             "--set", "pipeline.fail_ranks=[1]"], timeout=180)
    assert r.returncode != 0 and "rank 1 failed" in r.stderr, r.stderr[-3000:]
    assert read_latest(cut)["epoch"] in (2, 4)  # the newest state every rank is known to hold: before epoch 6
    r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(cut), "--no-progress",
                    "--set", "pipeline.fail_epoch=0"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = list_checkpoints(ref), list_checkpoints(cut)
    for rank in (0, 1):
        assert same(load_checkpoint(a[rank][6])["generator"], load_checkpoint(a[1 - rank][6])["generator"])
        assert same(load_checkpoint(a[rank][8])["generator"], load_checkpoint(b[rank][8])["generator"])
        assert same(moments(load_state(ref, rank, 8)), moments(load_state(cut, rank, 8)))
