"""Launch a command under mpiexec from a single-process test, always with a timeout (a hang fails the test)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found: install the 'mpich' extra (pip install -e .[mpich])")
    return found


def run_mpi(n: int, args: list[str], timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n n python <args>`; returns the completed process (stdout/stderr as text)."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(env or {})
    cmd = [mpiexec(), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"mpiexec -n {n} {' '.join(args)} did not finish within {timeout} s "
                             f"(stderr tail: {(exc.stderr or b'')[-2000:]!r})") from None


def run_py(args: list[str], timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
