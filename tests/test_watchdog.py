"""The watchdog turns a hang into an abort that names the waiting rank, the exchange, the epoch and the peer.

A single-process pytest test that SHELLS OUT to mpiexec (the one next to sys.executable, i.e. the venv's MPICH):
    .venv/bin/python -m pytest -q tests/test_watchdog.py
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3.0

# Rank `sleeper` stops answering (its pipeline hangs) while the others wait for it in a ring over their group.
JOB = """
import sys, time
import sagips.comm
from mpi4py import MPI
import numpy as np
from sagips.comm.ring import Ring
from sagips.comm.topology import build_topology

inner_size, sleeper, timeout_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
topo = build_topology(MPI.COMM_WORLD, inner_size)
ring = Ring(topo.inner, 1000, "whole", timeout_s=timeout_s, name="inner ring")
x = np.ones(1000, np.float32)
ring.allreduce(x, epoch=6)                 # everybody on time
if MPI.COMM_WORLD.Get_rank() == sleeper:
    time.sleep(60)                         # hangs in its pipeline, not in MPI
ring.allreduce(x, epoch=7)
"""


def _mpiexec():
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize("n_ranks, inner_size, sleeper, waiter", [(2, 2, 1, 0), (4, 2, 3, 2)],
                         ids=["world-of-2", "inner-group-of-ranks-2-3"])
def test_watchdog_aborts_and_names_the_ranks(tmp_path, n_ranks, inner_size, sleeper, waiter):
    script = tmp_path / "hang.py"
    script.write_text(JOB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = ["timeout", "90", _mpiexec(), "-n", str(n_ranks), sys.executable, str(script),
           str(inner_size), str(sleeper), str(TIMEOUT_S)]
    start = time.monotonic()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert proc.returncode != 124, "the job hung until `timeout` killed it: the watchdog did not fire"
    assert elapsed < TIMEOUT_S + 30
    # ranks are COMM_WORLD ranks, also when the ring runs on a sub-communicator
    line = f"sagips: rank {waiter} waited"
    assert line in proc.stderr, proc.stderr
    assert f"in inner ring (epoch 7) for rank {sleeper}; aborting the job (comm.timeout_s=3)" in proc.stderr
