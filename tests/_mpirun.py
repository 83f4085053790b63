"""Launch a command under mpiexec from a single-process test, always with a timeout (a hang fails the test)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found: install the 'mpich' extra (pip install -e .[mpich])")
    return found


def child_env(extra: dict | None = None) -> dict:
    """The environment of a child run. The runs check CPU numerics against CPU truths (bit-identical resumes, DDP vs
    allreduce, eq. 7), so GPUs are hidden from them, as on CI: with CUDA visible, train.device=auto and train.amp=auto
    would pick cuda and fp16. The GPU paths have their own tests (skipped without CUDA). SAGIPS_TEST_CUDA=1 keeps the
    GPUs visible to the child runs."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    # train.amp=auto times bf16 against float32 at start-up. On a CPU with native bf16 the two can be close, and two
    # runs of one test (a resume against an uninterrupted run) may then choose differently under load. The child runs
    # check numerics, not that probe (tests/test_precision.py does, mocked): they see an AVX2-only CPU, where bf16 is
    # emulated and auto always chooses float32. SAGIPS_TEST_NATIVE_ISA=1 keeps the CPU's own kernels.
    if os.environ.get("SAGIPS_TEST_NATIVE_ISA") != "1":
        e.setdefault("ATEN_CPU_CAPABILITY", "avx2")
        e.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    if os.environ.get("SAGIPS_TEST_CUDA") != "1":
        e["CUDA_VISIBLE_DEVICES"] = ""
    e.update(extra or {})
    return e


def run_mpi(n: int, args: list[str], timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n n python <args>`; returns the completed process (stdout/stderr as text)."""
    e = child_env(env)
    cmd = [mpiexec(), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"mpiexec -n {n} {' '.join(args)} did not finish within {timeout} s "
                             f"(stderr tail: {(exc.stderr or b'')[-2000:]!r})") from None


def run_py(args: list[str], timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    e = child_env(env)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def job_with_state(n: int, args: list[str], out, min_epoch: int = 2, timeout: float = 150):
    """Start `mpiexec -n n python <args>` in its own session and yield the Popen once out/state/latest.json names an
    epoch >= min_epoch. On exit, whatever is left of the job is killed (no test leaves processes behind)."""
    from sagips.io.state import read_latest

    e = child_env({"OMP_NUM_THREADS": "1"})
    p = subprocess.Popen([mpiexec(), "-n", str(n), sys.executable, *args], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not (read_latest(out) or {}).get("epoch", 0) >= min_epoch:
            assert p.poll() is None, f"the run ended before a state existed: {p.stderr.read()[-2000:]}"
            assert time.time() - t0 < timeout, "no state written in time"
            time.sleep(0.05)
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
