"""A rank that dies: the job tears itself down, names the lost rank, leaves no orphans; the run then resumes.

Also: a checkpoint that carries a pickled object is refused (loads use weights_only=True).
"""
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from sagips.io.checkpoint import load_checkpoint
from tests._mpirun import job_with_state, run_mpi

RUN = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress", "--epochs", "400",
       "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
       "--set", "environment.events_per_sample=20", "--set", "comm.inner_size=2", "--set", "comm.timeout_s=30",
       "--set", "train.state_every=2", "--set", "train.checkpoint_every=50", "--set", "train.quality_samples=16"]


def rank_pids(out_dir: str) -> dict[int, int]:
    """{MPI rank: pid} of the sagips.run processes writing into out_dir (found through /proc)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sagips.run" in cmd and out_dir.encode() in cmd:
            for e in env:
                if e.startswith(b"PMI_RANK="):
                    found[int(e[len(b"PMI_RANK="):])] = int(d.name)
    return found


@pytest.mark.parametrize("mode", ["rma-arar-arar"])
def test_kill_one_rank_tears_down_the_job_and_the_run_resumes(tmp_path, mode):
    out = str(tmp_path / "run")
    with job_with_state(4, [*RUN, "--mode", mode, "--output-dir", out], out) as p:
        pids = rank_pids(out)
        assert sorted(pids) == [0, 1, 2, 3]
        os.kill(pids[2], signal.SIGKILL)
        t_kill = time.time()
        out_s, err = p.communicate(timeout=60)  # the job must end on its own within 60 s
        err = out_s + err
        teardown = time.time() - t_kill
    assert p.returncode != 0
    # mpiexec (hydra) reports the bad termination with a PID of the job; run.json maps PIDs to ranks. (Hydra names
    # the first rank it finds with a bad status after its own cleanup, not always the one that died first.)
    assert "BAD TERMINATION" in err, f"exit {p.returncode}: {err[-2000:]}"
    info = json.loads((Path(out) / "run.json").read_text())
    pid_to_rank = {proc["pid"]: proc["rank"] for proc in info["processes"]}
    named = [pid_to_rank.get(int(m)) for m in re.findall(r"PID (\d+)", err)]
    assert named and all(r is not None for r in named), err[-2000:]
    time.sleep(1)
    assert rank_pids(out) == {}, "orphan ranks survived the teardown"
    assert teardown < 60
    # nothing lost beyond the last state: the run resumes and completes
    r = run_mpi(4, ["-m", "sagips.run", "--resume", "--output-dir", out, "--no-progress", "--epochs", "12"],
                timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_with_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"generator": {}, "epoch": 1, "time_s": 0.0, "rank": 0, "payload": Evil()}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|global"):
        load_checkpoint(path)
