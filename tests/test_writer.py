"""Writing big reference files (issue 23, item 4): blocks with their own seeds, bounded memory, one part per rank.

`sagips.run` training 2 ranks on a file written this way (a virtual dataset): tests/test_data_scale.py.

The truth is built here block by block from `Proxy1D.generate_reference` (the environment's own sampler) with
SeedSequence seeds; the writer must give exactly those rows however it batches them and however many ranks write.
"""
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from sagips.config import build_config
from sagips.io import shard, writer
from sagips.io.refdata import DataError, write_reference
from sagips_environments.proxy1d import Proxy1D
from tests._mpirun import run_mpi

B = writer.STREAM_BLOCK_ROWS
N = 3 * B + 1000  # 4 blocks, the last one short
SEED = 7


def _truth(n=N, seed=SEED):
    cfg = build_config({"environment": {"name": "proxy1d"}}).environment
    starts = range(0, n, B)
    rows = [Proxy1D.generate_reference(cfg, int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint32)[0]),
                                       n_events=min(B, n - s))[0]["events"] for i, s in enumerate(starts)]
    return np.concatenate(rows), Proxy1D.generate_reference(cfg, 0, n_events=1)[1], cfg


@pytest.fixture(scope="module")
def truth():
    return _truth()


@pytest.fixture(scope="module")
def two_rank_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("vds") / "set" / "ref.h5"
    r = run_mpi(2, ["-m", "sagips.data", "proxy1d", "--events", f"{N / 1e5}e5", "--seed", str(SEED),
                    "--out", str(out)], timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "%|" not in r.stderr  # no progress bar when stderr is not a terminal
    return out


def test_streamed_file_is_the_same_in_any_batches_and_written_whole(truth, tmp_path):
    events, attrs, cfg = truth
    whole = tmp_path / "whole.h5"
    write_reference(whole, {"events": events}, attrs)
    for batch in (1, 3):
        path = tmp_path / f"b{batch}.h5"
        assert writer.write_stream(path, Proxy1D, cfg, SEED, N, batch=batch) == [str(path)]
        with h5py.File(path) as f, h5py.File(whole) as g:
            assert np.array_equal(f["events"][:], g["events"][:])
            assert f["events"].chunks == (2048, 2) and f.attrs["chunk_rows"] == 2048  # 2^11 <= N / 64 < 2^12
            assert np.array_equal(f.attrs["norms"], attrs["norms"])
            assert np.array_equal(f.attrs["true_params"], attrs["true_params"])
        assert shard.block_rows(shard.read_layout(path, {"events": 2})) == 2048  # training reads whole chunks
    other = tmp_path / "other.h5"
    writer.write_stream(other, Proxy1D, cfg, SEED + 1, N)
    with h5py.File(other) as f:
        assert not np.array_equal(f["events"][:B], events[:B])


def test_chunk_rows_suit_the_block_reads():
    assert writer.chunk_rows(10**10) == shard.MAX_BLOCK_ROWS == 65536  # 0.5 MB reads at 2 columns
    assert writer.chunk_rows(10**6) == 8192 and writer.chunk_rows(100) == 1 and writer.chunk_rows(1) == 1
    for n in (10**5, 10**6, 10**9):
        assert writer.STREAM_BLOCK_ROWS % writer.chunk_rows(n) == 0  # no chunk straddles two part files


def test_two_ranks_write_the_same_events_as_a_virtual_dataset(two_rank_file, truth, tmp_path):
    events = truth[0]
    parts = sorted(p.name for p in two_rank_file.parent.glob("ref.part*.h5"))
    assert parts == ["ref.part0000-of-0002.h5", "ref.part0001-of-0002.h5"]
    moved = tmp_path / "moved"  # relative part names: the set can be moved together
    shutil.copytree(two_rank_file.parent, moved)
    path = moved / "ref.h5"
    with h5py.File(path) as f:
        assert f["events"].is_virtual and np.array_equal(f["events"][:], events)
        assert f.attrs["chunk_rows"] == 2048 and list(f.attrs["parts"]) == parts
    layout = shard.read_layout(path, {"events": 2})
    assert layout["datasets"]["events"]["chunk_rows"] == 2048 and shard.block_rows(layout) == 2048
    ranges = shard.subset_ranges(3, layout, 0.5, "blocks")
    got = shard.read_subset(str(path), layout, ranges, {"events": 2})["events"]
    assert np.array_equal(got, np.concatenate([events[a:b] for a, b in ranges]))
    shutil.copy(moved / parts[0], moved / "tmp.h5")  # a part rewritten after the layout: the main file is unchanged
    os.replace(moved / "tmp.h5", moved / parts[0])
    os.utime(moved / parts[0], ns=(layout["stat"][1][2] + 10**9,) * 2)  # (coarse file-system times)
    with pytest.raises(DataError, match=f"changed since its layout was read at start-up \\({parts[0]} was rewritten"):
        shard.read_subset(str(path), layout, ranges, {"events": 2})
    os.unlink(moved / parts[1])  # HDF5 would read its rows as the fill value
    with pytest.raises(DataError, match=f"part file {parts[1]} of dataset 'events' is missing") as e:
        shard.read_layout(path, {"events": 2})
    assert "\n" not in str(e.value)


class _ThreadComm:
    """Threads posing as ranks: the allgather and bcast that write_stream uses (mpiexec runs the real thing in
    two_rank_file)."""

    def __init__(self, rank, size, slots, barrier):
        self.rank, self.size, self._slots, self._barrier = rank, size, slots, barrier

    def allgather(self, obj):
        self._slots[self.rank] = obj
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out

    def bcast(self, obj, root=0):
        return self.allgather(obj)[root]


def test_a_failed_rank_ends_every_writer_and_leaves_no_file(tmp_path, truth):
    import threading

    out = tmp_path / "ref.h5"
    (tmp_path / "ref.part0001-of-0002.h5").mkdir()  # rank 1 cannot rename its part into place
    slots, barrier, errors = [None, None], threading.Barrier(2, timeout=60), [None, None]

    def rank(r):
        try:
            writer.write_stream(out, Proxy1D, truth[2], SEED, 200_000, comm=_ThreadComm(r, 2, slots, barrier))
        except Exception as e:
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert isinstance(errors[1], OSError)  # the failing rank raises its own error
    assert isinstance(errors[0], DataError) and "(rank 1)" in str(errors[0]) and "\n" not in str(errors[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.part0001-of-0002.h5"]  # rank 0 removed its part


def test_more_ranks_than_blocks(tmp_path):
    import threading

    n, size = B + 10, 3  # 2 blocks, 3 ranks: rank 0 writes no part, yet the virtual file holds every row
    events, _, cfg = _truth(n)
    out = tmp_path / "ref.h5"
    slots, barrier, files = [None] * size, threading.Barrier(size, timeout=60), [None] * size

    def rank(r):
        files[r] = writer.write_stream(out, Proxy1D, cfg, SEED, n, comm=_ThreadComm(r, size, slots, barrier))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert files[0] == [str(out)] and [len(f) for f in files[1:]] == [1, 1]
    with h5py.File(out) as f:
        assert np.array_equal(f["events"][:], events) and len(f.attrs["parts"]) == 2


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch, truth):
    real = writer.generate_block

    def fail_at_block_2(env_cls, cfg, seed, n, block):
        if block == 2:
            raise KeyboardInterrupt
        return real(env_cls, cfg, seed, n, block)

    monkeypatch.setattr(writer, "generate_block", fail_at_block_2)
    with pytest.raises(KeyboardInterrupt):
        writer.write_stream(tmp_path / "ref.h5", Proxy1D, truth[2], SEED, N, batch=1)
    assert list(tmp_path.iterdir()) == []


def test_events_accept_1e9_style_counts():
    from sagips.data import count

    assert count("1e9") == 10**9 and count("1_000_000") == 10**6 and count("2.5e5") == 250000
    for bad in ("1.5", "many"):
        with pytest.raises(Exception, match="not a whole number"):
            count(bad)


def test_memory_does_not_grow_with_events(tmp_path, truth):
    """tracemalloc sees every numpy array (the blocks, the batches, a whole-file array); torch's work inside a block
    is bounded by the block's rows by construction."""
    import tracemalloc

    writer.write_stream(tmp_path / "m.h5", Proxy1D, truth[2], 1, 1000)  # first-time imports are not the writer's
    peaks = []
    for n, batch in ((300_000, 2), (900_000, 2), (900_000, 10**6)):  # the last: the whole file in one batch
        tracemalloc.start()
        writer.write_stream(tmp_path / "m.h5", Proxy1D, truth[2], 1, n, batch=batch)
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
    small, big, whole = peaks
    assert abs(big - small) < 0.25 and small < 4  # MB: 2 blocks of 0.5 MB, twice (the blocks and their batch)
    assert whole - big > 6  # a whole-file array (7.2 MB of float32 events) is seen: the check can fail



def test_generated_subset_is_the_written_files_rows(truth, tmp_path, monkeypatch):
    """Without a file a rank generates its subset of the file that the seed would give (sagips.run, issue 23): the
    same layout, the same ranges and the same rows as a read of the written file, from only the blocks it needs."""
    events, _, cfg = truth
    path = tmp_path / "f.h5"
    writer.write_stream(path, Proxy1D, cfg, SEED, N)
    on_disk = shard.read_layout(path, {"events": 2})
    virtual = writer.virtual_layout(Proxy1D, cfg, SEED, N)
    assert virtual["checksum"] == on_disk["checksum"] and virtual["rows"] == N
    for mode in ("blocks", "rows"):
        for np_seed in (0, 5):
            ranges = shard.subset_ranges(np_seed, virtual, 0.5, mode)
            assert np.array_equal(ranges, shard.subset_ranges(np_seed, on_disk, 0.5, mode))
            made, attrs = writer.generate_subset(Proxy1D, cfg, SEED, N, ranges)
            read = shard.read_subset(str(path), on_disk, ranges, {"events": 2})
            assert np.array_equal(made["events"], read["events"]) and len(made["events"]) == N // 2
            assert np.array_equal(attrs["norms"], on_disk["attrs"]["norms"])
    made_blocks = []
    real = writer.generate_block
    monkeypatch.setattr(writer, "generate_block", lambda *a: made_blocks.append(a[-1]) or real(*a))
    ranges = np.array([[10, 20], [B - 3, B + 3], [3 * B + 5, 3 * B + 6]])  # one range straddles blocks 0 and 1
    made, _ = writer.generate_subset(Proxy1D, cfg, SEED, N, ranges)
    assert made_blocks == [0, 1, 3]  # block 2 holds none of the rows: not generated
    assert np.array_equal(made["events"], np.concatenate([events[a:b] for a, b in ranges]))
    window = np.full((len(made["events"]) + 4, 2), -1.0, np.float32)  # filled in place (a node's shared window)
    got, _ = writer.generate_subset(Proxy1D, cfg, SEED, N, ranges, out={"events": window[2:-2]})
    assert np.shares_memory(got["events"], window) and np.array_equal(window[2:-2], made["events"])
    assert (window[:2] == -1).all() and (window[-2:] == -1).all()
    with pytest.raises(ValueError, match="out must hold 17 rows"):
        writer.generate_subset(Proxy1D, cfg, SEED, N, ranges, out={"events": window})
    with pytest.raises(ValueError, match="sorted, disjoint"):
        writer.generate_subset(Proxy1D, cfg, SEED, N, ranges[::-1])


def test_a_run_without_a_file_trains_on_the_written_files_rows(tmp_path):
    """The same seed, events and truth: a run that generates its data and one that reads the file `sagips.data`
    wrote end with bit-identical networks (so they trained on the same rows), and neither holds more rows; the same
    with data.share=node on 2 ranks (one node's window)."""
    path = tmp_path / "ref.h5"
    r = run_mpi(1, ["-m", "sagips.data", "proxy1d", "--events", "30000", "--seed", "11", "--out", str(path)],
                timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    base = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--mode", "ensemble", "--no-progress",
            "--epochs", "2", "--set", "seed=11", "--set", "environment.reference_events=30000",
            "--set", "environment.param_samples=8", "--set", "environment.events_per_sample=20",
            "--set", "train.quality_samples=8", "--set", "train.checkpoint_every=2"]
    outs = {}
    for name, extra in (("made", []), ("read", ["--set", f"environment.data_file={path}"])):
        outs[name] = tmp_path / name
        r = run_mpi(1, [*base, *extra, "--output-dir", str(outs[name])], timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
    import torch

    from sagips.io.checkpoint import list_checkpoints, load_checkpoint
    from sagips.io.state import load_state

    a, b = (load_checkpoint(list_checkpoints(outs[k])[0][2])["generator"] for k in ("made", "read"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    key = load_state(outs["made"], 0, 2)["data_key"]
    assert key["file"] is None and key["subset"] == "blocks" and key["rows"] == 15000 and len(key["layout"]) == 16

    # data.share=node on 2 ranks: without a file, each rank generates half of the node's subset into the window;
    # with the file, each reads half of it. Every rank ends bit-identical in both.
    for name, extra in (("made_node", []), ("read_node", ["--set", f"environment.data_file={path}"])):
        outs[name] = tmp_path / name
        r = run_mpi(2, [*base, "--set", "data.share=node", *extra, "--output-dir", str(outs[name])], timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        a, b = (load_checkpoint(list_checkpoints(outs[k])[rank][2])["generator"] for k in ("made_node", "read_node"))
        assert all(torch.equal(a[k], b[k]) for k in a)
    key = load_state(outs["made_node"], 1, 2)["data_key"]
    assert key["share"] == "node" and key["file"] is None and key["rows"] == 15000
    record = json.loads((outs["made_node"] / "run.json").read_text())["reference_data"]
    assert record["node_ranks"] == 2 and record["node_window_bytes"] == 15000 * 2 * 4  # one copy for the 2 ranks
