"""Reference data: the sagips.data CLI, HDF5 round trip, and one-line errors for bad files."""
import h5py
import numpy as np
import pytest

from sagips.io.refdata import DataError, read_reference, write_reference
from tests._mpirun import run_py

SPEC = {"events": 2}


def test_data_cli_writes_events(tmp_path):
    out = tmp_path / "ref.h5"
    r = run_py(["-m", "sagips.data", "proxy1d", "--events", "5000", "--out", str(out), "--seed", "3",
                "--true-params", "2", "-0.5", "3", "1", "-0.5", "4"])
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        ev = f["events"]
        assert ev.shape == (5000, 2) and ev.dtype == np.float32
        np.testing.assert_allclose(f.attrs["true_params"], [2, -0.5, 3, 1, -0.5, 4])
        assert f.attrs["norms"].shape == (2,)
        assert 0.1 <= ev[...].min() and ev[...].max() <= 0.99999
    bad = run_py(["-m", "sagips.data", "proxy1d", "--events", "10", "--out", str(out), "--true-params",
                  "9", "0", "0", "0", "0", "0"])
    assert bad.returncode == 2 and "true_params" in bad.stderr


def test_round_trip(tmp_path):
    ev = np.random.default_rng(0).random((100, 2), dtype=np.float32)
    write_reference(tmp_path / "a.h5", {"events": ev}, {"norms": np.array([1.0, 2.0])})
    arrays, attrs = read_reference(tmp_path / "a.h5", SPEC)
    np.testing.assert_array_equal(arrays["events"], ev)
    np.testing.assert_array_equal(attrs["norms"], [1.0, 2.0])


def _write(path, name="events", data=None):
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=np.ones((10, 2), np.float32) if data is None else data)


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file"),
    ("corrupt", "not a readable HDF5"),
    ("wrong_name", "no dataset 'events'"),
    ("wrong_shape", "shape"),
    ("nan", "NaN/Inf"),
    ("inf", "NaN/Inf"),
    ("empty", "shape"),
    ("flat", "shape (20,), expected (N>0, 2) (h5py: f['events'] = x.reshape(-1, 2))"),
    ("ints", "holds int64 values, not floats"),
    ("not_hdf5", "reference data are read from HDF5 only"),
])
def test_bad_files(tmp_path, case, fragment):
    p = tmp_path / "d.h5"
    if case == "corrupt":
        p.write_bytes(b"\x89HDF\r\n\x1a\n" + b"garbage" * 50)
    elif case == "wrong_name":
        _write(p, name="evts")
    elif case == "wrong_shape":
        _write(p, data=np.ones((10, 3), np.float32))
    elif case == "empty":
        _write(p, data=np.ones((0, 2), np.float32))
    elif case == "flat":
        _write(p, data=np.ones(20, np.float32))
    elif case == "ints":
        _write(p, data=np.ones((10, 2), np.int64))
    elif case == "not_hdf5":
        with open(p, "wb") as fh:  # (a .npy's bytes under the name the user gave)
            np.save(fh, np.ones((10, 2), np.float32))
    elif case in ("nan", "inf"):
        d = np.ones((10, 2), np.float32)
        d[4, 1] = np.nan if case == "nan" else np.inf
        _write(p, data=d)
    with pytest.raises(DataError) as exc:
        read_reference(p, SPEC)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_parameter_names_as_a_string_or_an_array(tmp_path):
    """attribute parameter_names: the comma-separated string sagips.data writes, or an array of strings (h5py's way
    of writing a list), read alike; the truth comes with them."""
    from sagips.io.refdata import file_truth

    for i, names in enumerate(("c, a,b", ["c", "a", "b"], np.array([b"c", b"a", b"b"]))):
        p = tmp_path / f"t{i}.h5"
        with h5py.File(p, "w") as f:
            f["events"] = np.ones((10, 1), np.float32)
            f.attrs["true_params"] = [0.9, 1.7, 0.3]
            f.attrs["parameter_names"] = names
        assert file_truth(p) == ([0.9, 1.7, 0.3], ["c", "a", "b"]), names


def test_a_file_open_for_writing_elsewhere_is_named_so(tmp_path, monkeypatch):
    """HDF5 locks a file that another process writes: one line that says so (it was "not a readable HDF5 file",
    cut mid-word)."""
    import subprocess
    import sys
    import time

    monkeypatch.delenv("HDF5_USE_FILE_LOCKING", raising=False)  # (HDF5's default: locks on)
    p, ready = tmp_path / "d.h5", tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import h5py, numpy as np, pathlib, time\n"
        f"f = h5py.File({str(p)!r}, 'w'); f['events'] = np.ones((10, 2), np.float32); f.flush()\n"
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")])
    try:
        for _ in range(300):
            if ready.exists():
                break
            time.sleep(0.1)
        with pytest.raises(DataError) as e:
            read_reference(p, SPEC)
        assert str(e.value) == (f"data file {p}: another process has it open for writing (HDF5 locks it): wait until "
                                f"it is written and closed, then start again")
    finally:
        holder.kill()
        holder.wait()
