"""A rank that dies: the job tears itself down, names the lost rank, leaves no orphans; the run then resumes.

Also: a checkpoint that carries a pickled object is refused (loads use weights_only=True).
"""
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from sagips.io.checkpoint import load_checkpoint
from sagips.io.state import resume_epoch
from tests._mpirun import job_with_state, run_mpi

RUN = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", "400",
       "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
       "--set", "environment.events_per_sample=20", "--set", "comm.inner_size=2", "--set", "comm.timeout_s=30",
       "--set", "train.state_every=2", "--set", "train.checkpoint_every=50", "--set", "train.quality_samples=16"]


def job_processes(out_dir: str) -> list[tuple[int, int, bool]]:
    """(MPI rank, pid, is_worker) of every sagips.run process writing into out_dir (found through /proc).

    Under a launcher each rank is two processes (sagips.supervise): the launched one, and its child, the worker,
    which does the work and whose pid run.json records.
    """
    procs = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"sagips.run" in cmd and out_dir.encode() in cmd:
            rank = next((int(e[9:]) for e in env if e.startswith(b"PMI_RANK=")), None)
            if rank is not None:
                procs[int(d.name)] = (rank, ppid)
    return [(rank, pid, ppid in procs) for pid, (rank, ppid) in procs.items()]


def rank_pids(out_dir: str) -> dict[int, int]:
    """{MPI rank: pid of its worker process}."""
    return {rank: pid for rank, pid, worker in job_processes(out_dir) if worker}


@pytest.mark.parametrize("mode", ["rma-arar-arar"])
def test_kill_one_rank_tears_down_the_job_and_leaves_a_resumable_state(tmp_path, mode):
    out = str(tmp_path / "run")
    with job_with_state(4, [*RUN, "--mode", mode, "--output-dir", out], out) as p:
        pids = rank_pids(out)
        assert sorted(pids) == [0, 1, 2, 3]
        os.kill(pids[2], signal.SIGKILL)
        t_kill = time.time()
        out_s, err = p.communicate(timeout=60)  # the job must end on its own within 60 s
        err = out_s + err
        teardown = time.time() - t_kill
    assert p.returncode != 0
    # the lost rank is named by its supervisor, with the pid that run.json maps to it
    assert f"sagips: rank 2 (pid {pids[2]} on " in err and "killed by signal 9 (SIGKILL" in err, \
        f"exit {p.returncode}: {err[-2000:]}"
    info = json.loads((Path(out) / "run.json").read_text())
    assert {proc["rank"]: proc["pid"] for proc in info["processes"]} == pids
    assert len(re.findall(r"sagips: rank \d+ \(pid", err)) == 1  # only the lost rank is named
    time.sleep(1)
    assert job_processes(out) == [], "orphan processes survived the teardown"
    assert teardown < 60
    # nothing lost beyond the last state: a complete state exists for every rank (what --resume needs; the resume
    # itself after a kill: tests/test_resume.py; after a kill of one rank, 20 of 20: benchmarks/faults.py)
    assert resume_epoch(out, 4) is not None


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_with_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"generator": {}, "epoch": 1, "time_s": 0.0, "rank": 0, "payload": Evil()}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|global"):
        load_checkpoint(path)


@pytest.mark.parametrize("mode,n", [("ensemble", 2), ("allreduce", 2), ("arar", 2), ("arar-arar", 4),
                                    ("rma-arar-arar", 4)])
def test_an_error_on_one_rank_ends_the_job_at_once_and_names_it(tmp_path, mode, n):
    """An exception on one rank (the fault drill, pipeline.fail_epoch) is reported with its traceback, naming the
    rank, and the job is aborted before any collective clean-up (rma-arar-arar used to wait in Win_free while the
    others trained on until the watchdog). The watchdog is set far beyond the test's timeout, so that only the
    abort can end the job in time."""
    t0 = time.time()  # the later --epochs and --set win over RUN's
    r = run_mpi(n, RUN + ["--epochs", "100000", "--set", "comm.timeout_s=600", "--mode", mode, "--output-dir",
                          str(tmp_path / "run"), "--set", "pipeline.fail_epoch=3", "--set", "pipeline.fail_ranks=[1]"],
                timeout=90)
    assert r.returncode != 0
    assert "sagips: rank 1 failed" in r.stderr and "FaultDrill" in r.stderr and "fault drill" in r.stderr
    assert r.stderr.count("sagips: rank 1 failed") == 1, r.stderr  # once (it was printed again by main)
    assert time.time() - t0 < 90
    # run.json tells a failed run from one still training (the failed rank wrote it before the abort)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["end_time"], info["status"]
    assert info["error"] == ("rank 1: sagips.trainer.FaultDrill: pipeline.fail_epoch: the fault drill's error on rank 1 "
                             "at epoch 3"), info["error"]


