"""Atomic file writes: write a temporary file in the same directory, fsync it, rename it over the target.

A kill at any instant leaves the target either complete (old or new) or absent, never truncated.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO

# mkstemp creates files readable by their owner only; outputs should get the usual umask-based mode
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """The name of a temporary file beside `path`, for a library that opens files by name (h5py); once the block
    ends, the file is fsynced and renamed over `path`; on an exception (Ctrl-C included) it is deleted."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        os.close(fd)
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    with atomic_path(path) as tmp, open(tmp, mode) as fh:
        yield fh


def _fsync_dir(directory: str) -> None:
    # the rename itself is durable only once the directory entry is on disk
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def remove_stale_temps(root: str | os.PathLike, recursive: bool = True) -> list[str]:
    """Delete the temporary files that a kill mid-write left under `root` (`.NAME.XXXXXXXX.tmp`); only in `root`
    itself with recursive=False.

    Call it only when no process writes into `root` (e.g. on --resume, before training starts).
    """
    removed = []
    walk = os.walk(root) if recursive else [(root, None, [e.name for e in _entries(root) if e.is_file()])]
    for directory, _, files in walk:
        for f in files:
            if f.startswith(".") and f.endswith(".tmp"):
                path = os.path.join(directory, f)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path)
    return removed


def _entries(directory) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return []
