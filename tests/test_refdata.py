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
    elif case in ("nan", "inf"):
        d = np.ones((10, 2), np.float32)
        d[4, 1] = np.nan if case == "nan" else np.inf
        _write(p, data=d)
    with pytest.raises(DataError) as exc:
        read_reference(p, SPEC)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