# sagips.run with rank 0 slow to write run.json's "running" (a loaded file system: 1.5 s), and rank 1 failing at
# its first data batch, before the first-epoch checks (the first wait for rank 0)
_SLOW_RUN_JSON = ("import sys, time; from mpi4py import MPI; import sagips.run as R, sagips.trainer as T\n"
                  "w, f = R.write_run_json, T.Trainer._critic_forward\n"
                  "def slow(d, info):\n"
                  "    if MPI.COMM_WORLD.rank == 0 and info.get('status') == 'running': time.sleep(1.5)\n"
                  "    w(d, info)\n"
                  "def bad(self):\n"
                  "    if self.rank == 1: raise OSError('rank 1 cannot read its data')\n"
                  "    return f(self)\n"
                  "R.write_run_json, T.Trainer._critic_forward = slow, bad; sys.exit(R.main(sys.argv[1:]))")


def test_a_rank_that_fails_before_rank_0_wrote_run_json_is_recorded(tmp_path):
    """Rank 1 fails at its first batch while rank 0 is still writing run.json: the failure is recorded there (no rank
    trains before every run.json is written; it was lost, and the run left without a run.json or "running")."""
    r = run_mpi(2, ["-c", _SLOW_RUN_JSON, *RUN[2:], "--mode", "ensemble", "--output-dir", str(tmp_path / "run")],
                timeout=90)
    assert r.returncode != 0 and "sagips: rank 1 failed" in r.stderr, r.stderr[-2000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"] == "rank 1: OSError: rank 1 cannot read its data", info


def test_a_job_that_the_watchdog_aborts_says_so_in_run_json(tmp_path):
    """Rank 1 sleeps 30 s in its pipeline; rank 0 waits 3 s in the exchange, and the watchdog's line is the record."""
    r = run_mpi(2, RUN + ["--mode", "arar", "--set", "comm.inner_size=0", "--output-dir", str(tmp_path / "run"),
                          "--set", "comm.timeout_s=3", "--set", "pipeline.delay_s=30", "--set",
                          "pipeline.delay_ranks=[1]"], timeout=90)
    assert r.returncode != 0 and "aborting the job (comm.timeout_s=3)" in r.stderr, r.stderr[-2000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and re.fullmatch(r"rank 0 waited 3\.\d s in .* for rank 1", info["error"]), info


def test_a_run_of_one_process_that_fails_says_so_in_run_json(tmp_path, capsys):
    """Without a launcher and on rank 0 itself: the same record."""
    from sagips.run import main

    assert main(RUN[2:] + ["--mode", "ensemble", "--set", "comm.inner_size=0", "--output-dir", str(tmp_path / "run"),
                           "--set", "pipeline.fail_epoch=2", "--set", "pipeline.fail_ranks=[0]"]) == 1
    assert "sagips: rank 0 failed" in capsys.readouterr().err
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith("rank 0: sagips.trainer.FaultDrill: "), info


@pytest.mark.parametrize("kind", ["data", "config", "load"])
def test_an_error_on_one_rank_only_before_training_ends_every_rank_with_one_line(tmp_path, kind):
    """A one-line error (DataError, ConfigError) in one rank's environment or config, e.g. a file missing on one
    node: every rank exits 2 with rank 0 printing the line, naming the rank; before, rank 0 waited in the next
    collective with nothing printed."""
    r = run_mpi(2, ["tests/_envfail_worker.py", kind, str(tmp_path / "run")], timeout=60)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert lines == ["sagips: error: data file /nfs/heldout.h5 is missing on this node (rank 1)"], lines


@pytest.mark.parametrize("resume", [False, True])
def test_an_ensemble_member_whose_directory_cannot_be_used_ends_the_job(tmp_path, resume):
    """Of 2 members, member000's directory holds a run (without --resume: refused) or member001's holds none (with
    --resume, as after a changed --ensemble-size): every rank exits 2 with one line; the other member used to wait in
    the next collective of the world until the job was killed."""
    out = tmp_path / "job"
    (out / "member000").mkdir(parents=True)
    (out / "member000" / "run.json").write_text(json.dumps({"status": "running", "environment": "proxy1d",
                                                            "world_size": 1, "mode": "ensemble"}))
    r = run_mpi(2, RUN + ["--mode", "ensemble", "--set", "comm.inner_size=0", "--ensemble-size", "2",
                          "--output-dir", str(out)] + (["--resume"] if resume else []), timeout=90)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert ("holds no run (no run.json)" if resume else "already holds a run") in lines[0], lines[0]


def test_an_error_in_rank_0s_end_of_run_report_ends_the_job(tmp_path):
    """The other ranks wait for rank 0's end-of-run report without a timeout (sagips/run.py, _finish): an error in it
    aborts the job, naming rank 0, instead of leaving them waiting."""
    r = run_mpi(2, ["tests/_envfail_worker.py", "report", str(tmp_path / "run")], timeout=60)
    assert r.returncode != 0 and "sagips: rank 0 failed" in r.stderr and "run.json cannot be written" in r.stderr, \
        r.stderr[-2000:]
