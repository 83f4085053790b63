"""The whole test suite, as `make test` runs it (under 10 minutes on 2 cores).

1. single-process tests: `pytest tests` (some of them launch small runs under mpiexec, always with a timeout);
2. the MPI unit tests in tests/mpi under `mpiexec -n N pytest --with-mpi` for several N, each with a timeout, so
   that a hang fails the suite instead of eating the CI budget.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests._mpirun import ROOT, child_env, mpiexec

MPI_SIZES = [int(n) for n in os.environ.get("SAGIPS_TEST_MPI_SIZES", "1 2 3 4").split()]
MPI_TIMEOUT = 300


def main() -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.time()
    failed = []
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "--timeout=600", "--durations=15", "tests",
                          "--ignore=tests/mpi"],
                         cwd=ROOT, env=env)
    if rc != 0:
        failed.append("single-process tests")
    mpi_dir = ROOT / "tests" / "mpi"
    if any(mpi_dir.glob("test_*.py")):
        for n in MPI_SIZES:
            print(f"\n=== tests/mpi under mpiexec -n {n} ===", flush=True)
            cmd = ["timeout", "--kill-after=10", str(MPI_TIMEOUT), mpiexec(), "-n", str(n), sys.executable, "-m",
                   "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "tests/mpi"]
            rc = subprocess.call(cmd, cwd=ROOT, env=child_env({"PYTHONUNBUFFERED": "1"}))  # CPU numerics
            if rc == 124:
                print(f"tests/mpi at N={n}: TIMED OUT after {MPI_TIMEOUT} s", flush=True)
            if rc != 0:
                failed.append(f"tests/mpi at N={n} (exit {rc})")
    print(f"\n=== make test: {time.time() - t0:.0f} s; "
          f"{'all passed' if not failed else 'FAILED: ' + ', '.join(failed)} ===", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
