"""Resume after a kill: the resumed run ends bit-identical to an uninterrupted run (deterministic modes on CPU), and
for rma-arar-arar (whose contributions depend on timing) it completes and ends where an uninterrupted run ends, up to
that timing noise."""
import json

import pytest
import torch

from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.io.metrics import read_metrics
from sagips.io.state import load_state, read_latest
from tests._mpirun import job_with_state, run_mpi

EPOCHS = 8
ARGS = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", str(EPOCHS),
        "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
        "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
        "--set", "train.state_every=2", "--set", "train.checkpoint_every=2", "--set", "train.log_every=1",
        "--set", "comm.inner_size=1", "--set", "comm.outer_every=3", "--set", "train.lr_final=0.5"]


def final_generators(out):
    ck = list_checkpoints(out)
    return {r: load_checkpoint(ck[r][EPOCHS])["generator"] for r in ck}


def kill_mid_run(out, mode, min_epoch=2, timeout=150):
    """Start a 2-rank run and SIGKILL the whole job as soon as a state of epoch >= min_epoch exists."""
    # the straggler knob slows every epoch (a sleep: no effect on the numbers) so that the kill lands mid-run
    args = [*ARGS, "--mode", mode, "--output-dir", str(out),
            "--set", "pipeline.delay_s=0.3", "--set", "pipeline.delay_ranks=[0,1]"]
    with job_with_state(2, args, out, min_epoch, timeout):
        pass  # leaving the block SIGKILLs the whole job
    return read_latest(out)["epoch"]


