"""Ring logic without mpiexec: N threads in one process pose as N ranks of a fake communicator (queues as wires).

The real thing is tested under mpiexec in tests/mpi/test_ring.py; this one runs in the plain unit-test pass and
checks the hop/chunk bookkeeping for every N from 1 to 8, buffers shorter than N included.
"""
import collections
import queue
import threading

import numpy as np
import pytest

import sagips.comm.ring as ring_mod
from sagips.comm.ring import Ring

_LOCK = threading.Lock()  # creating a wire in the shared dict must not race


class _Req:
    def __init__(self, done=None):
        self.done = done  # None: complete; else a callable that blocks until complete

    def wait(self):
        if self.done is not None:
            self.done()
            self.done = None


class FakeComm:
    """The slice of MPI.Comm a Ring uses. Sends are buffered (copied at once), receives block on a queue."""

    def __init__(self, wires, rank, size):
        self.wires, self.rank, self.size = wires, rank, size

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank

    def _wire(self, a, b, tag):
        with _LOCK:
            return self.wires[(a, b, tag)]

    def Isend(self, buf, dest, tag):
        self._wire(self.rank, dest, tag).put(np.array(buf, copy=True))
        return _Req()

    def Irecv(self, buf, source, tag):
        def done():
            data = self._wire(source, self.rank, tag).get(timeout=10)
            assert data.shape == buf.shape, "a message of the wrong length: the ranks disagree on chunk bounds"
            buf[...] = data
        return _Req(done)


def _fake_wait_all(requests, timeout_s, what, comm, epoch, peers):
    for req in requests:
        req.wait()


def run_ring(n_ranks, inputs, algorithm, weights=None, average=True):
    wires = collections.defaultdict(queue.Queue)  # (source, dest, tag) -> FIFO, as MPI's non-overtaking rule
    outs, errors = [x.copy() for x in inputs], []

    def rank_main(r):
        try:
            ring = Ring(FakeComm(wires, r, n_ranks), inputs[r].size, algorithm)
            ring.allreduce(outs[r], average=average, weight=1.0 if weights is None else weights[r])
        except Exception as exc:  # noqa: BLE001  (any failure in a rank thread is reported below)
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n_ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return outs


@pytest.fixture(autouse=True)
def fake_waits(monkeypatch):
    monkeypatch.setattr(ring_mod, "wait_all", _fake_wait_all)


@pytest.mark.parametrize("algorithm", Ring.ALGORITHMS)
@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n", [0, 1, 3, 7, 100])
def test_fake_ring_equals_numpy(algorithm, n_ranks, n):
    rng = np.random.default_rng(n_ranks * 100 + n)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(n_ranks)]
    ref = np.sum(np.array(inputs, np.float64), axis=0)
    mag = np.sum(np.abs(np.array(inputs, np.float64)), axis=0)
    for average in (True, False):
        outs = run_ring(n_ranks, inputs, algorithm, average=average)
        expected = ref / n_ranks if average else ref
        scale = mag / n_ranks if average else mag
        for out in outs:
            assert np.all(np.abs(out - expected) <= 1e-5 * scale + 1e-30)
            assert out.tobytes() == outs[0].tobytes()  # bit-identical on every rank


@pytest.mark.parametrize("algorithm", Ring.ALGORITHMS)
def test_fake_weighted_ring(algorithm):
    """Leaders of groups of sizes 3, 3, 2 contributing their group means give the mean over all 8 members."""
    rng = np.random.default_rng(7)
    members = [rng.standard_normal(50).astype(np.float32) for _ in range(8)]
    groups = [members[0:3], members[3:6], members[6:8]]
    means = [np.mean(g, axis=0, dtype=np.float32) for g in groups]
    outs = run_ring(3, means, algorithm, weights=[3.0, 3.0, 2.0])
    assert np.allclose(outs[0], np.mean(members, axis=0), rtol=1e-5, atol=1e-6)
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
