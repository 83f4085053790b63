"""File-system work per rank does not grow with the ranks (issue 21, defect 4): at 400 ranks on Lustre, a rank that
lists every rank's state directory on --resume (N^2 listings in all), or reads the marker and lists its directory at
every save, loads the metadata servers for nothing. Counted with wrapped `open`/`os.open`/`os.listdir`/`os.scandir`
(tests/_fsops_worker.py) at N = 2 and N = 4 (one and two groups of 2): a fresh run with a state every 2 epochs, then
--resume of it."""
import json
import sys

import pytest

from tests._mpirun import ROOT, child_env, mpiexec

RUN = ["--config", "configs/proxy1d-quick.yaml", "--no-progress", "--mode", "rma-arar-arar",
       "--set", "environment.reference_events=4000", "--set", "environment.param_samples=4",
       "--set", "environment.events_per_sample=10", "--set", "train.quality_samples=4", "--set", "comm.inner_size=2",
       "--set", "train.state_every=2", "--set", "train.checkpoint_every=100", "--set", "train.log_every=100",
       "--set", "comm.timeout_s=60"]


def counts(tmp_path, n: int) -> list[dict]:
    import subprocess

    out = tmp_path / f"n{n}" / "run"
    out.parent.mkdir()
    cmd = ["timeout", "--kill-after=10", "240", mpiexec(), "-n", str(n), sys.executable, "tests/_fsops_worker.py",
           str(out), *RUN]
    r = subprocess.run(cmd, cwd=ROOT, env=child_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads((out.parent / "fsops" / f"rank{k}.json").read_text()) for k in range(n)]
    assert all(g[p]["rc"] == 0 for g in got for p in ("fresh", "resume")), got
    return got


@pytest.mark.timeout(600)
def test_file_operations_per_rank_do_not_grow_with_the_ranks(tmp_path):
    small, large = counts(tmp_path, 2), counts(tmp_path, 4)
    for phase in ("fresh", "resume"):
        for kind in ("listings", "opens"):
            per_rank = lambda runs, phase=phase, kind=kind: max(g[phase][kind] for g in runs)  # noqa: E731
            assert per_rank(large) <= per_rank(small), (phase, kind, [g[phase][kind] for g in small],
                                                        [g[phase][kind] for g in large])
    # the counter sees the work (so that the comparison can fail): every rank opened its own states to write them,
    # and on --resume listed (only) its own state directory and read its own state
    assert all(g["fresh"]["opens"] >= 3 and g["resume"]["listings"] >= 1 for g in small + large)
    # its own state directory (+ its own temporaries' directories; rank 0 also the run's top-level ones)
    assert [g["resume"]["listings"] for g in large] == [6] + [3] * 3, [g["resume"]["listings"] for g in large]
