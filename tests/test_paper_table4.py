"""benchmarks/paper_table4.py (issue 20): --smoke runs every column end to end and writes the page; the verdicts
follow the numbers."""
import json
import subprocess
import sys

import numpy as np
import torch

from sagips.io.state import load_state
from tests._bench import ROOT, load_benchmark
from tests._mpirun import child_env

pt4 = load_benchmark("paper_table4")


def test_smoke_runs_every_column_and_writes_the_page(tmp_path):
    docs, runs = tmp_path / "docs", tmp_path / "runs"
    p = subprocess.run([sys.executable, "benchmarks/paper_table4.py", "--smoke", "--docs", str(docs), "--runs",
                        str(runs)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr[-3000:]
    page = (docs / "paper_table4.md").read_text()
    assert "| residual | hvd | rma-arar-arar | arar-arar | arar | ensemble | arar-arar-weights |" in page
    assert "| N2-rma-split |" in page and "- **arar-arar against hvd**" in page
    assert "- **N2-arar-split against N = 1**" in page and "weights against gradients" in page
    rec = {c: json.loads((docs / "paper_table4" / f"{c}__s0.json").read_text())
           for c in pt4.TABLE_COLUMNS + pt4.SPLIT_COLUMNS}
    # eq. 10 in the study: N = 2 trains on half the parameter sets per rank, N = 1 on all of them
    assert rec["N2-arar-split"]["batch"] == {"key": "environment.param_samples", "split": True, "requested": 16,
                                             "ranks_averaged": 2, "per_rank": 8, "effective": 16}
    assert rec["N1-whole-batch"]["batch"]["per_rank"] == 16 and rec["N1-whole-batch"]["members"] == 2
    # hvd: one data-parallel GAN (both networks the same on both ranks); outer_sync=weights with h = 1: every
    # generator the same after the last (outer) epoch
    hvd = [load_state(runs / "hvd" / "s0", r, 3) for r in (0, 1)]
    for net in ("generator", "discriminator"):
        assert all(torch.equal(hvd[0][net][k], hvd[1][net][k]) for k in hvd[0][net])
    w = [load_state(runs / "arar-arar-weights" / "s0", r, 3)["generator"] for r in (0, 1)]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])
    out = json.loads((docs / "paper_table4.json").read_text())
    assert set(out["table"]) == set(pt4.TABLE_COLUMNS) and set(out["split"]) == set(pt4.SPLIT_COLUMNS)


def _group(name, residual_1e3, times=(10.0, 20.0), max_abs=(0.5, 0.1)):
    r = np.asarray(residual_1e3, float) / 1e3
    return {"name": name, "final": {"residual_1e3": list(residual_1e3)}, "time_s": list(times),
            "residual": [list(np.full(len(r), m)) for m in max_abs[:-1]] + [list(r)]}


def test_verdicts_follow_the_numbers():
    table = {"groups": [_group("hvd", [95, 94, 26, 212, 138, 99]), _group("arar", [2, 3, 0, 26, 18, 111]),
                        _group("arar-arar", [3, 8, 1, 20, 14, 9]), _group("arar-arar-weights", [3, 8, 1, 10, 14, 9])]}
    one = _group("N1-whole-batch", [50, 0, 0, 0, 0, 0], times=(100.0, 200.0), max_abs=(0.5, 0.05))
    fast = _group("N2-arar-split", [40, 0, 0, 0, 0, 0], times=(60.0, 120.0), max_abs=(0.04, 0.04))
    slow = _group("N2-rma-split", [80, 0, 0, 0, 0, 0], times=(60.0, 120.0), max_abs=(0.5, 0.08))
    v = pt4.verdicts(table, {"groups": [one, fast, slow]})
    assert v["arar-arar_vs_hvd"]["better_on"] == 6 and v["arar_vs_hvd"]["better_on"] == 5
    assert abs(v["arar-arar_vs_hvd"]["ratio_max_abs"] - 212 / 20) < 1e-9
    assert v["weights_vs_gradients"]["rms_weights"] < v["weights_vs_gradients"]["rms_gradients"]
    assert v["N2-arar-split_vs_N1"]["N2_reaches_at_s"] == 60.0
    assert v["N2-rma-split_vs_N1"]["N2_reaches_at_s"] is None
