"""benchmarks/batch_sweep.py: the FLOP count of an optiGAN epoch, and a one-point sweep end to end."""
import json

import pytest

from tests._bench import load_benchmark


@pytest.fixture(scope="module")
def sweep():
    return load_benchmark("batch_sweep")


def test_epoch_flops_is_the_posters_6_phi_rows_per_network_step(sweep):
    # 3 critic steps on 2*batch rows through D, then batch rows through G and D
    assert sweep.epoch_flops(100, 10, 4, 3) == 3 * 6 * 10 * 8 + 6 * 110 * 4
    assert sweep.epoch_flops(169478, 169473, 256, 3) == 2_082_491_904


def test_one_point_sweep_writes_json_png_and_table(sweep, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # leave this process's threads alone
    assert sweep.main(["--batches", "32", "--dtypes", "fp32", "--device", "cpu", "--threads", "1",
                       "--min-seconds", "0", "--min-epochs", "1", "--warmup", "0", "--peak-seconds", "0.01",
                       "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "batch_sweep.json").read_text())
    assert (tmp_path / "batch_sweep.png").stat().st_size > 1000
    d = res["dtypes"]["fp32"]
    (p,) = d["points"]
    assert p["batch"] == 32 and p["n_critic"] == 3 and p["finite_losses"]
    assert p["phi_g"] == 169478 and p["phi_d"] == 169473  # the paper's (opengate's) networks
    assert p["flops_s"] == pytest.approx(p["flops_per_epoch"] / p["epoch_s"])
    assert p["utilization"] == pytest.approx(p["flops_s"] / d["matmul_peak_flops_s"]) and d["matmul_peak_flops_s"] > 0
    assert res["threads"] == 1 and res["device"] == "cpu"
    assert "| fp32 | 32 |" in capsys.readouterr().out
