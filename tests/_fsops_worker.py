"""Counts this rank's file-system operations inside a run's output directory (tests/test_fsops.py).

    mpiexec -n N python tests/_fsops_worker.py OUT_DIR [sagips.run args ...]

Runs `sagips.run` twice in this process (a fresh run, then `--resume` of it for more epochs) with `open`, `os.open`,
`os.listdir` and `os.scandir` wrapped; writes {"fresh": {...}, "resume": {...}} to OUT_DIR/../fsops/rankR.json.
"""
import builtins
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
out = os.path.abspath(sys.argv[1])
args = sys.argv[2:]
counts = {"listings": 0, "opens": 0}


def inside(path) -> bool:
    try:
        return os.path.abspath(os.fsdecode(path)).startswith(out)
    except TypeError:  # a file descriptor
        return False


def counting(fn, kind):
    def wrapper(path=".", *a, **k):
        if inside(path):
            counts[kind] += 1
        return fn(path, *a, **k)
    return wrapper


builtins.open = io.open = counting(builtins.open, "opens")
os.open = counting(os.open, "opens")
os.listdir = counting(os.listdir, "listings")
os.scandir = counting(os.scandir, "listings")

from mpi4py import MPI  # noqa: E402

from sagips.run import main  # noqa: E402

rank = MPI.COMM_WORLD.rank
result = {}
for phase, extra in (("fresh", ["--epochs", "4", "--overwrite"]), ("resume", ["--epochs", "6", "--resume"])):
    counts.update(listings=0, opens=0)
    rc = main([*args, "--output-dir", out, *extra])
    result[phase] = dict(counts, rc=rc)
d = Path(out).parent / "fsops"
d.mkdir(exist_ok=True)
(d / f"rank{rank}.json").write_text(json.dumps(result))
