"""Reference data at scale (issue 23): each rank reads only its own subset of a data file, straight from HDF5.

Under mpiexec (N = 1, 2, 4) a patched h5py read counts the rows each rank reads; in-process, the subset is a pure
function of its key, the errors are one line, and a --resume rebuilds the same subset from a state without indices.
"""
import json
import os

import h5py
import numpy as np
import pytest
import torch

from sagips.io import shard
from sagips.io.refdata import DataError
from sagips.trainer import rank_seeds
from tests._mpirun import run_mpi

ROWS, CHUNK, FRACTION = 20000, 256, 0.5


def _file(path, rows=ROWS, cols=2, chunk=CHUNK, seed=0):
    """events: column 0 random, column 1 the row number (exact in float32), so a rank's rows can be named."""
    ev = np.empty((rows, cols), np.float32)
    ev[:, 0] = np.random.default_rng(seed).random(rows)
    ev[:, 1] = np.arange(rows)
    with h5py.File(path, "w") as f:
        f.create_dataset("events", data=ev, chunks=(min(chunk, rows), cols))
        f.attrs["norms"] = [1.0, 2.0]
    return ev


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("shard") / "ref.h5"
    _file(p)
    return p


def _run(n, data_file, out, *extra, timeout=60):
    r = run_mpi(n, ["tests/_shard_worker.py", str(data_file), str(FRACTION), "blocks", str(out), *extra],
                timeout=timeout)
    return r, [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_rank_reads_only_its_fraction_in_blocks(data_file, n, tmp_path):
    r, out = _run(n, data_file, tmp_path)
    assert r.returncode == 0 and len(out) == n, r.stderr[-2000:]
    keep = round(FRACTION * ROWS)
    for d in out:
        assert d["kept"] == keep and d["read"] == keep  # whole blocks, not the file
        assert d["calls"] <= keep // CHUNK + 1  # block reads, not single rows
        ids = np.asarray(d["ids"])
        assert np.all(np.diff(ids) > 0)  # distinct rows, in file order
    assert out[0]["read"] <= min(d["read"] for d in out)  # rank 0 reads no more than the others
    sets = [set(d["ids"]) for d in out]
    for a in range(n):
        for b in range(a + 1, n):  # random halves overlap by about half, never all
            assert len(sets[a] & sets[b]) < 0.8 * keep


def test_an_error_on_one_rank_ends_every_rank(data_file, tmp_path):
    r, out = _run(2, data_file, tmp_path, "1")
    assert r.returncode != 0 and [d["rank"] for d in out] == [0, 1], r.stderr[-2000:]
    assert all("changed since its layout was read" in d["error"] and "(rank 1)" in d["error"] for d in out)


# -- in-process: the key, the modes, the errors ---------------------------------------------------------------------
def test_subset_is_a_pure_function_of_the_key(data_file):
    layout = shard.read_layout(data_file, {"events": 2})
    assert layout["rows"] == ROWS and shard.block_rows(layout) == CHUNK
    a, b = shard.subset_ranges(11, layout, FRACTION, "blocks"), shard.subset_ranges(11, layout, FRACTION, "blocks")
    assert np.array_equal(a, b) and not np.array_equal(a, shard.subset_ranges(12, layout, FRACTION, "blocks"))
    rows = shard.subset_ranges(11, layout, FRACTION, "rows")  # the choice rank 0's broadcast path made
    legacy = np.sort(np.random.default_rng(11).choice(ROWS, size=round(FRACTION * ROWS), replace=False))
    assert np.array_equal(rows[:, 0], legacy)
    got = shard.read_subset(str(data_file), layout, rows, {"events": 2})["events"]
    assert np.array_equal(got[:, 1], legacy.astype(np.float32))


@pytest.mark.parametrize("storage", ["float64, contiguous", "float32, gzip chunks", "float32, odd chunks"])
@pytest.mark.parametrize("mode", ["blocks", "rows"])
def test_any_storage_reads_the_rows_of_the_ranges(tmp_path, storage, mode):
    """Truth: the whole dataset read with h5py and cut with numpy at the subset's ranges (as float32)."""
    full = np.random.default_rng(3).normal(size=(5000, 3))
    kw = {"float64, contiguous": {"data": full},
          "float32, gzip chunks": {"data": full.astype(np.float32), "chunks": (100, 3), "compression": "gzip"},
          "float32, odd chunks": {"data": full.astype(np.float32), "chunks": (77, 3)}}[storage]
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("events", **kw)
    layout = shard.read_layout(tmp_path / "f.h5", {"events": 3})
    ranges = shard.subset_ranges(5, layout, 0.3, mode)
    got = shard.read_subset(str(tmp_path / "f.h5"), layout, ranges, {"events": 3})["events"]
    want = np.concatenate([full[a:b] for a, b in ranges]).astype(np.float32)
    assert got.dtype == np.float32 and got.flags.c_contiguous and np.array_equal(got, want)


def test_errors_are_one_line(tmp_path, data_file):
    small = tmp_path / "small.h5"
    _file(small, rows=10)
    with pytest.raises(DataError, match="too few for subset_fraction=0.01"):
        shard.subset_ranges(1, shard.read_layout(small, {"events": 2}), 0.01, "blocks")
    with pytest.raises(DataError, match=r"dataset 'events' has shape \(10, 2\), expected \(N>0, 3\)"):
        shard.read_layout(small, {"events": 3})
    moving = tmp_path / "moving.h5"
    _file(moving)
    layout = shard.read_layout(moving, {"events": 2})
    _file(moving, rows=ROWS + 1)  # rewritten between the layout broadcast and the reads
    with pytest.raises(DataError, match="changed since its layout was read") as e:
        shard.read_subset(str(moving), layout, shard.subset_ranges(1, layout, FRACTION, "blocks"), {"events": 2})
    assert "\n" not in str(e.value)
    layout = shard.read_layout(moving, {"events": 2})
    _file(moving, rows=ROWS + 1, seed=9)  # the same shape, other values
    os.utime(moving, ns=(layout["stat"][0][2] + 10**9,) * 2)  # (a file system with coarse times still sees a change)
    with pytest.raises(DataError, match="changed since its layout was read"):
        shard.read_subset(str(moving), layout, shard.subset_ranges(1, layout, FRACTION, "blocks"), {"events": 2})


def _full_and_cut(tmp_path, data_file, *extra):
    """A run of 4 epochs (full) and one of 2 (cut), in-process, with `data_file`; resume cut to 4 to compare."""
    from sagips.run import main

    args = ["--config", "configs/proxy1d-quick.yaml", "--no-progress", "--set", f"environment.data_file={data_file}",
            "--set", "environment.param_samples=8", "--set", "environment.events_per_sample=10",
            "--set", "train.quality_samples=8", "--set", "train.state_every=2", "--set", "train.checkpoint_every=2",
            "--set", "train.log_every=2", "--set", "train.ema=0", "--set", "train.amp=none",
            "--set", "train.lr_final=1", *extra]  # no schedule over the epochs: 2 epochs are the start of 4
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*args, "--epochs", "4", "--output-dir", str(full)]) == 0
    assert main([*args, "--epochs", "2", "--output-dir", str(cut)]) == 0
    return full, cut


