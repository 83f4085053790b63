"""Under mpiexec (tests/test_faults.py): a one-line error on rank 1 only (a file that one node lacks), the other
ranks go on; then `sagips.run` runs. argv: KIND OUT_DIR. KIND data/config: the proxy1d environment's construction
raises DataError/ConfigError; load: the config's loading raises ConfigError; report: rank 0's end-of-run report
(after training, while the others wait for it) raises DataError."""
import sys

from mpi4py import MPI

from sagips.config import ConfigError
from sagips.io.refdata import DataError
from sagips_environments.proxy1d import Proxy1D

kind, out_dir = sys.argv[1], sys.argv[2]
build = Proxy1D.__init__


def on_rank_1_only(self, *args, **kwargs):
    if MPI.COMM_WORLD.rank == 1:
        raise {"data": DataError}.get(kind, ConfigError)("data file /nfs/heldout.h5 is missing on this node")
    build(self, *args, **kwargs)


Proxy1D.__init__ = on_rank_1_only
import sagips.run  # noqa: E402
from sagips.run import main  # noqa: E402

if kind == "load":
    Proxy1D.__init__ = build
    load = sagips.run.load

    def load_on_rank_1_only(*args, **kwargs):
        if MPI.COMM_WORLD.rank == 1:
            raise ConfigError("data file /nfs/heldout.h5 is missing on this node")
        return load(*args, **kwargs)

    sagips.run.load = load_on_rank_1_only
if kind == "report":
    Proxy1D.__init__ = build

    def report_fails(*args, **kwargs):
        raise DataError("run.json cannot be written")

    sagips.run._report = report_fails

sys.exit(main(["--config", "configs/proxy1d-quick.yaml", "--mode", "ensemble", "--epochs", "1", "--no-progress",
               "--set", "environment.reference_events=20000", "--output-dir", out_dir]))
