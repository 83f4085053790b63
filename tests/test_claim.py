"""One job per output directory (sagips/io/claim.py): a second job into a directory in use is refused in one line
before it writes anything, and a lock never outlives its process (a killed job's --resume is not blocked).

Seen before the lock (a new user's trial): two jobs into one directory both ran and exited 0, metrics.jsonl held
epoch 1 twice with its times going backwards, and run.json and the states were whichever job wrote last.
"""
import errno
import os
import subprocess
import sys

import pytest

from sagips.config import ConfigError
from sagips.io import claim
from sagips.io.metrics import read_metrics
from tests._mpirun import ROOT, child_env, job_with_state, run_mpi
from tests.test_resume import ARGS, EPOCHS
from tests.test_sigterm import SLOW

HOLD = """
import sys, time
from sagips.io.claim import claim, stamp
claim(sys.argv[1])
stamp()
print("held", flush=True)
time.sleep(60)
"""


def claim_in_child(path) -> subprocess.Popen:
    """Another process that holds the lock of `path` (until it is killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=ROOT, env=child_env(None),
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_directory_held_by_another_process_is_refused_until_that_process_ends(tmp_path):
    out = tmp_path / "new" / "run"  # (created by the claim)
    p = claim_in_child(out)
    try:
        with pytest.raises(ConfigError) as e:
            claim.claim(str(out))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"output directory {out} is in use by another job (pid {p.pid} on ")
        assert msg.endswith("wait until it ends, or choose another --output-dir")
    finally:
        p.kill()
        p.wait()
    claim.claim(str(out))  # the kernel dropped the dead process's lock: no stale lock
    try:
        claim.claim(str(out))  # this process holds it already: no conflict with itself (in-process runs)
        claim.stamp()
        assert open(out / claim.LOCK_NAME).read().startswith(f"pid {os.getpid()} on ")
    finally:
        claim.release_all()
    p = claim_in_child(out)  # released: another process may take it
    p.kill()
    p.wait()


def test_an_in_process_run_releases_its_directory_and_a_new_holder_is_not_named_by_an_old_line(tmp_path):
    from sagips.run import main
    from tests.test_bad_input import TINY

    out = tmp_path / "run"
    assert main(TINY + ["--output-dir", str(out)]) == 0
    assert claim._held == {}  # main() released it (a Python session or a test that calls main() again)
    assert (out / claim.LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")  # its stamp stays behind
    code = "import sys, time\nfrom sagips.io.claim import claim\nclaim(sys.argv[1])\nprint('held', flush=True)\n" \
           "time.sleep(60)\n"  # a new holder that has not stamped yet (still starting)
    q = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, env=child_env(None),
                         stdout=subprocess.PIPE, text=True)
    try:
        assert q.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=r"is in use by another job \(still starting\)"):
            claim.claim(str(out))  # not the ended run's pid, left in the file
    finally:
        q.kill()
        q.wait()


def test_a_directory_that_cannot_be_written_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    # (root writes into a directory without write permission: it gets a read-only file system's refusal instead)
    target = "/sys/sagips-run" if os.geteuid() == 0 else str(ro / "run")
    try:
        with pytest.raises(ConfigError) as e:
            claim.claim(target)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"--output-dir {target}: cannot write there (")
        assert msg.endswith("); choose another --output-dir") and claim._held == {}
    finally:
        ro.chmod(0o755)


def test_a_file_system_without_flock_runs_without_the_lock(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(claim.fcntl, "flock", no_flock)
    claim.claim(str(tmp_path / "run"))
    assert claim._held == {}


def test_a_second_job_into_a_running_jobs_directory_is_refused_and_the_first_completes(tmp_path):
    out = tmp_path / "run"
    first = [*ARGS, "--mode", "ensemble", "--output-dir", str(out), *SLOW]
    with job_with_state(2, first, out, min_epoch=2) as p:
        # --overwrite would have deleted the running job's files: refused before anything is written
        r = run_mpi(2, [*ARGS, "--mode", "ensemble", "--output-dir", str(out), "--overwrite", "--seed", "99"],
                    timeout=120)
        assert r.returncode == 2, r.stderr[-2000:]
        lines = [x for x in r.stderr.splitlines() if x.startswith("sagips: error:")]
        assert len(lines) == 1 and f"output directory {out} is in use by another job (pid " in lines[0], r.stderr
        r = run_mpi(2, ["-m", "sagips.run", "--resume", "--output-dir", str(out), "--no-progress"], timeout=120)
        assert r.returncode == 2 and "is in use by another job" in r.stderr, r.stderr[-2000:]
        so, se = p.communicate(timeout=120)
        assert p.returncode == 0, se[-2000:]
    assert [m["epoch"] for m in read_metrics(out / "metrics.jsonl")] == list(range(1, EPOCHS + 1))


def test_an_ensemble_job_locks_its_directory_and_each_members(tmp_path):
    out = tmp_path / "job"  # (a new job's directory: its member's claim creates it, then the job claims it)
    slow = ["--set", "pipeline.delay_s=3", "--set", "pipeline.delay_ranks=[0]"]  # (each member: one rank; 24 s)
    first = [*ARGS, "--mode", "ensemble", "--ensemble-size", "2", "--output-dir", str(out), *slow]
    with job_with_state(2, first, out / "member000", min_epoch=2) as p:
        for target in (out, out / "member001"):  # a plain run into the job's directory, or into a member's
            r = run_mpi(1, [*ARGS, "--mode", "ensemble", "--output-dir", str(target), "--overwrite"], timeout=120)
            assert r.returncode == 2 and f"output directory {target} is in use by another job (pid " in r.stderr, \
                r.stderr[-2000:]
        assert p.poll() is None  # the job was running throughout (the context kills it)
