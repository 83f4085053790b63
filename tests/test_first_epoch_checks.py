"""The first-epoch checks (sagips.checks): each mistake of tests/_toy_variants.py fails with one line that names the
method to fix, the correct environments pass, and the checks leave the training's random numbers untouched."""
import re

import numpy as np
import pytest
import torch

from sagips import ParametricEnvironment
from sagips.checks import FirstEpochCheckError
from sagips.config import Config, from_dict
from sagips.environment import EnvironmentCheckError
from sagips.trainer import Trainer
from tests._plugins import TOY_SRC

SMALL = {"reference_events": 2000, "param_samples": 8, "events_per_sample": 10, "hidden": 8, "layers": 1}


@pytest.fixture(scope="module")
def variants():
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(TOY_SRC))
    import tests._toy_variants as v

    yield v
    mp.undo()


def make_trainer(env_cls, tmp_path, rank=0, share=None, **env_keys):
    cfg = from_dict(Config, {"train": {"epochs": 2, "log_every": 1, "progress": False, "lr_g": 1e-3, "lr_d": 1e-3,
                                       "quality_samples": 16, "chunk_rows": 0}})
    cfg.environment = from_dict(env_cls.Config, {**SMALL, **env_keys}, "environment.")
    env = env_cls(cfg.environment, "cpu", seed=3)
    env.attach_data(*env_cls.generate_reference(cfg.environment, 0), np.random.default_rng(0))
    return Trainer(cfg, env, rank, 1, str(tmp_path), share=share)


@pytest.mark.parametrize("name, start, detail", [
    ("Narrow", "build_generator: the generator outputs shape (2, 2)", "3 parameters (a, b, c)"),
    ("Narrow1", "build_generator: the generator outputs shape (2, 1)", "make its last layer 3 wide"),
    ("Detached", "density: the synthetic events do not require grad", "no .detach()"),
    ("Flat", "synthesize: the synthetic events have shape (80,) but the real events have (80, 1)", "columns"),
])
def test_each_mistake_fails_with_one_line(variants, tmp_path, name, start, detail):
    tr = make_trainer(getattr(variants, name), tmp_path)
    with pytest.raises(FirstEpochCheckError) as e:
        tr.fit(progress=False)
    msg = str(e.value)
    assert msg.startswith(start) and detail in msg and "\n" not in msg
    assert tr.state.epoch == 0  # before any training step


def test_density_that_is_nan_inside_the_bounds(variants, tmp_path):
    NaNAtLargeC = variants.NaNAtLargeC
    # the truth (c = 0.9) is fine, the box middle (c ~ 1.05) is not: the first call (here the reference data's, at
    # the truth) checks the whole box (ParametricEnvironment._check_over_box), its middle first
    with pytest.raises(EnvironmentCheckError, match=r"^density: NaN or infinite values at a=.*c=1\.[0-9]+ \(inside"):
        make_trainer(NaNAtLargeC, tmp_path, g_start=0.0)


def on_measured_data(env_cls, good_cls, tmp_path):
    """A trainer of `env_cls` on events that `good_cls` made (measured data: its first call is the first epoch's)."""
    cfg = from_dict(Config, {"train": {"epochs": 2, "log_every": 1, "progress": False, "quality_samples": 16,
                                       "chunk_rows": 0}})
    cfg.environment = from_dict(env_cls.Config, dict(SMALL), "environment.")
    env = env_cls(cfg.environment, "cpu", seed=3)
    good = from_dict(good_cls.Config, dict(SMALL), "environment.")
    env.attach_data(*good_cls.generate_reference(good, 0), np.random.default_rng(0))
    return Trainer(cfg, env, 0, 1, str(tmp_path))


def test_density_that_is_nan_inside_the_bounds_on_measured_data(variants, tmp_path):
    """The same density on data from a file (the first call is then the first epoch's): one line, before any step."""
    tr = on_measured_data(variants.NaNAtLargeC, variants.Toy1D, tmp_path)
    with pytest.raises(FirstEpochCheckError, match=r"^density: NaN or infinite values at a=.*c=1\.[0-9]+ \(inside"):
        tr.fit(progress=False)
    assert tr.state.epoch == 0


