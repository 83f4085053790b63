"""Name the rank that died: each rank's work runs in a child process that its launcher-started parent watches.

When one rank of an MPI job is killed (kill -9, the out-of-memory killer, a segfault), the launcher tears the job
down, and MPICH's hydra then reports a PID, often of a survivor that it killed itself. The only process that knows
which rank died, and how, is that rank's parent. So under an MPI launcher (on Linux), `sagips.run` forks before any
heavy import: the child is the MPI rank and does all the work; the parent only waits for it, forwards the signals a
batch system sends (SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP), and when the child dies by a signal prints

    sagips: rank 2 (pid 4242 on x3005c0s13b0n0) was killed by signal 9 (SIGKILL: kill -9 or the out-of-memory
    killer); the job cannot go on without it. Continue from the last saved state with --resume.

then dies by the same signal, so the launcher sees what it would have seen without the supervisor. The child gets
PR_SET_PDEATHSIG=SIGKILL: when the launcher kills the parent (its teardown of the survivors), the child goes too, so
no orphan is left. Set SAGIPS_SUPERVISOR=0 to run the rank in the launched process itself.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

# the rank variables of the launchers SAGIPS meets: MPICH/hydra and Cray PMI, PMIx (Open MPI 5, Slurm), PALS
# (Polaris), Open MPI 4, Slurm srun
_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "PALS_RANKID", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
_FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
_CORE = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL, signal.SIGQUIT}
_HINTS = {signal.SIGKILL: "kill -9 or the out-of-memory killer", signal.SIGSEGV: "a crash in native code",
          signal.SIGBUS: "a crash in native code", signal.SIGABRT: "an abort in native code"}


def launcher_rank() -> int | None:
    for var in _RANK_VARS:
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def is_supervised() -> bool:
    return os.environ.get("SAGIPS_SUPERVISED") == "1"


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def death_message(rank: int, pid: int, host: str, sig: int, sent: int | None = None) -> str:
    """The line for a rank that died by signal `sig`; `sent`: a stop signal the launcher sent it first (Ctrl-C, a
    batch system's stop), which training turns into a saved state and exit 143: a death after it is a stop before
    training began (imports, data) or after it ended, not a crash (seen: SIGABRT from the C++ runtime of a rank
    interrupted during start-up, told to look for a crash and to --resume a run that had never started)."""
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)  # (what training turns into a saved state)
    if sent in stops and sig in (sent, signal.SIGABRT):
        after = "" if sig == sent else f" (by signal {sig}, {_name(sig)})"
        return (f"sagips: rank {rank} (pid {pid} on {host}) ended on the {_name(sent)} it was sent{after}, outside "
                f"training (start-up or the end): nothing was lost beyond what that stop interrupted; a run that "
                f"saved states continues with --resume")
    hint = _HINTS.get(sig)
    hint = (hint or "") + (f"{'; ' if hint else ''}after the {_name(sent)} it was sent" if sent is not None else "")
    return (f"sagips: rank {rank} (pid {pid} on {host}) was killed by signal {sig} ({_name(sig)}"
            f"{': ' + hint if hint else ''}); the job cannot go on without it. "
            f"Continue from the last saved state with --resume.")


def supervise() -> None:
    """Fork under an MPI launcher on Linux; returns in the child (the rank), never in the parent."""
    rank = launcher_rank()
    if (rank is None or is_supervised() or os.environ.get("SAGIPS_SUPERVISOR", "1") == "0"
            or not sys.platform.startswith("linux")):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    # A signal that arrives between the fork and the parent's forwarding handlers must not kill the parent: block
    # them across the fork; the parent unblocks them once it can forward (pending ones are then delivered).
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARD)
    child = os.fork()
    if child == 0:
        # the launcher's mask, but never with the forwarded signals blocked: a rank started with SIGTERM blocked
        # (inherited from whatever launched it) would never see the batch system's stop
        signal.pthread_sigmask(signal.SIG_SETMASK, set(old_mask) - set(_FORWARD))
        os.environ["SAGIPS_SUPERVISED"] = "1"
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        return
    _wait_and_report(child, rank, old_mask)


def _wait_and_report(child: int, rank: int, old_mask) -> None:
    sent: list[int] = []  # the signals forwarded

    def forward(signum, frame):
        sent.append(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARD:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, set(old_mask) - set(_FORWARD))  # (as in the child)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:  # cannot happen for our own child; do not spin
            os._exit(1)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    sys.stderr.write(death_message(rank, child, socket.gethostname(), sig, sent[0] if sent else None) + "\n")
    sys.stderr.flush()
    # die the same way, so that the launcher reports what it would have reported without the supervisor
    for s in _FORWARD:
        signal.signal(s, signal.SIG_DFL)
    if sig not in _CORE:  # (re-raising a crash signal would dump the parent's core too)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(128 + sig)
