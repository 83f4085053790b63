"""sagips.supervise: under a launcher the rank's work runs in a child; its parent names the rank when it dies."""
import os
import signal
import subprocess
import sys
import time

import pytest

from sagips.supervise import death_message

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervisor is Linux-only")

RANK = """
import os, signal, sys, time
from sagips.supervise import supervise
supervise()
def stop(signum, frame):
    print("worker got", signum, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print(os.getpid(), os.getppid(), flush=True)
time.sleep(60)
"""


def start(blocked=(), **env):
    """The rank, launched with `blocked` signals blocked (a launcher's inherited mask)."""
    p = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PMI_RANK": "3", **env},
                         preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, blocked)) if blocked else None)
    worker, parent = map(int, p.stdout.readline().split())
    return p, worker, parent


def gone(pid, wait=5.0):
    end = time.time() + wait
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # reap it if it is our zombie
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_a_killed_worker_is_named_and_its_parent_dies_the_same_way():
    p, worker, parent = start()
    assert parent == p.pid and worker != p.pid  # the launched process watches a forked worker
    os.kill(worker, signal.SIGKILL)
    _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL  # what the launcher would have seen without the supervisor
    assert err.strip() == death_message(3, worker, os.uname().nodename, signal.SIGKILL)
    assert "rank 3 (pid" in err and "SIGKILL: kill -9 or the out-of-memory killer" in err and "--resume" in err


@pytest.mark.parametrize("blocked", [(), (signal.SIGTERM,)], ids=["plain", "launched-with-sigterm-blocked"])
def test_sigterm_to_the_launched_process_reaches_the_worker(blocked):
    # a SIGTERM blocked in what launched the rank (seen once in a full test run: pytest's own mask, inherited) must
    # not keep the batch system's stop from the worker
    p, worker, _ = start(blocked)
    p.send_signal(signal.SIGTERM)  # what mpiexec/PBS do
    out, err = p.communicate(timeout=30)
    assert "worker got 15" in out and p.returncode == 143 and "killed by signal" not in err


def test_a_worker_that_dies_on_the_signal_it_was_sent_is_told_apart_from_a_crash():
    """Ctrl-C reaches a rank outside training (the worker here has no SIGINT handler: start-up): it dies by the
    signal, and the line says so, not 'killed ... the job cannot go on' with --resume for a run that never started."""
    p, worker, _ = start()
    p.send_signal(signal.SIGINT)  # what mpiexec forwards on Ctrl-C
    _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGINT
    line = [x for x in err.splitlines() if x.startswith("sagips:")]
    assert line == [death_message(3, worker, os.uname().nodename, signal.SIGINT, signal.SIGINT)], err
    assert line[0] == (f"sagips: rank 3 (pid {worker} on {os.uname().nodename}) ended on the SIGINT it was sent, "
                       f"outside training (start-up or the end): nothing was lost beyond what that stop interrupted; "
                       f"a run that saved states continues with --resume")
    assert death_message(3, 42, "h", signal.SIGABRT, signal.SIGINT).startswith(
        "sagips: rank 3 (pid 42 on h) ended on the SIGINT it was sent (by signal 6, SIGABRT), outside training")
    # a death by another signal after a stop, or after a signal training does not handle, is still a crash
    assert death_message(3, 42, "h", signal.SIGKILL, signal.SIGTERM) == (
        "sagips: rank 3 (pid 42 on h) was killed by signal 9 (SIGKILL: kill -9 or the out-of-memory killer; after the "
        "SIGTERM it was sent); the job cannot go on without it. Continue from the last saved state with --resume.")
    assert death_message(3, 42, "h", signal.SIGHUP, signal.SIGHUP).startswith(
        "sagips: rank 3 (pid 42 on h) was killed by signal 1 (SIGHUP: after the SIGHUP it was sent)")


def test_ctrl_c_outside_training_is_one_line_and_the_process_dies_by_sigint(tmp_path):
    """main: a KeyboardInterrupt outside training (start-up, the run's end) was a traceback per rank; now one line,
    and the process dies by SIGINT as an uncaught interrupt does (a launcher then ends the job as before)."""
    code = ("import sys\nimport sagips.run as r\n"
            "def stop(*a, **k):\n    raise KeyboardInterrupt\n"
            "r._main = stop\n"
            "sys.argv = ['sagips.run', '--no-progress']\n"
            "r.main()\n")  # (the command line's main(); main(argv) from Python gets the exception)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")})
    assert p.returncode == -signal.SIGINT, p.stderr[-2000:]
    assert p.stderr.strip() == "sagips: rank 0: interrupted (SIGINT) outside training, during start-up or the run's end"


def test_killing_the_launched_process_takes_the_worker_with_it():
    p, worker, _ = start()
    p.kill()  # the launcher's teardown of a survivor
    p.wait(timeout=30)
    assert gone(worker), "the worker outlived its parent (an orphan)"


def test_opt_out_and_no_launcher_run_in_place():
    p, worker, _ = start(SAGIPS_SUPERVISOR="0")
    assert worker == p.pid
    p.kill()
    p.wait(timeout=30)
    env = {k: v for k, v in os.environ.items() if k != "PMI_RANK"}
    q = subprocess.Popen([sys.executable, "-c", "from sagips.supervise import supervise; import os; supervise(); "
                          "print(os.getpid())"], stdout=subprocess.PIPE, text=True, env=env)
    out, _ = q.communicate(timeout=30)
    assert q.returncode == 0 and int(out) == q.pid  # no launcher: no fork