def _same_final_generators(full, cut):
    from sagips.io.checkpoint import list_checkpoints, load_checkpoint

    g_full, g_cut = (load_checkpoint(list_checkpoints(d)[0][4])["generator"] for d in (full, cut))
    return all(torch.equal(g_full[k], g_cut[k]) for k in g_full)


def test_a_read_in_a_thread_trains_on_the_same_rows(tmp_path, data_file, monkeypatch):
    """A large read runs in a thread beside the imports (sagips.run.BACKGROUND_READ_BYTES): set to 0 here, the run
    reads in the thread, and ends bit-identical to one that reads in the main thread."""
    import sagips.run as run

    threaded, real = [], run._in_background
    monkeypatch.setattr(run, "_in_background", lambda fn, *a: threaded.append(fn.__name__) or real(fn, *a))
    args = ["--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", "2", "--set",
            f"environment.data_file={data_file}", "--set", "environment.param_samples=8", "--set",
            "environment.events_per_sample=10", "--set", "train.quality_samples=8", "--set", "train.checkpoint_every=2",
            "--set", "train.amp=none"]  # (auto probes the speed: under load two runs could pick two precisions)
    for name, threshold in (("thread", 0), ("main", 1 << 62)):
        monkeypatch.setattr(run, "BACKGROUND_READ_BYTES", threshold)
        assert run.main([*args, "--output-dir", str(tmp_path / name)]) == 0
    assert threaded == ["read_subset"]
    from sagips.io.checkpoint import list_checkpoints, load_checkpoint

    a, b = (load_checkpoint(list_checkpoints(tmp_path / d)[0][2])["generator"] for d in ("thread", "main"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_rebuilds_the_subset_from_a_state_without_indices(tmp_path, data_file, capsys):
    from sagips.run import main

    full, cut = _full_and_cut(tmp_path, data_file)
    sd = torch.load(cut / "state" / "rank0000" / "epoch0000002.pt", weights_only=True)
    assert "subset_idx" not in sd and not any(isinstance(v, torch.Tensor) and v.dtype == torch.int64 and
                                              v.numel() > 100 for v in sd.values())
    key = sd["data_key"]
    assert key["layout"] == shard.read_layout(data_file, {"events": 2})["checksum"]
    assert key["rows"] == round(0.5 * ROWS) and key["subset"] == "blocks"
    assert json.loads((cut / "run.json").read_text())["reference_data"]["layout"] == key["layout"]
    assert main(["--resume", "--epochs", "4", "--output-dir", str(cut), "--no-progress"]) == 0
    assert _same_final_generators(full, cut)  # bit-exact
    other = tmp_path / "other.h5"
    _file(other, rows=ROWS + 7)
    capsys.readouterr()
    assert main(["--resume", "--epochs", "6", "--output-dir", str(cut), "--no-progress",
                 "--set", f"environment.data_file={other}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"data file {other}" in err[0] and "not the data this run was trained on" in err[0]


def test_optigan_reads_photons_and_conditions_with_the_same_rows(tmp_path):
    from mpi4py import MPI

    from environments.optigan.env import OptiGAN, OptiGANConfig

    rng, n = np.random.default_rng(3), 4000
    conds = np.repeat(rng.random((8, 3)).astype(np.float32), n // 8, axis=0)
    photons = rng.random((n, 6)).astype(np.float32)
    photons[:, 0] = np.arange(n)  # names the row
    with h5py.File(tmp_path / "opt.h5", "w") as f:
        f.create_dataset("photons", data=photons, chunks=(100, 6))
        f.create_dataset("conditions", data=conds, chunks=(100, 3))
    arrays, layout, ranges = shard.load_subset(MPI.COMM_SELF, str(tmp_path / "opt.h5"), OptiGAN.datasets, 5, 0.25,
                                               "blocks")
    rows = np.concatenate([np.arange(a, b) for a, b in ranges])
    assert len(rows) == n // 4 and shard.block_rows(layout) == 62  # n / MIN_BLOCKS < the chunk
    env = OptiGAN(OptiGANConfig(subset_fraction=0.25, quality_points=2, quality_photons=10), "cpu", 0)
    env.attach_subset(arrays, layout["attrs"])
    assert env.subset_idx is None and env.data.shape == (n // 4, 9)
    np.testing.assert_array_equal(env.data[:, 0].numpy(), rows)
    np.testing.assert_array_equal(env.data[:, 6:].numpy(), conds[rows])
    other = OptiGAN(OptiGANConfig(subset_fraction=0.25), "cpu", 0)
    other.set_shared_state(env.shared_state())  # what sagips.run does with rank 0's
    np.testing.assert_array_equal(other._std["out_mean"], photons[rows].mean(0, dtype=np.float64))


def test_nan_is_named_by_its_row_in_the_file(tmp_path):
    ev = _file(tmp_path / "nan.h5", rows=1000, chunk=10)
    ev[777, 0] = np.nan
    with h5py.File(tmp_path / "nan.h5", "r+") as f:
        f["events"][...] = ev
    layout = shard.read_layout(tmp_path / "nan.h5", {"events": 2})
    ranges = np.array([[100, 110], [770, 780]])
    with pytest.raises(DataError, match="1 NaN/Inf values in this rank's rows \\(first in row 777\\)"):
        shard.read_subset(str(tmp_path / "nan.h5"), layout, ranges, {"events": 2})


@pytest.mark.parametrize("mode", ["blocks", "rows"])
def test_a_damaged_chunk_is_one_line_naming_the_file(tmp_path, mode):
    path = tmp_path / "damaged.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("events", data=np.random.default_rng(0).normal(size=(20000, 2)).astype(np.float32),
                         chunks=(256, 2), compression="gzip")
    with open(path, "r+b") as fh:  # garbage over compressed chunks in the middle of the file
        fh.seek(os.path.getsize(path) // 2)
        fh.write(b"\xff" * 4096)
    layout = shard.read_layout(path, {"events": 2})
    with pytest.raises(DataError, match=f"data file {path}: dataset 'events' is corrupt \\(.*read"):
        shard.read_subset(str(path), layout, shard.subset_ranges(1, layout, FRACTION, mode), {"events": 2})


# -- data.share=node: one copy per node in a shared-memory window ---------------------------------------------------
def test_share_node_holds_one_copy_of_the_nodes_subset(data_file, tmp_path):
    """At N = 4 on one host: the real node (COMM_TYPE_SHARED, one node of 4) and the ranks posing as 2 nodes of 2.
    Truth: the file read whole with h5py, at the node seed's subset."""
    r = run_mpi(4, ["tests/_nodeshare_worker.py", str(data_file), str(FRACTION), str(tmp_path)], timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    with h5py.File(data_file) as f:
        events = f["events"][...]
    layout = shard.read_layout(data_file, {"events": 2})
    keep = round(FRACTION * ROWS)
    for split, nodes in (("node", [0, 0, 0, 0]), ("pairs", [0, 0, 1, 1])):
        out = [json.loads((tmp_path / f"{split}{x}.json").read_text()) for x in range(4)]
        assert [d["node"] for d in out] == nodes
        for d in out:
            size = d["node_size"]
            # one allocation per node, of the node's rows once: each rank holds 1/size of them
            assert d["allocated"] == [keep * 2 * 4] + [0] * (size - 1) and d["nbytes"] == keep * 2 * 4
            ranges = shard.subset_ranges(shard.node_seed(7, 0, d["node"]), layout, FRACTION, "blocks")
            assert d["ranges"] == ranges.tolist()
            rows = np.concatenate([np.arange(a, b) for a, b in ranges])
            assert d["ids"] == rows.tolist() and d["first"] == events[rows[:3], 0].tolist()
            assert d["zero_copy"]  # proxy1d's data is the window itself
            assert set(d["batch"]) <= set(rows.tolist())  # bootstrapped from the node's rows
        assert len({tuple(d["batch"]) for d in out}) == 4  # every rank draws its own batches
        ids = {d["node"]: set(d["ids"]) for d in out}
        if len(ids) == 2:
            assert len(ids[0] & ids[1]) < 0.8 * keep  # two nodes, two random subsets
    rank_rows = shard.subset_ranges(rank_seeds(7, 0, 0)[1], layout, FRACTION, "blocks")
    assert not np.array_equal(rank_rows, shard.subset_ranges(shard.node_seed(7, 0, 0), layout, FRACTION, "blocks"))


def test_rows_between_splits_a_subset_into_parts():
    ranges = np.array([[0, 3], [10, 12], [20, 25]])
    rows = np.concatenate([np.arange(a, b) for a, b in ranges])
    for lo, hi in [(0, 10), (0, 4), (2, 7), (3, 5), (5, 5), (9, 10)]:
        part = shard.rows_between(ranges, lo, hi)
        assert np.concatenate([np.arange(a, b) for a, b in part] or [[]]).tolist() == rows[lo:hi].tolist()


def test_share_node_in_a_run_resumes_bit_exact_and_refuses_another_share(tmp_path, data_file, capsys):
    """sagips.run with data.share=node (one rank: a node of one): the state's key names the share and the node, the
    resume is bit-exact, a resume with data.share=rank is refused with one line, and so is share=node without a file
    for an environment that cannot generate its data in blocks."""
    from sagips.run import main

    full, cut = _full_and_cut(tmp_path, data_file, "--set", "data.share=node")
    key = torch.load(cut / "state" / "rank0000" / "epoch0000002.pt", weights_only=True)["data_key"]
    assert key["share"] == "node" and key["node"] == 0 and key["rows"] == round(FRACTION * ROWS)
    record = json.loads((cut / "run.json").read_text())["reference_data"]
    assert record["share"] == "node" and record["node_ranks"] == 1
    assert record["node_window_bytes"] == round(FRACTION * ROWS) * 2 * 4  # the node's rows once, two float32 columns
    assert main(["--resume", "--epochs", "4", "--output-dir", str(cut), "--no-progress"]) == 0
    assert _same_final_generators(full, cut)  # bit-exact
    capsys.readouterr()
    assert main(["--resume", "--epochs", "6", "--output-dir", str(cut), "--no-progress",
                 "--set", "data.share=rank"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data subset's key changed (share: 'node' -> 'rank', node: 0 -> None)" in err[0], err
    assert main(["--config", "configs/optigan-quick.yaml", "--no-progress", "--epochs", "1", "--output-dir",
                 str(tmp_path / "gen"), "--set", "data.share=node"]) == 2  # optiGAN makes its data on one rank
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.share=node" in err[0] and "cannot generate a node's share" in err[0], err
