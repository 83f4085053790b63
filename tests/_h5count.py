"""Count the rows that h5py returns from one dataset (a patched `Dataset.__getitem__`): what a rank really read.
Used by tests/_shard_worker.py and benchmarks/data_scale.py."""
import h5py


def count_reads(dataset: str = "/events") -> dict:
    """Patch h5py in this process; the returned dict's "rows" and "calls" grow with every read of `dataset`."""
    read = {"rows": 0, "calls": 0}
    orig = h5py.Dataset.__getitem__

    def counting(self, key):
        out = orig(self, key)
        if self.name == dataset:
            read["rows"] += out.shape[0] if out.ndim == 2 else 1
            read["calls"] += 1
        return out

    h5py.Dataset.__getitem__ = counting
    return read
