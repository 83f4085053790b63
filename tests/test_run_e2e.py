"""End to end under mpiexec: a 2-rank ensemble run writes every output of the DESIGN contract."""
import json

import numpy as np
import pytest
import torch

from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.io.metrics import read_metrics
from tests._mpirun import ROOT, child_env, run_mpi, run_py

QUICK = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--no-progress",
         "--set", "environment.reference_events=20000", "--set", "environment.param_samples=16",
         "--set", "environment.events_per_sample=20", "--set", "train.quality_samples=64"]


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ens") / "run"
    r = run_mpi(2, QUICK + ["--mode", "ensemble", "--epochs", "6", "--output-dir", str(out),
                            "--set", "train.checkpoint_every=4", "--set", "train.log_every=2"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_outputs_exist_and_load(ensemble_run):
    out, r = ensemble_run
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["mode"] == "ensemble" and info["world_size"] == 2
    assert info["epochs"] == 6 and len(info["train_seconds"]) == 2 and info["events_per_epoch"] == 16 * 20
    assert info["config"]["environment"]["name"] == "proxy1d" and info["truth"] == info["config"]["environment"][
        "true_params"]
    assert {"torch", "mpi4py", "mpi", "numpy"} <= set(info["versions"])
    assert info["cwd"] == str(ROOT)  # where the run started: its config's relative paths are relative to it
    ck = list_checkpoints(out)
    assert sorted(ck) == [0, 1] and all(sorted(v) == [1, 4, 6] for v in ck.values())
    for rank, eps in ck.items():
        for epoch, path in eps.items():
            c = load_checkpoint(path)
            assert c["rank"] == rank and c["epoch"] == epoch and c["time_s"] > 0
            assert set(c["generator"]) == {f"{i}.{k}" for i in (0, 2, 4, 6, 8) for k in ("weight", "bias")}
    # time stamps grow
    t = [load_checkpoint(ck[0][e])["time_s"] for e in (1, 4, 6)]
    assert t[0] < t[1] < t[2]
    m = read_metrics(out / "metrics.jsonl")
    assert [rec["epoch"] for rec in m] == [1, 2, 4, 6]
    assert all(len(rec["residuals"]) == 6 and rec["quality_ranks"] == 2 and rec["quality_of"] == "all ranks"
               for rec in m)
    # the last logged record scores what the final table does: the mean of both ranks' generators
    assert m[-1]["params"] == info["final_quality"]["params"]
    assert "max |r|" in r.stdout


def test_an_ensemble_run_ends_with_its_p_hat_and_sigma(ensemble_run, tmp_path):
    """--mode ensemble on 2 ranks: the ranks are independent members, so rank 0 analyses the run at its end (as the
    last member of a job of several does): p̂ ± σ printed once, in place of the run end's own convergence lines, and
    RUN_DIR/analysis holds what `python -m sagips.analyze RUN_DIR` writes (run here apart, the independent check)."""
    out, r = ensemble_run
    assert r.stdout.count("## Parameters: p̂ ± σ (what to quote)") == 1 and "sagips: convergence (" not in r.stdout
    assert r.stdout.count(f"sagips: the 2 ranks are independent members; analysing them (python -m sagips.analyze "
                          f"{out} --out {out / 'analysis'})") == 1
    assert f"sagips: the run's analysis (summary.md, summary.json, figures) is in {out / 'analysis'}" in r.stdout
    cli = run_py(["-m", "sagips.analyze", str(out), "--out", str(tmp_path / "cli")], timeout=180)
    assert cli.returncode == 0, cli.stderr[-3000:]
    got, want = (json.loads((d / "summary.json").read_text())["groups"][0]
                 for d in (out / "analysis", tmp_path / "cli"))
    assert got["uncertainty"]["n_members"] == 2 and got["uncertainty"]["spread_from"] == "members"
    for key in ("p_hat", "sigma"):
        np.testing.assert_allclose(got["uncertainty"][key], want["uncertainty"][key], rtol=1e-12)
    assert got["convergence"] == want["convergence"]  # (6 epochs, checkpoints 1, 4, 6: each "not judged", by name)
    assert all(c["moving"] is None and "too few checkpoints in the last 20 %" in c["message"]
               for c in got["convergence"])
    assert json.loads((out / "run.json").read_text())["convergence"] == got["convergence"]  # run.json keeps it


def test_ensemble_ranks_are_independent(ensemble_run):
    out, _ = ensemble_run
    ck = list_checkpoints(out)
    w0 = load_checkpoint(ck[0][6])["generator"]["0.weight"]
    w1 = load_checkpoint(ck[1][6])["generator"]["0.weight"]
    assert not torch.equal(w0, w1)


def test_refuses_to_overwrite_a_run(ensemble_run):
    out, _ = ensemble_run
    r = run_mpi(2, QUICK + ["--epochs", "1", "--output-dir", str(out)], timeout=120)
    assert r.returncode != 0 and "already holds a run" in r.stderr
    assert len(read_metrics(out / "metrics.jsonl")) == 4  # untouched


def test_inner_size_larger_than_world(tmp_path):
    r = run_mpi(2, QUICK + ["--mode", "arar-arar", "--set", "comm.inner_size=3", "--output-dir", str(tmp_path / "x")],
                timeout=120)
    assert r.returncode == 2 and "comm.inner_size" in r.stderr
    assert np.sum(["sagips: error" in line for line in r.stderr.splitlines()]) == 1


def _final_weights(out, epoch):
    ck = list_checkpoints(out)
    return [load_checkpoint(ck[r][epoch])["generator"] for r in sorted(ck)]


def _identical(ws):
    """Weights identical on every rank (biases are not exchanged by default, as in the paper: they may differ)."""
    return all(torch.equal(ws[0][k], w[k]) for w in ws[1:] for k in ws[0] if k.endswith("weight"))


# 2 ranks where a third and fourth add nothing (a start-up of 4 ranks costs ~10 s on 2 cores); rma-arar-arar (4 ranks,
# 2 groups) is run by test_rma_run_records_startup_precision_and_ensemble_quality below; arar-arar's outer epoch equals
# arar's ring exactly in tests/mpi/test_modes.py (test_arar_arar_outer_epoch_equals_arar)
@pytest.mark.parametrize("mode, n, sets, expect", [
    ("allreduce", 2, [], "identical"),
    ("arar", 2, ["comm.ring=chunked"], "identical"),  # the ring's own tests: tests/mpi/test_ring.py at N = 1..4
    ("arar-arar", 4, ["comm.inner_size=2", "comm.outer_every=1000"], "groups"),
    ("ensemble", 2, [], "different"),
])
def test_modes_end_to_end(tmp_path, mode, n, sets, expect):
    out = tmp_path / "run"
    extra = [x for s in sets for x in ("--set", s)]
    r = run_mpi(n, QUICK + ["--mode", mode, "--epochs", "3", "--output-dir", str(out)] + extra, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = _final_weights(out, 3)
    assert len(ws) == n
    first_layer = [w["0.weight"] for w in ws]
    info = json.loads((out / "run.json").read_text())
    if expect == "identical":  # every rank applied the same (global mean) gradient from the same start
        assert _identical(ws)
    elif expect == "groups":  # inner rings only: identical inside a group, different across groups
        assert torch.equal(first_layer[0], first_layer[1]) and torch.equal(first_layer[2], first_layer[3])
        assert not torch.equal(first_layer[0], first_layer[2])
        assert info["layout"]["groups"] == [[0, 1], [2, 3]]
    else:
        assert not any(torch.equal(first_layer[0], w) for w in first_layer[1:])


def test_optigan_rma_two_ranks(tmp_path):
    """optiGAN plugs in through the registry and trains under rma-arar-arar (generator gradients only)."""
    out = tmp_path / "opti"
    r = run_mpi(2, ["-m", "sagips.run", "--config", "configs/optigan-quick.yaml", "--mode", "rma-arar-arar",
                    "--no-progress", "--epochs", "3", "--output-dir", str(out), "--set", "comm.inner_size=2",
                    "--set", "environment.photons_per_point=200", "--set", "environment.heldout_points=4",
                    "--set", "environment.heldout_photons=200", "--set", "environment.batch_size=64",
                    "--set", "environment.quality_points=2", "--set", "train.log_every=1"], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["environment"] == "optigan" and info["mode"] == "rma-arar-arar" and info["n_critic"] == 3
    ck = list_checkpoints(out)
    assert sorted(ck) == [0, 1] and 3 in ck[0]
    assert read_metrics(out / "metrics.jsonl")[-1]["epoch"] == 3


def test_rma_run_records_startup_precision_and_ensemble_quality(tmp_path):
    """make run's mode (4 ranks, 2 groups) at a truth other than the default: the exchange moved contributions, and
    run.json holds startup_s, the precision that train.amp=auto resolved (and why), and the final quality of every
    rank's generator (eq. 7), not rank 0's alone."""
    from sagips.precision import cpu_capability

    truth = [0.967, -0.438, 2.603, 1.334, 0.261, 0.551]
    out = tmp_path / "rma"
    r = run_mpi(4, QUICK + ["--mode", "rma-arar-arar", "--epochs", "3", "--output-dir", str(out),
                            "--set", "comm.inner_size=2", "--set", "comm.outer_every=2", "--set", "train.amp=auto",
                            "--set", "train.log_every=1", "--set", f"environment.true_params={truth}"], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["truth"] == truth
    # RMA: contributions were used (an exchange that moved nothing would use none); one outer epoch (epoch 2)
    used = sum(s.get("rma_used", 0) for s in info["exchange_stats"])
    assert used > 0 and all(s.get("outer", 0) == 1 for s in info["exchange_stats"])
    assert 0 < info["startup_s"] < 120 and len(info["startup"]["per_rank_s"]) == 4
    phases = info["startup"]["rank0_phases_s"]
    assert {"config", "imports", "reference_data", "networks_and_precision", "exchange"} <= set(phases)
    assert sum(phases.values()) <= info["startup_s"] + 0.01  # the phases are part of the whole
    prec = info["precision"]
    # the capability the child run saw (tests/_mpirun.child_env may give it an AVX2-only CPU)
    seen = child_env().get("ATEN_CPU_CAPABILITY", "").upper() or cpu_capability()
    assert prec["requested"] == "auto" and prec["device"] == "cpu" and prec["cpu_capability"] == seen
    assert prec["resolved"] in ("float32", "bf16") and prec["reason"]
    if not prec["native_bf16"]:
        assert prec["resolved"] == "float32"
    assert f"precision {prec['resolved']}" in r.stderr and "start-up" in r.stderr
    q = info["final_quality"]
    assert len(q["rank_max_abs_residual"]) == 4  # every rank's generator went into the final mean
    ps = np.array(q["params"])
    r_hat = (np.array(truth) - ps) / np.array(truth)
    assert np.allclose(r_hat, q["residuals"]) and abs(np.abs(r_hat).max() - q["max_abs_residual"]) < 1e-9
    # the logged curve is rank 0's generator alone (rma-arar-arar never waits for the others), and says so
    m = read_metrics(out / "metrics.jsonl")
    assert [rec["epoch"] for rec in m] == [1, 2, 3]
    assert all(rec["quality_of"] == "rank 0" and rec["quality_ranks"] == 1 for rec in m)
