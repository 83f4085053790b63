"""SIGTERM (what PBS sends before it kills a job) and SIGINT (Ctrl-C): every rank saves its state at the end of its
current epoch and exits with status 143; `--resume` then completes the run bit-identically to an uninterrupted one.

Two routes are tested, because a batch system may use either:
- SIGTERM to the RANK processes themselves (found through /proc by PMI_RANK, as tests/test_faults.py does);
- SIGTERM to mpiexec only: MPICH's hydra (5.0.2, the .venv's) forwards SIGTERM (and SIGINT, SIGUSR1) to every rank
  and then waits for them; it does not tear the job down when a rank exits with a non-zero status on its own.

The mode is `ensemble`: ranks do not wait for each other in an exchange; the stop agreement still makes both stop at
the same epoch; `--resume` continues from the newest epoch whose state exists for every rank.

A signal that reaches one rank only stops every rank at the same epoch, in every mode (sagips/comm/stop.py): the last
test.
"""
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from sagips.io.metrics import read_metrics
from sagips.io.state import read_latest, resume_epoch, state_epochs
from tests._mpirun import job_with_state, run_mpi
from tests.test_faults import rank_pids
from tests.test_resume import ARGS, EPOCHS, final_generators

MODE = "ensemble"
SLOW = ["--set", "pipeline.delay_s=0.3", "--set", "pipeline.delay_ranks=[0,1]"]  # a sleep: no effect on the numbers


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("sigterm") / "ref"
    r = run_mpi(2, ARGS + ["--mode", MODE, "--output-dir", str(out)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return final_generators(out)


def term_mid_run(out: Path, target: str, min_epoch: int = 2, timeout: float = 150,
                 sig: int = signal.SIGTERM) -> tuple[int, str]:
    """Start the slowed 2-rank run, send `sig` once a state of epoch >= min_epoch exists; (mpiexec status, stderr)."""
    with job_with_state(2, [*ARGS, "--mode", MODE, "--output-dir", str(out), *SLOW], out, min_epoch, timeout) as p:
        if target == "ranks":
            pids = rank_pids(str(out))
            assert sorted(pids) == [0, 1], pids
            for pid in pids.values():
                os.kill(pid, sig)
        else:
            os.kill(p.pid, sig)  # mpiexec itself (hydra forwards it to the ranks)
        so, se = p.communicate(timeout=60)  # each rank finishes one epoch (~0.3 s), saves, exits
    return p.returncode, so + se


@pytest.mark.parametrize("target,sig", [("ranks", signal.SIGTERM), ("mpiexec", signal.SIGTERM),
                                        ("mpiexec", signal.SIGINT)])  # SIGINT: Ctrl-C (it lost the run's epochs)
def test_sigterm_saves_state_and_resume_is_bit_identical(tmp_path, reference, target, sig):
    out = tmp_path / "cut"
    rc, log = term_mid_run(out, target, sig=sig)
    stopped = {int(r): int(e) for r, e in re.findall(r"rank (\d+): stopped by a signal after epoch (\d+)", log)}
    assert sorted(stopped) == [0, 1], f"exit {rc}: {log[-2000:]}"
    assert rc == 143, f"exit {rc}: {log[-2000:]}"
    assert all(2 <= e < EPOCHS for e in stopped.values()), stopped
    # the ranks agreed (sagips/comm/stop.py): each saved the state of the same epoch, and --resume starts there
    assert len(set(stopped.values())) == 1, stopped
    for rank, epoch in stopped.items():
        assert epoch in state_epochs(out, rank), (rank, epoch, state_epochs(out, rank))
    assert resume_epoch(out, 2) == stopped[0]
    info = json.loads((out / "run.json").read_text())  # where --resume will start, for a script that reads it
    assert info["status"] == "stopped" and info["stopped_at_epoch"] == stopped[0], info["status"]
    assert rank_pids(str(out)) == {}, "ranks survived the stop"
    if target == "mpiexec":  # the resume from here is the same as after the ranks' own SIGTERM (the other route)
        return

    r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(out), "--no-progress"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = final_generators(out)
    assert sorted(got) == sorted(reference) == [0, 1]
    for rank in reference:
        for k in reference[rank]:
            assert torch.equal(reference[rank][k], got[rank][k]), f"rank {rank} {k} differs after the SIGTERM resume"
    m = read_metrics(out / "metrics.jsonl")
    assert [x["epoch"] for x in m] == list(range(1, EPOCHS + 1))  # nothing duplicated, nothing missing


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(tmp_path):
    """Ctrl-C during a long epoch stops after it; a second one a moment later stops at once (a review: one Ctrl-C
    could no longer interrupt a long or stuck epoch). The copies of one Ctrl-C that a rank gets within milliseconds
    (launcher, supervisor) count once: the test above stops with a state."""
    out = tmp_path / "twice"
    slow = ["--set", "pipeline.delay_s=4", "--set", "pipeline.delay_ranks=[0,1]"]  # epochs of 4 s
    with job_with_state(2, [*ARGS, "--mode", MODE, "--output-dir", str(out), *slow], out, 2, 150) as p:
        pids = rank_pids(str(out))  # (to the ranks: hydra's mpiexec takes a second Ctrl-C itself, and kills them)
        for _ in range(2):
            for pid in pids.values():
                os.kill(pid, signal.SIGINT)
            time.sleep(1.5)
        so, se = p.communicate(timeout=60)
    log = so + se
    assert p.returncode not in (0, 143), log[-2000:]
    assert "interrupted again (Ctrl-C)" in log and "stopped by a signal after epoch" not in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("mode,n", [("ensemble", 2), ("allreduce", 2), ("arar", 2), ("arar-arar", 4),
                                    ("rma-arar-arar", 4)])
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_epoch(tmp_path, mode, n):
    """PBS's SIGTERM seen by one rank only (the worst case): the ranks agree (sagips/comm/stop.py), every rank saves
    the same epoch, within 2 epochs of the furthest rank at the signal, and the job exits 143 at once (no watchdog, no
    survivors)."""
    out = tmp_path / "cut"
    slow = ["--set", "pipeline.delay_s=0.2", "--set", f"pipeline.delay_ranks={list(range(n))}"]
    args = [*ARGS, "--mode", mode, "--output-dir", str(out), *slow, "--set", "comm.inner_size=2",
            "--set", "comm.timeout_s=60", "--epochs", "30"]
    with job_with_state(n, args + ["--set", "train.state_every=1"], out) as p:
        pids = rank_pids(str(out))
        # each rank's epoch when the signal lands: its newest state, or the epoch after it (then in progress)
        reached = max(max(state_epochs(out, r), default=0) for r in range(n)) + 1
        os.kill(pids[1], signal.SIGTERM)
        # beyond comm.timeout_s: a rank left waiting in a collective is named by the watchdog's abort (this found the
        # stop agreement's deadlock with an outer epoch, rma-arar-arar: sagips/comm/stop.py, tests/mpi/test_stop.py)
        so, se = p.communicate(timeout=120)
    log = so + se
    assert p.returncode == 143, f"exit {p.returncode}: {log[-2000:]}"
    seen = re.search(r"rank 1: stop requested by a signal at the end of epoch (\d+); every rank stops after epoch "
                     r"(\d+)", log)
    assert seen, log[-2000:]
    signalled, target = int(seen.group(1)), int(seen.group(2))
    stopped = {int(r): int(e) for r, e in re.findall(r"rank (\d+): stopped by a signal after epoch (\d+)", log)}
    assert stopped == {r: target for r in range(n)}, (stopped, log[-2000:])
    # ranks drift apart where nothing synchronises them (ensemble; rma-arar-arar's inner ring), and a rank ahead
    # cannot go back: the agreed epoch is bounded by the furthest rank at the signal, plus the epochs that the flag's
    # nonblocking reduction takes to progress there (MPI progresses it only inside MPI calls: once per epoch on a rank
    # whose exchange is plain stores into shared memory; 2 rounds for 4 ranks)
    assert signalled <= target <= reached + 3, (signalled, reached, target)
    if mode in ("allreduce", "arar", "arar-arar"):  # ranks in step: at most 2 epochs past the signalled rank
        assert target <= signalled + 2, (signalled, target)
    for rank in range(n):
        assert target in state_epochs(out, rank), (rank, target, state_epochs(out, rank))
    assert (read_latest(out) or {}).get("epoch") == target  # the marker names the agreed epoch
    assert resume_epoch(out, n) == target
    assert "waited" not in log  # no rank was left waiting for a stopped one
    assert rank_pids(str(out)) == {}, "ranks survived the stop"
