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


# The end of a run: rank 0 has ended its 4 epochs and waits in the stop agreement for rank 1, which lags (as
# rma-arar-arar lets it) by `lag` s an epoch; or rank 1 stops answering in its epoch 2. A gather of rank 1's quality
# to rank 0 then names rank 1, the rank waited for, not rank 0 itself.
END = """
import sys, time
import sagips.comm
from mpi4py import MPI
from sagips.comm import watchdog
from sagips.comm.stop import StopAgreement

lag, hang, timeout_s = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
comm = MPI.COMM_WORLD
stop = StopAgreement(comm, timeout_s, syncs=lambda epoch: False)  # (no epoch waits for the others)
for epoch in range(1, 5):
    if comm.rank == 1:
        time.sleep(60 if epoch == hang else lag)
    stop.after_epoch(epoch, False)
stop.finish(4)
if comm.rank == 1:
    time.sleep(2 * timeout_s)
watchdog.gather_json(comm, {"rank": comm.rank}, 0, timeout_s=timeout_s, what="quality gather", epoch=4)
print(f"rank {comm.rank} done", flush=True)
"""


def _run_end(tmp_path, lag, hang):
    script = tmp_path / "end.py"
    script.write_text(END)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = ["timeout", "90", _mpiexec(), "-n", "2", sys.executable, str(script), str(lag), str(hang), str(TIMEOUT_S)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec")
def test_a_straggler_that_still_trains_is_waited_for_at_the_end_and_a_gather_names_whom_it_waits_for(tmp_path):
    """Rank 1 ends its epochs 2 s apart, 8 s after rank 0, under a 3-s watchdog: the stop agreement's end waits (it
    aborted the job before); rank 0 then waits in the quality gather for rank 1, and names it."""
    proc = _run_end(tmp_path, 2.0, 0)
    assert proc.returncode not in (0, 124), proc.stderr
    assert "stop agreement" not in proc.stderr, proc.stderr
    assert "sagips: rank 0 waited" in proc.stderr and "in quality gather (epoch 4) for rank 1; aborting" in proc.stderr


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec")
def test_a_rank_that_stops_answering_is_not_waited_for_at_the_end(tmp_path):
    proc = _run_end(tmp_path, 0.0, 2)
    assert proc.returncode not in (0, 124), proc.stderr
    assert "sagips: rank 0 waited" in proc.stderr and "in stop agreement (epoch 4) for rank 1; aborting" in proc.stderr
