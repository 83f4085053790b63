"""How a long study starts and stops its training jobs (benchmarks/coverage.py, benchmarks/loop_closure.py).

    cmd = ["timeout", "--kill-after=10", str(seconds), mpiexec, "-n", "4", ...]
    with stops_on_sigterm():            # a kill's SIGTERM unwinds the study as Ctrl-C does
        proc = run_job(cmd, env, cwd)   # the job is stopped and waited for before the study goes on unwinding

mpiexec under `timeout`: a timeout, or a SIGTERM of `timeout`, reaches mpiexec and its ranks (a SIGKILL of mpiexec
alone would leave the ranks busy-polling the node's cores).
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path


def run_job(cmd: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """Run a training job to its end (stdout and stderr captured). If the study is stopped meanwhile (Ctrl-C, a
    kill's SIGTERM under `stops_on_sigterm`), the job gets a SIGTERM, which `timeout` passes on to mpiexec and its
    ranks, and the study waits for it (60 s, then a SIGKILL) before it unwinds further."""
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate()
        except BaseException:
            p.terminate()
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _stop(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def stops_on_sigterm():
    """Inside: a SIGTERM raises SystemExit(143), which unwinds through `run_job` (its job stopped) and the study's
    own cleanup, as Ctrl-C does."""
    before = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
