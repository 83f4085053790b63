"""benchmarks/loop_closure.py: when a part counts as converged, and a page that is generated whole, beside notes it
never touches, naming the CPU."""
import json
import types

import pytest

from tests._bench import load_benchmark


@pytest.fixture(scope="module")
def lc():
    return load_benchmark("loop_closure")


def pts(values, dt=10.0):
    return [{"epoch": 100 * i, "time_s": dt * i, "max_abs_r": v, "r": [v] * 6} for i, v in enumerate(values)]


def test_crossing_first_below_and_below_to_the_end(lc):
    c = lc.crossing(pts([0.5, 0.04, 0.06, 0.045, 0.03]))
    assert c["first_below_s"] == 10.0 and c["below_from_s"] == 30.0 and c["final_max_abs_r"] == 0.03
    never = lc.crossing(pts([0.5, 0.2, 0.1]))
    assert never["first_below_s"] is None and never["below_from_s"] is None
    ends_above = lc.crossing(pts([0.5, 0.04, 0.06]))  # dipped below once but ends above: not converged
    assert ends_above["first_below_s"] == 10.0 and ends_above["below_from_s"] is None


def test_truth_keys_are_distinct_and_stable(lc):
    assert lc.truth_key("default") == "default"
    assert lc.truth_key("0.967,-0.438,2.603,1.334,0.261,0.551") == "p0.967_-0.438_2.603_1.334_0.261_0.551"
    assert len({lc.truth_key(t) for t in lc.STUDY_TRUTHS}) == len(lc.STUDY_TRUTHS)


def test_page_is_generated_whole_and_leaves_the_notes_alone(lc, tmp_path):
    parts_dir = tmp_path / "loop_closure"
    parts_dir.mkdir()
    notes = tmp_path / lc.NOTES
    notes.write_text("hand-written\n")
    mach = {"cpu_model": "Test CPU 9000", "vector_flags": ["avx2", "fma"], "torch_cpu_capability": "AVX2",
            "native_bf16": False, "cores": 2, "torch": "x"}
    part = {"mode": "rma-arar-arar", "truth_arg": "default", "truth": [2.1875, -0.5, 3, 1.09375, -0.5, 4],
            "epochs": 500, "train_s": 50.0, "startup_s": 3.2, "precision": {"resolved": "float32"},
            "points": pts([0.5, 0.04, 0.03]), **lc.crossing(pts([0.5, 0.04, 0.03])), "machine": mach,
            "finished": "2026-11-25 00:00 UTC"}
    (parts_dir / "rma-arar-arar__default.json").write_text(json.dumps(part))
    (parts_dir / "floor__default.json").write_text(json.dumps({"max_abs_r": 0.0057, "r": [0.001] * 6}))
    a = types.SimpleNamespace(modes=["rma-arar-arar", "ensemble"], ranks=4, inner_size=2, checkpoint_every=100,
                              budget_min=15.0)
    page = tmp_path / "loop_closure.md"
    page.write_text("an old page with a note that a rerun must not keep\n")
    lc.render(a, ["default"], tmp_path, parts_dir)
    text = page.read_text()
    assert "an old page" not in text and "Test CPU 9000" in text and "avx2 fma" in text and "AVX2" in text
    assert "| T0 | rma-arar-arar | float32 | 3.2 s | 500 |" in text and "| met |" in text
    assert "| T0 | ensemble | not run yet |" in text
    assert notes.read_text() == "hand-written\n" and (tmp_path / "loop_closure.png").stat().st_size > 0
    assert '--truths "default"\n' in text  # the preset itself: no --set


