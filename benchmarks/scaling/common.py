"""What every command of the scaling model shares: paths, the measured sizes, the validation settings, helpers.

No MPI and no torch at import. Puts the repository and benchmarks/ on sys.path, so that `import sim` (the model,
benchmarks/sim.py) works however this package was reached.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
for _p in (str(REPO), str(BENCHMARKS)):  # sagips, and sim.py (the model)
    if _p not in sys.path:
        sys.path.insert(0, _p)
SCRIPT = BENCHMARKS / "scaling_model.py"  # the dispatcher; the mpiexec workers are its hidden commands

DOCS = REPO / "docs" / "benchmarks"
MEASUREMENTS = DOCS / "scaling_measurements.json"
EXCHANGE_JSON = DOCS / "exchange.json"  # written by benchmarks/exchange.py (the comm layer's benchmark)
OUT_JSON = DOCS / "scaling_model.json"
OUT_MD = DOCS / "scaling_model.md"
FIG_TIME = DOCS / "scaling_time.png"
FIG_RATE = DOCS / "scaling_rate.png"
NOTES_MD = DOCS / "scaling_model_notes.md"  # written by hand; the page links it, no script writes it

N_WEIGHTS = 50_688          # exchanged floats: the generator's weight gradients (4x128x128 + 128x6 + 6x128)
SIZES = (16, 12_672, N_WEIGHTS)
MPI_NS = (2, 4)
BATCH = 10                  # calls timed back to back per rep
LOCAL_MPI_LATENCY_S = 1e-6  # assumed MPICH shared-memory latency; the rest of a measured hop is Python + mpi4py

# The tiny validation runs (the quick preset, shrunk): same settings for the epoch timing and every run.
VALIDATION_EPOCHS = 60
VALIDATION_SETS = [
    "train.threads=1", "environment.reference_events=100000", "environment.param_samples=16",
    "train.log_every=1000", "train.checkpoint_every=100000", "comm.outer_every=20", "comm.timeout_s=120",
]
VALIDATION_INNER = 2  # comm.inner_size (min(2, N)): N=4 poses as 2 nodes x 2 ranks
VALIDATION_CONFIG = "configs/proxy1d-quick.yaml"  # the preset every tiny run starts from
VALIDATION_TOLERANCE = 0.20  # the target: a prediction within 20% of the measured time

PAPER_GAINS = {  # the paper's measured gains from 4 to 400 ranks (Fig. 12): ~40x conventional ARAR, ~80x grouped
    "conventional ARAR (whole ring)": 40,
    "ARAR-ARAR (grouped)": 80,
    "RMA-ARAR-ARAR (grouped)": 80,
}
GROUPED_TARGET_GAIN = 90  # the target for the grouped modes from 4 to 400 ranks (conventional ARAR saturates)


def cpu_name() -> str:
    from sagips.perf import cpu_name as name  # torch is imported only here

    return name()


def cpu_capability() -> str:
    """torch's CPU kernel level on this machine (e.g. AVX2, AVX512): the vector flags the page names."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# The schedule replay: the real exchange code (sagips.comm.modes.build_exchange) between "pipelines" that SLEEP
# for a known time. A sleeping rank does not compete for the CPU, so this machine's background load (which makes
# CPU-bound training runs scatter by +-50% here) barely touches the result: it tests the model's schedule and
# synchronisation semantics against the real comm layer, straggler included.
SCHED_EPOCHS = 100
SCHED_EPOCH_S = 0.03
SCHED_CASES = {  # name: (jitter cv, straggler extra seconds per epoch on the last rank)
    "jitter 10%": (0.10, 0.0),
    "straggler +15 ms on the last rank": (0.0, 0.015),
}


def sched_compute(n_ranks: int, cv: float, seed: int = 7) -> np.ndarray:
    """(epochs, n_ranks) sleep seconds, the same in the worker and in the model."""
    rng = np.random.default_rng(seed)
    return SCHED_EPOCH_S * np.maximum(0.0, 1.0 + cv * rng.standard_normal((SCHED_EPOCHS, n_ranks)))


def sagips_run(out_dir: Path, n_ranks: int, mode: str, epochs: int, extra_sets=(), seed: int = 1234,
               timeout: int = 300) -> dict:
    """One tiny sagips.run (mpiexec for n_ranks > 1); returns the parsed run.json."""
    cmd = [sys.executable, "-m", "sagips.run", "--config", VALIDATION_CONFIG, "--mode", mode,
           "--epochs", str(epochs), "--output-dir", str(out_dir), "--overwrite", "--no-progress", "--seed", str(seed)]
    for s in [*VALIDATION_SETS, f"comm.inner_size={min(VALIDATION_INNER, n_ranks)}", *extra_sets]:
        cmd += ["--set", s]
    if n_ranks > 1:
        cmd = [mpiexec(), "-n", str(n_ranks), *cmd]
    cmd = ["timeout", str(timeout), *cmd]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return json.loads((out_dir / "run.json").read_text())


def load_json(x):
    """A parsed JSON document from a dict (returned as is), a path, or None (an empty dict)."""
    if x is None:
        return {}
    if isinstance(x, dict):
        return x
    return json.loads(Path(x).read_text())
