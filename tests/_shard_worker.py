"""Under mpiexec (tests/test_shard.py): load this rank's subset of a data file the way sagips.run does, counting the
rows that h5py reads, and write OUT/rank{R}.json. argv: FILE FRACTION MODE OUT [FAIL_RANK]."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from sagips.io import shard
from sagips.io.refdata import DataError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests._h5count import count_reads  # noqa: E402

path, fraction, mode, out_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
fail_rank = int(sys.argv[5]) if len(sys.argv) > 5 else -1
comm = MPI.COMM_WORLD
read = count_reads("/events")
if comm.rank == fail_rank:  # the file "changes" under this rank alone: every rank must end with the error
    def changed(*a):
        raise DataError(f"data file {path}: changed since its layout was read at start-up")
    shard.read_subset = changed
try:
    np_seed = int(np.random.SeedSequence([7, 0, comm.rank]).generate_state(2, dtype=np.uint32)[1])  # rank_seeds
    arrays, layout, ranges = shard.load_subset(comm, path, {"events": 2}, np_seed, fraction, mode)
except DataError as e:
    with open(f"{out_dir}/rank{comm.rank}.json", "w") as fh:
        json.dump({"rank": comm.rank, "error": str(e)}, fh)
    sys.exit(2)
ev = arrays["events"]
with open(f"{out_dir}/rank{comm.rank}.json", "w") as fh:
    json.dump({"rank": comm.rank, "read": read["rows"], "calls": read["calls"], "kept": len(ev),
               "first": ev[:, 0].astype(float).round(6).tolist()[:3],
               "ids": ev[:, 1].astype(int).tolist()}, fh)