def test_a_variants_page_names_its_settings(lc, tmp_path):
    """A page rebuilt with --page-only names the --set of the parts (from their commands) and its --out."""
    parts_dir = tmp_path / "loop_closure"
    parts_dir.mkdir()
    mach = {"cpu_model": "Test CPU", "vector_flags": [], "torch_cpu_capability": "AVX2", "native_bf16": False,
            "cores": 2, "torch": "x"}
    part = {"mode": "rma-arar-arar", "truth_arg": "default", "truth": [2.1875, -0.5, 3, 1.09375, -0.5, 4],
            "epochs": 500, "train_s": 50.0, "startup_s": 3.2, "precision": {"resolved": "float32"},
            "command": "mpiexec -n 4 python -m sagips.run --config configs/proxy1d-quick.yaml --set "
                       "comm.inner_size=2 --set train.checkpoint_every=100 --set train.lr_g=3e-4",
            "points": pts([0.5, 0.04, 0.03]), **lc.crossing(pts([0.5, 0.04, 0.03])), "machine": mach,
            "finished": "2026-11-25 00:00 UTC"}
    (parts_dir / "rma-arar-arar__default.json").write_text(json.dumps(part))
    a = types.SimpleNamespace(modes=["rma-arar-arar"], ranks=4, inner_size=2, checkpoint_every=100, budget_min=15.0,
                              out=str(tmp_path))
    lc.render(a, ["default"], tmp_path, parts_dir)
    text = (tmp_path / "loop_closure.md").read_text()
    assert f'--truths "default" --set train.lr_g=3e-4 --out {tmp_path}\n' in text
    assert "comm.inner_size" not in text.split("Command:")[1].split("Target")[0]


def test_a_run_is_placed_against_the_ml_fit_in_units_of_its_error(lc, tmp_path):
    """(p̂ − p_ML)/σ_ML per parameter, by hand: p̂ from the last r (r = (truth − p̂)/truth), against the floor's fit
    and σ; a floor written before σ_ML was recorded says to rerun, not a number."""
    truth = [2.0, -0.5, 3.0, 1.0, -0.5, 4.0]
    r = [0.01, 0.02, 0.0, -0.05, 0.1, 0.0]  # p̂ = 1.98, -0.49, 3, 1.05, -0.45, 4
    part = {"mode": "rma-arar-arar", "truth_arg": "default", "truth": truth,
            "points": [{"epoch": 0, "time_s": 0.0, "max_abs_r": 1.0, "r": [1.0] * 6},
                       {"epoch": 100, "time_s": 1.0, "max_abs_r": 0.1, "r": r}]}
    fl = {"ml_params": [2.0, -0.5, 3.01, 1.0, -0.5, 4.0], "ml_sigma": [0.01, 0.005, 0.01, 0.025, 0.1, 1.0]}
    assert lc.from_ml(part, fl) == pytest.approx([-2.0, 2.0, -1.0, 2.0, 0.5, 0.0])
    assert lc.from_ml(part, {"ml_params": fl["ml_params"]}) is None
    parts_dir = tmp_path / "loop_closure"
    parts_dir.mkdir()
    mach = {"cpu_model": "Test CPU", "vector_flags": [], "torch_cpu_capability": "AVX2", "native_bf16": False,
            "cores": 2, "torch": "x"}
    full = {**part, "epochs": 100, "train_s": 1.0, "startup_s": 1.0, "precision": {"resolved": "float32"},
            **lc.crossing(part["points"]), "machine": mach, "finished": "2026-11-30 00:00 UTC"}
    (parts_dir / "rma-arar-arar__default.json").write_text(json.dumps(full))
    (parts_dir / "floor__default.json").write_text(json.dumps({**fl, "max_abs_r": 0.0033, "r": [0.0] * 6}))
    a = types.SimpleNamespace(modes=["rma-arar-arar"], ranks=4, inner_size=2, checkpoint_every=100, budget_min=15.0)
    lc.render(a, ["default"], tmp_path, parts_dir)
    assert "| T0 | rma-arar-arar | -2.00 | +2.00 | -1.00 | +2.00 | +0.50 | +0.00 |" in \
        (tmp_path / "loop_closure.md").read_text()


def test_the_floor_records_the_ml_fits_own_error(lc):
    """floor() writes σ_ML beside the fit: the observed information's σ (ml_covariance) at the fit on the same
    events, which the page divides by."""
    import numpy as np

    from sagips.config import load
    from sagips.io.writer import generate_subset
    from sagips_environments.proxy1d import Proxy1D

    cfg = load(str(lc.ROOT / "configs" / "proxy1d-quick.yaml"),
               ["environment.grid_points=200", "environment.reference_events=200000"])
    fl = lc.floor(cfg.environment, cfg.seed)
    n = cfg.environment.reference_events
    events = generate_subset(Proxy1D, cfg.environment, cfg.seed, n, np.array([[0, n]]))[0]["events"]
    sigma = np.sqrt(np.diag(lc.ml_covariance(events, cfg.environment, np.array(fl["ml_params"]))))
    assert fl["ml_sigma"] == pytest.approx(sigma, rel=1e-9) and all(s > 0 for s in fl["ml_sigma"])