def test_a_simulator_nan_in_a_corner_of_the_box_is_one_line_before_any_work(variants, tmp_path):
    """A new user's simulator, NaN for a width below 0.3 inside bounds from 0.2: only the first call's parameters were
    checked, the generator went there mid-run, and 14 NaN steps later the run ended in a traceback that blamed the
    learning rates. Now the first call checks the simulator over the box, as a density's: at the reference data's
    generation, and at the first epoch on measured data."""
    low = type("NaNLowM", (variants.Slope,), {
        "simulate": lambda self, p, u: variants.Slope.simulate(self, p, u) / (p[:, None, :] > 0.7),
        "__module__": __name__})  # (inf below m = 0.7, of bounds 0.5-3; the truth 1.5 is fine)
    with pytest.raises(EnvironmentCheckError, match=r"^simulate: NaN or infinite events at m=0\.[56][0-9]* \(inside "
                                                    r"the bounds, where the generator can go\): narrow the bounds"):
        make_trainer(low, tmp_path)
    everywhere = variants.InfSlope  # (infinite at every point: the box's middle says so first)
    with pytest.raises(EnvironmentCheckError, match=r"^simulate: NaN or infinite events at m=1\.75 \(inside"):
        make_trainer(everywhere, tmp_path)
    tr = on_measured_data(low, variants.Slope, tmp_path)
    with pytest.raises(FirstEpochCheckError, match=r"^simulate: NaN or infinite events at m=0\.[56]"):
        tr.fit(progress=False)
    assert tr.state.epoch == 0


def test_reference_events_that_are_not_finite_are_refused(variants):
    """sagips.data wrote a simulator's NaN events without a word (a new user's file held 5,359 of them); a NaN only at
    the truth slips between the box's points, so the reference events are checked too."""
    at_truth = type("InfAtTruth", (variants.Slope,), {
        "simulate": lambda self, p, u: variants.Slope.simulate(self, p, u) / ((p[:, None, :] - 1.5).abs() > 1e-4),
        "__module__": __name__})
    cfg = from_dict(at_truth.Config, dict(SMALL), "environment.")
    with pytest.raises(EnvironmentCheckError, match=r"^simulate: 2000 of 2000 reference events at the truth \(m=1\.5\) "
                                                    r"are NaN or infinite: fix the simulator there$"):
        at_truth.generate_reference(cfg, 0)


class Ramp(ParametricEnvironment):
    """A peak on a linear background (1 + slope (x - 5) / 5) / 10 on [0, 10]: negative somewhere for |slope| > 1
    (a new user's model), with bounds that allow it."""

    name = "ramp"
    support = (0.0, 10.0)
    parameters = {"f": (0.05, 0.5), "width": (0.5, 1.5), "slope": (-2.0, 2.0)}
    true_params = {"f": 0.2, "width": 1.0, "slope": 0.5}

    def density(self, p, x):
        f, w, s = p[:, 0:1], p[:, 1:2], p[:, 2:3]
        peak = torch.exp(-0.5 * ((x - 1.0) / w) ** 2) / (w * 2.5066)
        return f * peak + (1 - f) * (1 + s * (x - 5.0) / 5.0) / 10.0


def test_a_density_negative_anywhere_in_the_box_is_one_line_before_any_work():
    """Before, only the first call's parameters were checked: rank 0's passed (slope 0.5), a later slope of 1.05
    sampled from a non-monotonic CDF without a word, and ranks started elsewhere failed mid-run with a traceback.
    Now the first call checks the box (its middle, corners and 256 fixed points), alike on every rank."""
    cfg = from_dict(Ramp.Config, dict(SMALL), "environment.")
    msgs = []
    for seed in (0, 1):  # two ranks' environments: the same line
        with pytest.raises(EnvironmentCheckError) as e:
            Ramp.generate_reference(cfg, seed)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1] and "\n" not in msgs[0]
    m = re.match(r"^density: negative or all-zero values at f=([-.0-9e]+), width=([-.0-9e]+), slope=([-.0-9e]+) "
                 r"\(inside the bounds\)", msgs[0])
    assert m and abs(float(m.group(3))) > 1.0, msgs[0]  # where the background is negative: |slope| > 1
    assert msgs[0].endswith("narrow the bounds (`parameters`, or environment.bounds) or fix the formula")
    # bounds that keep it positive: no error, and the data are drawn
    ok = type("RampOK", (Ramp,), {"parameters": {"f": (0.05, 0.5), "width": (0.5, 1.5), "slope": (-0.9, 0.9)},
                                   "__module__": __name__})
    arrays, _ = ok.generate_reference(from_dict(ok.Config, dict(SMALL), "environment."), 0)
    assert arrays["events"].shape == (SMALL["reference_events"], 1)