# One exchanging mode, to keep the suite under 10 minutes: allreduce and arar keep no state between epochs, and
# arar-arar runs the same Ring code (its outer ring) plus the outer-epoch counter, so a resume of those restores
# exactly what this one restores; ensemble is checked bit-identical by tests/test_sigterm.py (its resume after a
# SIGTERM), rma-arar-arar by test_rma_resume_completes_and_matches_an_uninterrupted_run below
@pytest.mark.parametrize("mode", ["arar-arar"])
def test_resume_after_kill_is_bit_identical(tmp_path, mode):
    ref = tmp_path / "ref"
    r = run_mpi(2, ARGS + ["--mode", mode, "--output-dir", str(ref)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    cut = tmp_path / "cut"
    killed_at = kill_mid_run(cut, mode)
    assert killed_at < EPOCHS
    torn = cut / "checkpoints" / "rank0001" / ".epoch0000099.pt.a1b2c3.tmp"  # what a kill mid-write leaves
    torn.write_bytes(b"half a checkpoint")
    # the SIGKILL itself may have landed mid-write and left a real one too: count them all before resuming
    temps = [f for f in cut.rglob(".*.tmp") if f.is_file()]
    assert torn in temps
    r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(cut), "--no-progress"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"removed {len(temps)} temporary file" in r.stderr
    resumed_at = json.loads((cut / "run.json").read_text())["resumes"][0]["epoch"]
    assert f"sagips: --resume: from epoch {resumed_at} of {EPOCHS}\n" in r.stderr  # (the schedule is unchanged)
    assert not any(f.exists() for f in temps)
    a, b = final_generators(ref), final_generators(cut)
    assert sorted(a) == sorted(b) == [0, 1]
    for rank in a:
        for k in a[rank]:
            assert torch.equal(a[rank][k], b[rank][k]), f"rank {rank} {k} differs after resume"
    check_resumed_run(cut)
    # the states hold the subset's key, not its rows (issue 23): the resume rebuilt the subset from the seed
    sd = load_state(cut, 0, EPOCHS)
    assert "subset_idx" not in sd and sd["data_key"]["file"] is None and sd["data_key"]["rank"] == 0


def test_a_resume_that_changes_the_epochs_says_what_it_does_to_the_learning_rates():
    """lr(e) = lr0 * final ** ((e - 1) / (epochs - 1)): a resume at epoch 6000 of a 6000-epoch run to 9000 epochs
    continues at a 9000-epoch run's rate, 0.1 ** (5999/8999 - 1) = 2.15x the saved schedule's last; said in the
    resume's line (a new user extended a run and found its rate raised without a word)."""
    from sagips.config import load
    from sagips.run import schedule_change

    def lr(e, epochs, final):  # the schedule, written here
        return 1e-3 * final ** ((e - 1) / (epochs - 1))

    cfg = load("configs/proxy1d-quick.yaml", ["train.epochs=9000"])  # (lr_final 0.1, the critic's alike)
    assert schedule_change({"train": {"epochs": 6000}}, cfg, 6000) == (
        f": the learning rates' decay (train.lr_final) now spans 9000 epochs, not 6000, so from here they are "
        f"{lr(6000, 9000, 0.1) / lr(6000, 6000, 0.1):.2f}x those of the saved schedule (as a 9000-epoch run's are here)")
    assert f"{lr(6000, 9000, 0.1) / lr(6000, 6000, 0.1):.2f}" == "2.15"
    cfg = load("configs/proxy1d-quick.yaml", ["train.epochs=500", "train.lr_d_final=1"])
    assert schedule_change({"train": {"epochs": 400}}, cfg, 400).endswith(
        f"so from here they are {lr(400, 500, 0.1) / lr(400, 400, 0.1):.2f}x (the generator's), 1.00x (the critic's) "
        f"those of the saved schedule (as a 500-epoch run's are here)")
    assert schedule_change({"train": {"epochs": 6000}}, load("configs/proxy1d-quick.yaml", []), 3000) == ""
    assert schedule_change({"train": {"epochs": 400}}, load(None, ["train.epochs=500"]), 400) == ""  # lr_final 1


def test_a_run_shorter_than_ten_windows_of_its_weight_average_is_told_that_converged_may_mean_stopped():
    """make run --epochs 300 ended at max|r| 0.31 with all six parameters 'converged' (its rates decayed to a tenth
    and its weight average lagged ~200 epochs): a note says so; the preset's 6,000 epochs and a run without a weight
    average get none."""
    from sagips.config import load
    from sagips.run import short_run_note

    note = short_run_note(load("configs/proxy1d-quick.yaml", ["train.epochs=300"]).train, 300)
    assert note.startswith("sagips: note: 300 epochs is short against the weight average's ~200-epoch window "
                           "(train.ema 0.995) and its learning rates decayed to 0.1 of their start")
    assert "train at least 2000 epochs" in note and "\n" not in note
    assert short_run_note(load("configs/proxy1d-quick.yaml", []).train, 6000) == ""
    assert short_run_note(load("configs/proxy1d-quick.yaml", ["train.epochs=2000"]).train, 2000) == ""
    assert short_run_note(load(None, ["train.ema=0"]).train, 300) == ""


def check_resumed_run(cut):
    info = json.loads((cut / "run.json").read_text())
    assert info["status"] == "complete" and info["resumes"][0]["epoch"] >= 2
    assert info["short_run"].startswith(f"{EPOCHS} epochs is short against the weight average's ~200-epoch window")
    m = read_metrics(cut / "metrics.jsonl")
    assert [x["epoch"] for x in m] == list(range(1, EPOCHS + 1))  # no duplicated or missing records
    times = [x["time_s"] for x in m]
    assert all(t1 < t2 for t1, t2 in zip(times, times[1:]))  # time stamps continue across the resume


def flat(sd):
    return torch.cat([v.reshape(-1).double() for _, v in sorted(sd.items())])


def test_rma_resume_completes_and_matches_an_uninterrupted_run(tmp_path):
    """rma-arar-arar is not deterministic (which neighbour contributions arrive in time depends on timing), so the
    resumed run is compared with an uninterrupted one statistically: the final residuals agree within 0.02, and the
    final generators are closer to each other than either is to where training started. (Two runs' contributions
    differ with the load: on a loaded 2-core machine the generators of two such runs end 30-50% of the training's
    movement apart after 8 epochs; a state from another environment, a NaN, or restarting the weights would end
    further away.)"""
    mode = "rma-arar-arar"
    inner = ["--set", "comm.inner_size=2"]  # one RMA group of both ranks (ARGS has 1: no RMA at all)
    ref = tmp_path / "ref"
    r = run_mpi(2, ARGS + ["--mode", mode, "--output-dir", str(ref), *inner], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    cut = tmp_path / "cut"
    args = [*ARGS, "--mode", mode, "--output-dir", str(cut), *inner,
            "--set", "pipeline.delay_s=0.3", "--set", "pipeline.delay_ranks=[0,1]"]
    with job_with_state(2, args, cut, 2, 150):
        pass
    assert read_latest(cut)["epoch"] < EPOCHS
    r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(cut), "--no-progress"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    check_resumed_run(cut)
    a, b = final_generators(ref), final_generators(cut)
    start = {rank: load_checkpoint(list_checkpoints(ref)[rank][1])["generator"] for rank in a}
    for rank in a:
        moved = (flat(a[rank]) - flat(start[rank])).norm()
        apart = (flat(a[rank]) - flat(b[rank])).norm()
        assert moved > 0 and apart < moved, (rank, float(apart), float(moved))
    qa, qb = (read_metrics(d / "metrics.jsonl")[-1] for d in (ref, cut))
    ra, rb = qa["residuals"], qb["residuals"]
    assert max(abs(x - y) for x, y in zip(ra, rb)) < 0.02, (ra, rb)


def test_resume_refuses_mismatches(tmp_path):
    out = tmp_path / "run"
    r = run_mpi(1, ARGS + ["--mode", "ensemble", "--epochs", "2", "--output-dir", str(out)], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(out), "--no-progress"], timeout=120)
    assert r.returncode == 2 and "had 1 ranks" in r.stderr
    r = run_mpi(1, ["-m", "sagips.run", "--resume", "--output-dir", str(tmp_path / "none")], timeout=120)
    assert r.returncode == 2 and "holds no run" in r.stderr


def test_state_retention_keeps_every_epoch_a_marker_can_name(tmp_path):
    """A fast rank must not delete the epoch that becomes complete (held by every rank) while a slow rank is still
    writing it: before any complete epoch is known, nothing is deleted; after it, only states older than it beyond
    the newest two. The rank decides from what it wrote and what it was told, never from a listing."""
    from sagips.io.state import RankStates, state_epochs

    fast, slow = RankStates(tmp_path, 0), RankStates(tmp_path, 1)
    for e in (2, 4, 6, 8):  # rank 0 runs ahead (rma-arar-arar); rank 1 has written only epoch 2
        fast.save(e, {"epoch": e})
    slow.save(2, {"epoch": 2})
    assert state_epochs(tmp_path, 0) == [2, 4, 6, 8]
    assert fast.set_complete(2)  # every rank holds epoch 2 (the ranks' reduction says so)
    assert not fast.set_complete(2) and not fast.set_complete(0)  # old news
    fast.save(10, {"epoch": 10})
    assert state_epochs(tmp_path, 0) == fast.epochs == [2, 4, 6, 8, 10]  # nothing older than 2 beyond the newest 2
    fast.set_complete(8)
    fast.save(12, {"epoch": 12})
    assert state_epochs(tmp_path, 0) == fast.epochs == [8, 10, 12]
