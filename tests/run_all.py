"""The whole test suite, as `make test` runs it (under 10 minutes on 2 cores).

1. single-process tests: `pytest tests`, split by file into SHARDS pytest processes that run side by side (some tests
   launch small runs under mpiexec, always with a timeout; a serial suite left one of 2 cores idle ~40 % of the
   time). The files are dealt longest first to the least loaded shard, by their seconds in tests/durations.json
   (`python tests/run_all.py --weigh` measures them again; a file not in it counts as the median file);
2. the MPI unit tests in tests/mpi under `mpiexec -n N pytest --with-mpi` for several N, each with a timeout, so
   that a hang fails the suite instead of eating the CI budget. They start as soon as the first shard ends, beside
   the shards still running (the core it held would otherwise idle while the longest shard finishes).

SAGIPS_TEST_SHARDS=1 runs the single-process tests in one process, as a plain `pytest tests` would.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests._mpirun import ROOT, child_env, mpiexec

MPI_SIZES = [int(n) for n in os.environ.get("SAGIPS_TEST_MPI_SIZES", "1 2 3 4").split()]
MPI_TIMEOUT = 300
WEIGHTS = ROOT / "tests" / "durations.json"
MPI_KEY = "tests/mpi"  # (in WEIGHTS: the seconds of the MPI unit tests, all sizes)


def deal(files: list[str], n: int, weights: dict[str, float], after_one: float = 0.0) -> list[list[str]]:
    """Files into n shards of about equal seconds: longest first, each to the shard with the fewest so far.
    after_one: the seconds of what runs after the first shard to end (the MPI unit tests), counted in one shard's
    load, so that it ends that much earlier."""
    test_files = {f: w for f, w in weights.items() if f.endswith(".py")}
    default = statistics.median(test_files.values()) if test_files else 1.0
    shards, load = [[] for _ in range(n)], [after_one if n > 1 else 0.0] + [0.0] * (n - 1)
    for f in sorted(files, key=lambda f: (-weights.get(f, default), f)):
        i = load.index(min(load))
        shards[i].append(f)
        load[i] += weights.get(f, default)
    return [sorted(s) for s in shards if s]


def seconds_per_file(junit: Path) -> dict[str, float]:
    """{tests/test_x.py: seconds} from a pytest --junitxml report (classname tests.test_x[.Class])."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        if len(parts) >= 2:
            f = f"{parts[0]}/{parts[1]}.py"
            out[f] = out.get(f, 0.0) + float(case.get("time", 0.0))
    return out


def _relay(stream, prefix: str) -> None:
    """Copy a shard's output, each line prefixed. If our stdout goes away (a closed pipe), keep draining the shard's
    pipe: a full pipe would block the shard, and the suite with it."""
    out = True
    for line in stream:
        if out:
            try:
                sys.stdout.write(prefix + line + ("" if line.endswith("\n") else "\n"))
                sys.stdout.flush()
            except (OSError, ValueError):
                out = False


def single_process_tests(env: dict, n_shards: int, weigh: bool, when_one_ends=None) -> bool:
    """The shards side by side; `when_one_ends()` runs once, as soon as the first shard has ended (the others go on)."""
    tests = ROOT / "tests"
    files = sorted(str(p.relative_to(ROOT)) for p in tests.rglob("test_*.py") if (tests / "mpi") not in p.parents)
    weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
    mpi_s = weights.get(MPI_KEY, 0.0) if when_one_ends is not None else 0.0
    shards = deal(files, n_shards, weights, after_one=mpi_s)
    tmp = Path(tempfile.mkdtemp(prefix="sagips-tests-"))
    procs, relays = [], []
    for i, shard in enumerate(shards):
        prefix = f"[{i + 1}/{len(shards)}] " if len(shards) > 1 else ""
        cmd = [sys.executable, "-m", "pytest", "-q", "--timeout=600", "--durations=10", "-p", "no:cacheprovider",
               f"--basetemp={tmp / f'shard{i}'}", f"--junitxml={tmp / f'shard{i}.xml'}", *shard]
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             encoding="utf-8", errors="replace")
        t = threading.Thread(target=_relay, args=(p.stdout, prefix), daemon=True)
        t.start()
        procs.append(p)
        relays.append(t)
    while when_one_ends is not None and all(p.poll() is None for p in procs):
        time.sleep(0.5)
    if when_one_ends is not None:
        t = time.time()
        when_one_ends()
        mpi_s = time.time() - t
    ok = True
    for p, t in zip(procs, relays):
        ok &= p.wait() == 0
        t.join()
    if weigh and not ok:
        print(f"not weighed: a shard failed ({WEIGHTS.relative_to(ROOT)} is unchanged)", flush=True)
    elif weigh:
        got: dict[str, float] = {}
        for i in range(len(shards)):
            if (tmp / f"shard{i}.xml").exists():
                got.update(seconds_per_file(tmp / f"shard{i}.xml"))
        got = {**{f: w for f, w in weights.items() if f in files}, **got, MPI_KEY: mpi_s}
        WEIGHTS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(got.items())}, indent=1) + "\n")
        print(f"wrote {WEIGHTS.relative_to(ROOT)}: {len(got)} files, {sum(got.values()):.0f} s in all", flush=True)
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"the failed tests' files are kept in {tmp}", flush=True)
    return ok


def mpi_tests() -> list[str]:
    """tests/mpi under mpiexec -n N for each N of MPI_SIZES, one after the other; the failures, named. Their output
    is prefixed `[mpi N] `: it runs beside a shard's."""
    failed = []
    if not any((ROOT / "tests" / "mpi").glob("test_*.py")):
        return failed
    for n in MPI_SIZES:
        cmd = ["timeout", "--kill-after=10", str(MPI_TIMEOUT), mpiexec(), "-n", str(n), sys.executable, "-m",
               "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "tests/mpi"]
        p = subprocess.Popen(cmd, cwd=ROOT, env=child_env({"PYTHONUNBUFFERED": "1"}),  # CPU numerics
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8", errors="replace")
        _relay(p.stdout, f"[mpi {n}] ")
        rc = p.wait()
        if rc == 124:
            print(f"[mpi {n}] tests/mpi at N={n}: TIMED OUT after {MPI_TIMEOUT} s", flush=True)
        if rc != 0:
            failed.append(f"tests/mpi at N={n} (exit {rc})")
    return failed


def main() -> int:
    weigh = "--weigh" in sys.argv[1:]
    try:
        n_shards = max(1, int(os.environ.get("SAGIPS_TEST_SHARDS") or 2))
    except ValueError:
        print(f"SAGIPS_TEST_SHARDS={os.environ['SAGIPS_TEST_SHARDS']!r} is not a number of processes: set it to "
              f"1, 2, ...", file=sys.stderr)
        return 2
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.time()
    failed = []
    if not single_process_tests(env, n_shards, weigh, when_one_ends=lambda: failed.extend(mpi_tests())):
        failed.append("single-process tests")
    print(f"\n=== make test: {time.time() - t0:.0f} s; "
          f"{'all passed' if not failed else 'FAILED: ' + ', '.join(failed)} ===", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
