"""Under mpiexec (tests/test_precision.py): train.amp=auto on a CPU said to have native bf16, whose probe, mocked,
says float32 on the job's rank 0 and bf16 on every other rank (as a timing probe can around its threshold); then
`sagips.run` trains 2 members of 1 rank (--ensemble-size 2). argv: OUT_DIR."""
import sys

from mpi4py import MPI

from sagips import precision

RATIO = 2.0 if MPI.COMM_WORLD.rank == 0 else 0.5  # bf16 time / float32 time (auto takes bf16 at <= 0.9)
resolve = precision.resolve


def probe(D, device, rows, chunk_rows=None):
    return {"rows": rows, "fp32_ms": 1.0, "bf16_ms": RATIO, "bf16_ratio": RATIO}


precision.cpu_native_bf16 = lambda: True
precision.cpu_capability = lambda: "AVX512"
precision.resolve = lambda mode, device, D=None, rows=2048, _probe=None, chunk_rows=None: resolve(
    mode, device, D, rows, _probe=probe, chunk_rows=chunk_rows)

from sagips.run import main  # noqa: E402

sys.exit(main(["--config", "configs/proxy1d-quick.yaml", "--mode", "ensemble", "--ensemble-size", "2",
               "--epochs", "2", "--output-dir", sys.argv[1], "--no-progress", "--set", "train.amp=auto",
               "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
               "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=16",
               "--set", "train.checkpoint_every=1"]))
