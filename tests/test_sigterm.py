"""SIGTERM (what PBS sends before it kills a job): every rank saves its state at the end of its current epoch and
exits with status 143; `--resume` then completes the run bit-identically to an uninterrupted one.

Two routes are tested, because a batch system may use either:
- SIGTERM to the RANK processes themselves (found through /proc by PMI_RANK, as tests/test_faults.py does);
- SIGTERM to mpiexec only: MPICH's hydra (5.0.2, the .venv's) forwards SIGTERM (and SIGINT, SIGUSR1) to every rank
  and then waits for them; it does not tear the job down when a rank exits with a non-zero status on its own.

The mode is `ensemble`: ranks do not wait for each other, so each stops at the end of ITS current epoch (here at most
one epoch apart: ARGS logs every epoch, and the quality gather to rank 0 keeps the ranks that close); `--resume`
continues from the newest epoch whose state exists for every rank.

The stop is not agreed between ranks: in a synchronous mode, a rank that has not seen the signal waits for the stopped
ones in its next exchange until the watchdog (comm.timeout_s) aborts the job; the last test pins that down.
"""
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from sagips.io.metrics import read_metrics
from sagips.io.state import resume_epoch, state_epochs
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


def term_mid_run(out: Path, target: str, min_epoch: int = 2, timeout: float = 150) -> tuple[int, str]:
    """Start the slowed 2-rank run, SIGTERM it once a state of epoch >= min_epoch exists; (mpiexec status, stderr)."""
    with job_with_state(2, [*ARGS, "--mode", MODE, "--output-dir", str(out), *SLOW], out, min_epoch, timeout) as p:
        if target == "ranks":
            pids = rank_pids(str(out))
            assert sorted(pids) == [0, 1], pids
            for pid in pids.values():
                os.kill(pid, signal.SIGTERM)
        else:
            os.kill(p.pid, signal.SIGTERM)  # mpiexec itself (hydra forwards it to the ranks)
        so, se = p.communicate(timeout=60)  # each rank finishes one epoch (~0.3 s), saves, exits
    return p.returncode, so + se


@pytest.mark.parametrize("target", ["ranks", "mpiexec"])
def test_sigterm_saves_state_and_resume_is_bit_identical(tmp_path, reference, target):
    out = tmp_path / "cut"
    rc, log = term_mid_run(out, target)
    stopped = {int(r): int(e) for r, e in re.findall(r"rank (\d+): stopped by a signal after epoch (\d+)", log)}
    assert sorted(stopped) == [0, 1], f"exit {rc}: {log[-2000:]}"
    assert rc == 143, f"exit {rc}: {log[-2000:]}"
    assert all(2 <= e < EPOCHS for e in stopped.values()), stopped
    # each rank saved the state of the epoch it stopped at, and ranks stop at most one epoch apart
    for rank, epoch in stopped.items():
        assert epoch in state_epochs(out, rank), (rank, epoch, state_epochs(out, rank))
    assert max(stopped.values()) - min(stopped.values()) <= 1, stopped
    start = resume_epoch(out, 2)
    assert start is not None and start >= min(stopped.values()) - 1
    assert rank_pids(str(out)) == {}, "ranks survived the stop"

    r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(out), "--no-progress"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = final_generators(out)
    assert sorted(got) == sorted(reference) == [0, 1]
    for rank in reference:
        for k in reference[rank]:
            assert torch.equal(reference[rank][k], got[rank][k]), f"rank {rank} {k} differs after the SIGTERM resume"
    m = read_metrics(out / "metrics.jsonl")
    assert [x["epoch"] for x in m] == list(range(1, EPOCHS + 1))  # nothing duplicated, nothing missing


def test_sigterm_to_one_rank_of_a_synchronous_mode_is_caught_by_the_watchdog(tmp_path):
    """The worst case of a synchronous mode: the signal reaches (or is seen at the end of an epoch by) only some
    ranks. Those save and exit 143; the others wait for them in the next exchange until the watchdog
    (comm.timeout_s) aborts the job naming the rank that left. A complete state for every rank remains."""
    out = tmp_path / "cut"
    args = [*ARGS, "--mode", "allreduce", "--output-dir", str(out), *SLOW, "--set", "comm.timeout_s=3"]
    with job_with_state(2, args, out) as p:
        os.kill(rank_pids(str(out))[1], signal.SIGTERM)
        so, se = p.communicate(timeout=60)
    log = so + se
    m = re.search(r"rank 1: stopped by a signal after epoch (\d+)", log)
    assert m, log[-2000:]
    epoch = int(m.group(1))
    assert re.search(rf"rank 0 waited [\d.]+ s in allreduce \(epoch {epoch + 1}\) for rank 1; aborting", log), \
        log[-2000:]
    assert p.returncode != 0
    assert epoch in state_epochs(out, 1)
    start = resume_epoch(out, 2)
    assert start is not None and start <= epoch  # --resume continues from the newest state both ranks hold
