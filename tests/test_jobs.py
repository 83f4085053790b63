"""benchmarks/jobs.py: a study stopped with a SIGTERM (a kill, a batch system's end of job) stops its training job
too, and waits for it, so that no rank is left busy-polling the node (benchmarks/coverage.py, loop_closure.py)."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_study_stopped_by_sigterm_stops_its_job(tmp_path):
    pidfile = tmp_path / "job.pid"
    job = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    study = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from benchmarks import jobs
        with jobs.stops_on_sigterm():
            jobs.run_job(["timeout", "--kill-after=10", "120", sys.executable, "-c", {job!r}], None, {str(tmp_path)!r})
        print("not reached")
    """)
    p = subprocess.Popen([sys.executable, "-c", study], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline and p.poll() is None, "the job did not start"
            time.sleep(0.1)
        child = int(pidfile.read_text())
        assert alive(child)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 128 + signal.SIGTERM  # the study ends as a SIGTERM'd program does
        assert "not reached" not in p.stdout.read()
        deadline = time.monotonic() + 15
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the study ended but its job's process is still running"
    finally:
        if p.poll() is None:
            p.kill()