def test_the_box_check_keeps_off_the_bounds_and_runs_once_per_box():
    """A width bounded at 0 (no density exactly there, where the generator's sigmoid never goes) trains as before;
    the reference data, built one environment per block, check the box once (a review: +54 % per block)."""
    calls = []

    class Sharp(ParametricEnvironment):
        name = "sharp"
        support = (0.0, 1.0)
        parameters = {"mu": (0.2, 0.8), "w": (0.0, 0.3)}
        true_params = {"mu": 0.5, "w": 0.1}

        def density(self, p, x):
            calls.append(len(p))
            g = torch.exp(-0.5 * ((x - p[:, 0:1]) / p[:, 1:2]) ** 2) + 1e-3
            return torch.where(p[:, 1:2] > 0, g, torch.full_like(g, float("nan")))  # none at w = 0 exactly

    cfg = from_dict(Sharp.Config, dict(SMALL), "environment.")
    Sharp.generate_reference(cfg, 0)
    first = len(calls)
    assert first > 4  # the first call, then the box in batches of 64 (1 + 256 + 4 points)
    Sharp.generate_reference(cfg, 1)
    assert len(calls) - first == 1  # the second environment: its own first call only


@pytest.mark.parametrize("name", ["Toy1D", "Slope"])
def test_correct_environments_pass_and_train(variants, tmp_path, name):
    tr = make_trainer(getattr(variants, name), tmp_path)
    tr.fit(progress=False)
    assert tr.state.epoch == 2 and tr.checked
    assert len(tr.last_quality["params"]) == len(tr.env.parameters)


def test_checks_do_not_move_the_random_streams(variants, tmp_path):
    runs = []
    for skip in (False, True):
        torch.manual_seed(0)  # the same initial weights
        tr = make_trainer(variants.Toy1D, tmp_path / str(skip))
        tr.checked = skip  # the second run skips the checks: both must train identically
        tr.fit(progress=False)
        runs.append(tr)
    a, b = runs
    assert a.checked and torch.equal(a.env.gen.get_state(), b.env.gen.get_state())
    for (k, wa), wb in zip(a.G.state_dict().items(), b.G.state_dict().values()):
        assert torch.equal(wa, wb), k


def test_the_verdict_is_rank_0s(variants, tmp_path):
    """A rank other than 0 does not check; it raises what rank 0 found (the broadcast)."""
    seen = []

    def share(obj):
        seen.append(obj)
        return "build_generator: found on rank 0"

    tr = make_trainer(variants.Toy1D, tmp_path, rank=1)
    tr.share = share  # after the constructor (which shares rank 0's precision through it)
    with pytest.raises(FirstEpochCheckError, match="^build_generator: found on rank 0$"):
        tr.fit(progress=False)
    assert seen == [None]


def test_a_parameter_given_as_a_key_is_told_where_it_lives():
    """`sagips.data det2d --set jitter=0.3` said only "unknown config key 'environment.jitter'"."""
    from sagips.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^unknown config key 'environment\.slope': slope is a parameter: its "
                                          r"truth is environment\.true_params\.slope \(sagips\.data: --set "
                                          r"true_params\.slope=VALUE\), its range environment\.bounds\.slope "
                                          r"\(known keys"):
        from_dict(Ramp.Config, {"slope": 1.0}, "environment.")
    with pytest.raises(ConfigError, match=r"'environment\.grid_points': a simulator has no grid"):  # (kept)
        sim = type("S", (ParametricEnvironment,), {"name": "s", "parameters": {"m": (1, 2)},
                                                   "true_params": {"m": 1.5}, "simulate": lambda self, p, u: u,
                                                   "__module__": __name__})
        from_dict(sim.Config, {"grid_points": 5}, "environment.")


def test_a_clipping_simulators_infinite_events_land_on_the_edge_and_pass():
    """A simulator that sets `support` clips its events to it, +-inf too, as training sees them: the box check
    judges the clipped events (a review: it judged the raw ones, and refused what training accepts)."""
    clip = type("ClipInf", (ParametricEnvironment,), {
        "name": "clipinf", "support": (0.0, 1.0), "parameters": {"m": (0.5, 3.0)}, "true_params": {"m": 1.5},
        "simulate": lambda self, p, u: u ** (1.0 / p[:, None, :]) / (u > 0.05), "__module__": __name__})
    arrays, _ = clip.generate_reference(from_dict(clip.Config, dict(SMALL), "environment."), 0)
    ev = arrays["events"]
    assert np.isfinite(ev).all() and (ev == 1.0).mean() > 0.02  # (the infinite ones, on the edge)
