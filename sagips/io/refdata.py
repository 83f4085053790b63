"""Reference data in HDF5: one dataset per array, attributes beside them.

proxy1d: dataset `events` (N x 2, float32), attributes `true_params`, `norms`.
optigan: `photons` (N x 6) and `conditions` (N x 3).
Every problem a user can meet (missing, corrupt, wrong dataset or shape, NaN/Inf) is a one-line `DataError`.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from sagips.io.atomic import atomic_open


class DataError(ValueError):
    """A reference data file that cannot be used; the message is one line that says what to fix."""


def write_reference(path: str | os.PathLike, arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> None:
    """Write atomically (temporary file + fsync + rename)."""
    import h5py  # here, not at the top: every rank imports this module for DataError, few read or write a file

    with atomic_open(path, "wb") as fh, h5py.File(fh, "w") as f:
        for name, arr in arrays.items():
            f.create_dataset(name, data=np.ascontiguousarray(arr, dtype=np.float32))
        for k, v in attrs.items():
            f.attrs[k] = v


def open_reference(path: str):
    """The HDF5 file at `path`, open for reading, or a one-line DataError."""
    import h5py

    if not os.path.exists(path):
        raise DataError(f"data file {path}: no such file (check environment.data_file)")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"data file {path}: not a readable HDF5 file ({str(e).splitlines()[0][:120]})") from None


def checked_dataset(f, path: str, name: str, cols: int):
    """Dataset `name` of the open file `f`: 2-D with `cols` columns and at least one row, or a one-line DataError."""
    import h5py

    if name not in f or not isinstance(f[name], h5py.Dataset):
        have = ", ".join(sorted(f.keys())) or "nothing"
        raise DataError(f"data file {path}: no dataset '{name}' (it holds: {have})")
    ds = f[name]
    if ds.ndim != 2 or ds.shape[1] != cols or ds.shape[0] == 0:
        raise DataError(f"data file {path}: dataset '{name}' has shape {ds.shape}, expected (N>0, {cols})")
    if ds.is_virtual:  # HDF5 reads the rows of a missing source file as its fill value, without an error
        here = os.path.dirname(os.path.abspath(path))
        for src in ds.virtual_sources():
            if src.file_name != "." and not os.path.exists(os.path.join(here, src.file_name)):
                raise DataError(f"data file {path}: part file {src.file_name} of dataset '{name}' is missing (a "
                                f"virtual dataset reads its parts beside it: keep the set of files together)")
    return ds


def read_reference(path: str | os.PathLike, datasets: dict[str, int]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read and validate. `datasets` maps each required dataset name to its number of columns."""
    path = os.fspath(path)
    with open_reference(path) as f:
        arrays = {}
        for name, cols in datasets.items():
            ds = checked_dataset(f, path, name, cols)
            try:
                arr = np.asarray(ds[...], dtype=np.float32)
            except OSError as e:
                raise DataError(f"data file {path}: dataset '{name}' is corrupt ({str(e).splitlines()[0][:120]})") \
                    from None
            bad = ~np.isfinite(arr)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise DataError(f"data file {path}: dataset '{name}' holds {int(bad.sum())} NaN/Inf values "
                                f"(first in row {row}); clean the file")
            arrays[name] = arr
        n = {len(a) for a in arrays.values()}
        if len(n) > 1:
            raise DataError(f"data file {path}: datasets {list(arrays)} have different numbers of rows")
        attrs = {k: np.asarray(v) for k, v in f.attrs.items()}
    return arrays, attrs
