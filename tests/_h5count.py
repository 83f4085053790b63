"""Count the rows that h5py returns from one dataset (patched `Dataset.__getitem__` and `Dataset.read_direct`):
what a rank really read. Used by tests/_shard_worker.py and benchmarks/data_scale.py."""
import h5py


def _rows(ds, sel) -> int:
    """Rows of `ds` that the selection `sel` (None, a slice or a tuple starting with one) reads."""
    first = sel[0] if isinstance(sel, tuple) else sel
    if first is None:
        return ds.shape[0]
    if isinstance(first, slice):
        return len(range(*first.indices(ds.shape[0])))
    raise TypeError(f"count_reads: cannot count the rows of selection {sel!r}")


def count_reads(dataset: str = "/events") -> dict:
    """Patch h5py in this process; the returned dict's "rows" and "calls" grow with every read of `dataset`."""
    read = {"rows": 0, "calls": 0}
    get, direct = h5py.Dataset.__getitem__, h5py.Dataset.read_direct

    def counting(self, key):
        out = get(self, key)
        if self.name == dataset:
            read["rows"] += out.shape[0] if out.ndim == 2 else 1
            read["calls"] += 1
        return out

    def counting_direct(self, dest, source_sel=None, dest_sel=None):
        direct(self, dest, source_sel, dest_sel)
        if self.name == dataset:
            read["rows"] += _rows(self, source_sel)
            read["calls"] += 1

    h5py.Dataset.__getitem__, h5py.Dataset.read_direct = counting, counting_direct
    return read
