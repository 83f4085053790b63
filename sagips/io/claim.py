"""One job per output directory: rank 0 of each run holds an exclusive lock on `DIR/.sagips.lock` from its first
check of the directory to its exit.

Two jobs started into one directory (a script run twice, a `--resume` given twice) would both train and write the
same files: metrics.jsonl with each epoch twice, run.json and the states of whichever wrote last. The second is
refused in one line, before it generates data or writes anything. The lock is `flock`: the kernel drops it when its
process ends, however it ends (SIGKILL, a node lost), so a killed job never leaves a stale lock that blocks its
`--resume`. A file system without `flock` (some Lustre mounts: `noflock`) runs without the lock, as before.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from sagips.config import ConfigError

LOCK_NAME = ".sagips.lock"
_held: dict[str, int] = {}  # real path of the directory -> the lock's descriptor (held by this process)


def claim(out_dir: str) -> None:
    """Create `out_dir` if needed and lock it for this process, or a one-line ConfigError: the directory cannot be
    written, or another job holds it (named by the pid and host it wrote into the lock, `stamp`)."""
    real = os.path.realpath(out_dir)
    if real in _held:
        return
    try:
        os.makedirs(real, exist_ok=True)
        fd = os.open(os.path.join(real, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ConfigError(f"--output-dir {out_dir}: cannot write there ({e.strerror}); choose another --output-dir") \
            from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # no flock on this file system
            os.close(fd)
            return
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "still starting"
        os.close(fd)
        raise ConfigError(f"output directory {out_dir} is in use by another job ({holder}): wait until it ends, or "
                          f"choose another --output-dir") from None
    os.ftruncate(fd, 0)  # (an ended job's line must not name it to a job refused before this one's `stamp`)
    _held[real] = fd


def stamp() -> None:
    """Write this process's pid and host into the locks it holds, for the message of a job refused later: once the
    run's input is checked, just before its first write (a job refused for bad input writes nothing)."""
    line = (f"pid {os.getpid()} on {socket.gethostname()}, since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n").encode()
    for fd in _held.values():
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, line, 0)
        except OSError:  # (a full disk: the run's own writes will say so; this line is only a courtesy)
            pass


def release_all() -> None:
    """Drop this process's locks (the end of an in-process `sagips.run.main`; a process's exit drops them anyway)."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)
