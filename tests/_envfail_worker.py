"""Under mpiexec (tests/test_faults.py): the proxy1d environment raises a one-line error on rank 1 only (a file that
one node lacks), the other ranks build it; then `sagips.run` as the command line runs it. argv: KIND OUT_DIR."""
import sys

from mpi4py import MPI

from sagips.config import ConfigError
from sagips.io.refdata import DataError
from sagips_environments.proxy1d import Proxy1D

kind, out_dir = sys.argv[1], sys.argv[2]
build = Proxy1D.__init__


def on_rank_1_only(self, *args, **kwargs):
    if MPI.COMM_WORLD.rank == 1:
        raise {"data": DataError, "config": ConfigError}[kind]("data file /nfs/heldout.h5 is missing on this node")
    build(self, *args, **kwargs)


Proxy1D.__init__ = on_rank_1_only
from sagips.run import main  # noqa: E402

sys.exit(main(["--config", "configs/proxy1d-quick.yaml", "--mode", "ensemble", "--epochs", "1", "--no-progress",
               "--set", "environment.reference_events=20000", "--output-dir", out_dir]))
