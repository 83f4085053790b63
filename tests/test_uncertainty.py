"""Issue 36: p^ +- sigma with its parts (sagips.analyze) against a hand computation, and the convergence diagnostic
(one function, stats.convergence, used by sagips.analyze and at the end of sagips.run) on synthetic runs: run
directories whose generators predict exactly known values (the output layer's weights zeroed, its bias set), so no
training is needed."""
import json
import math

import numpy as np
import pytest
import torch

from sagips.analysis import stats
from sagips.analysis.ensemble import run_end_convergence
from sagips.analyze import main
from sagips.config import from_dict
from sagips.environment import get_environment
from sagips.io.checkpoint import save_checkpoint

ENV = {"hidden": 8, "layers": 1, "subset_fraction": 0.5}
EPOCHS = [1, 200, 400, 600, 800, 900, 1000]


def proxy1d():
    cls = get_environment("proxy1d")
    cfg = from_dict(cls.Config, dict(ENV), "environment.")
    cfg.name = "proxy1d"
    return cls(cfg, "cpu", 0), cfg


def fixed_generator(env, p):
    """A generator whose physical prediction is p (6,) for every noise vector."""
    G = env.build_generator()
    u = (torch.tensor(p, dtype=torch.float64) - env.pmin.double()) / (env.pmax - env.pmin).double()
    with torch.no_grad():
        G[-2].weight.zero_()
        G[-2].bias.copy_(torch.logit(u).float())
    return G


def write_run(path, mode, preds, seed=1, member=0, split=None, events=None, nonclosure=None):
    """preds: {epoch: (R, 6)} -> a sagips.run output directory with R ranks; split = [index, parts] of
    ensemble.data=split; events: the reference data's size in run.json (what analyze's Cramér-Rao bound needs);
    nonclosure: the run's analysis.nonclosure (None: a run.json from before the option)."""
    env, cfg = proxy1d()
    ranks = len(next(iter(preds.values())))
    info = {"environment": "proxy1d", "mode": mode, "world_size": ranks, "member": member,
            "truth": list(cfg.true_params), "config": {"seed": seed, "environment": {"name": "proxy1d", **ENV}}}
    if split is not None:
        info["config"]["ensemble"] = {"data": "split"}
        info["reference_data"] = {"split": list(split)}
    if events is not None:
        info.setdefault("reference_data", {})["events"] = events
    if nonclosure is not None:
        info["config"]["analysis"] = {"nonclosure": nonclosure}
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(info))
    for epoch, rows in preds.items():
        for rank, p in enumerate(rows):
            save_checkpoint(path, rank, epoch, float(epoch), fixed_generator(env, p), "proxy1d")
    return cfg


def series(truth, offsets, slope=None):
    """{epoch: (R, 6)}: truth + offsets (R, 6) at every epoch, plus slope (6,) * epoch."""
    slope = np.zeros(6) if slope is None else np.asarray(slope)
    return {e: np.asarray(truth) + np.asarray(offsets) + slope * e for e in EPOCHS}


@pytest.fixture(scope="module")
def truth():
    return np.asarray(proxy1d()[1].true_params)


def test_sigma_against_a_hand_computation(tmp_path, truth):
    rng = np.random.default_rng(5)
    offsets = rng.normal(0, 0.01, size=(4, 6)) * np.abs(truth)
    slope = np.zeros(6)
    slope[2] = 2e-4  # parameter 2 still moves: 0.04 over the last 20 %, twice the members' spread (0.021)
    slope[0] = 1e-5  # parameter 0 moves 0.002, inside its spread (0.0044): not a part of sigma
    # four independent members of one job (one rank each, --mode ensemble, the same seed: one data set)
    for m in range(4):
        write_run(tmp_path / "job" / f"member{m:03d}", "ensemble", series(truth, offsets[m:m + 1], slope), member=m)
    rc = main([str(tmp_path / "job"), "--out", str(tmp_path / "rep"), "--noise-samples", "8", "--resamples", "5",
               "--final-noise-samples", "16"])
    assert rc == 0
    u = json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]["uncertainty"]
    last = truth + offsets + slope * 1000
    s = np.array([math.sqrt(sum((last[m, i] - last[:, i].mean()) ** 2 for m in range(4)) / 3) for i in range(6)])
    factor = math.sqrt(0.5 / (1 - 0.5) + 1 / 4)  # half-sampling: seen/(1-seen) + 1/M
    drift = np.zeros(6)
    drift[[0, 2]] = slope[[0, 2]] * (1000 - 800)  # the window: epochs 800, 900, 1000 (the last 20 %)
    added = drift > s * factor
    assert list(added) == [False, False, True, False, False, False]
    in_sigma = np.where(added, drift, 0.0)
    assert u["n_members"] == 4 and u["spread_from"] == "members" and u["factor"] == pytest.approx(factor)
    np.testing.assert_allclose(u["p_hat"], last.mean(0), rtol=0, atol=2e-6)  # float32 generators
    np.testing.assert_allclose(u["scatter"], s, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(u["members"], s * factor, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(u["drift"], drift, rtol=1e-3, atol=2e-6)
    np.testing.assert_allclose(u["sigma"], np.sqrt((s * factor) ** 2 + in_sigma ** 2), rtol=1e-3, atol=2e-6)
    assert u["drift_added"] == list(added)
    conv = json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]["convergence"]
    # moved beyond the members' spread: still moving (r_2); r_0 moved inside its own, but its valley partner r_2
    # (+95 % in proxy1d's information at p^) moves: not judged (stats.convergence's correlation)
    assert [c["moving"] for c in conv] == [None, False, True, False, False, False]
    assert "but r_2, +95 % correlated with it" in conv[0]["message"]
    assert conv[2]["message"].endswith("train longer, or raise environment.events_per_sample")
    assert u["ranks"] == [None] * 6  # one rank per run: no spread inside a run
    assert u["sampling"] == pytest.approx([0.0] * 6, abs=1e-7)  # every noise vector gives the same prediction
    from scipy import stats as st
    # sigma's degrees of freedom (Welch-Satterthwaite): M - 1 = 3 where it is the members' spread alone, more for
    # parameter 2, whose drift is a known part; the intervals are Student's t quantiles at those
    dof = 3 * (np.sqrt((s * factor) ** 2 + in_sigma ** 2) / (s * factor)) ** 4
    np.testing.assert_allclose(u["dof"], dof, rtol=1e-3)
    assert u["dof"][0] == pytest.approx(3) and u["dof"][2] > 3
    np.testing.assert_allclose(u["k68"], st.t.ppf(0.5 + 0.6826895 / 2, dof), rtol=1e-4)
    np.testing.assert_allclose(u["k95"], st.t.ppf(0.5 + 0.9544997 / 2, dof), rtol=1e-4)
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "the 68 % interval is ±" in md and "| noise (K) |" in md and "(not in σ)" in md
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "## Parameters: p̂ ± σ (what to quote)" in md and (tmp_path / "rep" / "uncertainty.png").stat().st_size
    # p^ to quote: to sigma's last shown decimal (sigma to 4 significant digits), never rounded by a part of sigma
    names = json.loads((tmp_path / "rep" / "summary.json").read_text())["parameters"]
    for name, p, sg in zip(names, u["p_hat"], u["sigma"]):
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| {name} |"))
        shown_p, shown_s = (float(v) for v in row.split(" | ")[2].split(" ± "))
        assert abs(shown_p - p) <= 5e-4 * sg and abs(shown_s - sg) <= 5e-4 * sg, row


def test_p_hat_is_shown_to_the_decimals_of_its_sigma():
    from sagips.analyze import _pm

    assert _pm(1.489571, 0.004042) == "1.489571 ± 0.004042"  # (4 significant digits: "1.49", 0.1 sigma off)
    assert _pm(123.456, 12.3) == "123.46 ± 12.3" and _pm(2.5, 0.0) == "2.5 ± 0"


def test_a_range_that_rounds_to_one_value_is_shown_once():
    from sagips.analyze import t_note

    u = {"spread_from": "members", "n_members": 8, "notes": [], "dof": [7.21, 7.24], "k68": [1.08, 1.08],
         "k95": [2.31, 2.36]}
    note = t_note(u)
    assert "(7 degrees of freedom; σ as a whole 7.2, as its" in note, note
    assert "±1.08σ" in note and "±2.31-2.36σ" in note, note
    # a sigma that its known parts (the data's floor) set has huge dof: said as such, not as 216-795934889
    note = t_note(dict(u, n_members=2, dof=[216.4, 7.9e8], k68=[1.0, 1.0], k95=[1.97, 2.0]))
    assert "(1 degree of freedom; σ as a whole over 100, as" in note and "795" not in note, note
    assert "whole 7.2 to over 100, as" in t_note(dict(u, dof=[7.2, 3e5])), t_note(dict(u, dof=[7.2, 3e5]))
    assert "whole 100, as" in t_note(dict(u, dof=[99.7, 100.3]))  # (one value when both round to it)
    # below 10, one decimal: t's factor moves fast there (1.84 degrees of freedom give ±4.93σ, 2 give ±4.53σ)
    assert "whole 1.8-12, as" in t_note(dict(u, n_members=2, dof=[1.84, 12.4]))


def test_measured_data_without_a_truth_get_no_pulls(tmp_path, truth):
    """Members trained on a user's data file that names no truth (run.json truth_known false, sagips.run): the
    truth column says unknown, the pulls are n/a, and the report says why (residuals against a placeholder)."""
    from sagips.io.refdata import NO_TRUTH, NO_TRUTH_ANALYSIS

    offsets = np.random.default_rng(3).normal(0, 0.01, size=(2, 6)) * np.abs(truth)
    for m in range(2):
        path = tmp_path / "job" / f"member{m:03d}"
        write_run(path, "ensemble", series(truth, offsets[m:m + 1]), member=m)
        info = json.loads((path / "run.json").read_text())
        (path / "run.json").write_text(json.dumps({**info, "truth_known": False}))
    assert main([str(tmp_path / "job"), "--out", str(tmp_path / "rep"), "--noise-samples", "4", "--resamples", "2",
                 "--final-noise-samples", "4"]) == 0
    md = (tmp_path / "rep" / "summary.md").read_text()
    rows = [ln.split(" | ") for ln in md.splitlines() if ln.startswith("| r_")][:6]
    assert [r[1] for r in rows] == ["unknown"] * 6 and [r[8] for r in rows] == ["n/a"] * 6
    assert md.count(NO_TRUTH_ANALYSIS) == 2 and NO_TRUTH not in md  # under the p^ +- sigma table and in place of the residuals' (Table IV)
    assert "| Residual [10⁻³] |" not in md and f"Not shown here: {NO_TRUTH_ANALYSIS}." in md
    g = json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]
    assert g["truth_known"] is False and g["uncertainty"]["pull"] == [None] * 6
    # nothing against the placeholder truth in the JSON: neither the truth nor a residual
    assert g["truth"] is None and g["residual"] is None and g["rmse_1e3"] is None and g["rmse_vs_spread"] is None
    assert g["final"]["residual_1e3"] is None and g["final"]["residual_sigma_1e3"] is None
    # no residual against the placeholder in the CSV either, nor in a figure; p̂ ± σ's figure draws no truth; the
    # CSV holds p̂ ± σ, the numbers to quote
    rows = [ln.split(",") for ln in (tmp_path / "rep" / "summary.csv").read_text().splitlines()]
    assert rows[0][-2:] == [f"{g['name']} p_hat", f"{g['name']} p_hat sigma"]
    assert [r[1:4] for r in rows[1:7]] == [["unknown", "", ""]] * 6
    np.testing.assert_allclose([[float(r[-2]), float(r[-1])] for r in rows[1:7]],
                               np.c_[g["uncertainty"]["p_hat"], g["uncertainty"]["sigma"]], rtol=1e-12)
    assert sorted(p.name for p in (tmp_path / "rep").glob("*.png")) == ["uncertainty.png"]
    assert "![uncertainty](uncertainty.png)" in md and "residuals_vs_time" not in md


def test_one_coupled_run_gives_a_rank_spread_lower_bound(tmp_path, truth):
    offsets = np.array([[0.01] * 6, [-0.01] * 6]) * np.abs(truth)
    slope = np.zeros(6)
    slope[1] = 2e-4  # moves 0.04 over the last 20 %, far beyond the ranks' spread: not judged against a lower bound
    write_run(tmp_path / "arar", "arar", series(truth, offsets, slope))
    assert main([str(tmp_path / "arar"), "--out", str(tmp_path / "rep"), "--noise-samples", "4",
                 "--resamples", "2", "--final-noise-samples", "4"]) == 0
    u = json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]["uncertainty"]
    ranks = np.abs(offsets[0] - offsets[1]) / math.sqrt(2)  # the sample std of two values
    assert u["n_members"] == 1 and u["spread_from"] == "ranks" and "lower bound" in u["notes"][0]
    np.testing.assert_allclose(u["ranks"], ranks, rtol=1e-3)
    drift = np.where(np.arange(6) == 1, 2e-4 * 200, 0.0)  # a lower-bound spread: the drift is always in sigma
    np.testing.assert_allclose(u["sigma"], np.sqrt((ranks / math.sqrt(2)) ** 2 + drift ** 2), rtol=1e-3, atol=2e-6)
    conv = json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]["convergence"]
    assert [c["moving"] for c in conv] == [False, None, False, False, False, False]  # as at the end of sagips.run
    assert "lower bound" in conv[1]["message"] and "--ensemble-size" in conv[1]["message"]


def test_factor_for_independent_data_sets_and_whole_data():
    assert stats.members_factor(0.5, 4, shared_data=False) == pytest.approx(0.5)
    assert stats.members_factor(1.0, 9, shared_data=True) == pytest.approx(1 / 3)
    assert stats.seen_fraction(0.5, 1) == pytest.approx(0.5)
    # two ranks that exchange gradients at f = 0.5: variance (1 - f) / (R f) = 0.5 sigma_stat^2 -> seen = 2/3
    assert stats.seen_fraction(0.5, 2) == pytest.approx(2 / 3)
    assert 1 / stats.seen_fraction(0.5, 4) - 1 == pytest.approx(0.25)


def test_diagnostic_flags_a_run_stopped_early_and_passes_a_converged_one():
    epochs = np.arange(50, 2001, 50)
    names = ["mu", "res"]
    sigma = np.array([0.01, 0.02])
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.002, size=(len(epochs), 2))
    # approaching its value as exp(-epoch/800): stopped at 2000, the weak parameter moves 0.053 over the last 20 %
    early = np.stack([np.full(len(epochs), 1.0), 0.3 - np.exp(-epochs / 800)], 1) + noise
    conv = stats.convergence(names, epochs, early, sigma)
    assert [c["moving"] for c in conv] == [False, True]
    assert conv[1]["message"].startswith("res moved ") and conv[1]["message"].endswith(
        "σ over the last 20 % of epochs (1600-2000): train longer, or raise environment.events_per_sample")
    assert conv[1]["z"] > 2
    converged = np.stack([np.full(len(epochs), 1.0), 0.3 - np.exp(-epochs / 100)], 1) + noise
    assert [c["moving"] for c in stats.convergence(names, epochs, converged, sigma)] == [False, False]
    # no spread: the movement is reported, not judged
    alone = stats.convergence(names, epochs, early, np.array([np.nan, 0.0]))
    assert [c["moving"] for c in alone] == [None, None] and "no spread between members" in alone[1]["message"]


def test_run_end_diagnostic_reads_the_metrics(tmp_path):
    epochs = list(range(100, 1001, 100))
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        for e in epochs:
            fh.write(json.dumps({"epoch": e, "params": [1.0, 0.3 + 1e-4 * e]}) + "\n")
    final = {"params": [1.0, 0.4], "rank_params": [[0.99, 0.39], [1.01, 0.41], [1.0, 0.4], [1.0, 0.4]]}
    info = {"mode": "ensemble", "config": {"environment": {"subset_fraction": 0.5}}}
    conv, what = run_end_convergence(tmp_path, info, final, ["mu", "res"])
    assert "4 independent ranks" in what
    assert conv[1]["moving"] and conv[1]["moved"] == pytest.approx(0.02)  # epochs 800-1000
    assert not conv[0]["moving"]
    single = run_end_convergence(tmp_path, {"mode": "arar"}, {"params": [1.0, 0.4]}, ["mu", "res"])
    assert single[0][1]["moving"] is None and single[1].startswith("one rank")
    # ranks that exchange gradients: their spread is a lower bound of sigma. Movement below it is convergence;
    # movement above it is not judged (it may be inside the statistical error): the message says how to judge it
    coupled, what = run_end_convergence(tmp_path, {"mode": "arar"}, final, ["mu", "res"])
    assert "training noise only" in what
    assert coupled[0]["moving"] is False and coupled[1]["moving"] is None
    assert "lower bound" in coupled[1]["message"] and "--ensemble-size" in coupled[1]["message"]
    # a member of a job of several (--ensemble-size 4): not told to train several members, but where they are
    job = tmp_path / "job"
    for m, pos in ((0, "arar"), (3, "ensemble")):
        member = job / f"member{m:03d}"
        member.mkdir(parents=True, exist_ok=True)
        (member / "metrics.jsonl").write_text((tmp_path / "metrics.jsonl").read_text())
        got, what = run_end_convergence(member, {"mode": pos, "ensemble_members": 4, "member": m},
                                        {"params": [1.0, 0.4]}, ["mu", "res"])
        assert what.startswith(f"member {m} of 4, one rank") and got[1]["moving"] is None
        assert got[1]["message"].endswith(f"the job's 4 members judge it: python -m sagips.analyze {job}")
        assert "train several members" not in got[1]["message"]
    got, _ = run_end_convergence(job / "member000", {"mode": "arar", "ensemble_members": 2, "member": 0}, final,
                                 ["mu", "res"])  # a member of 4 exchanging ranks: a lower bound, the job judges it
    assert got[1]["moving"] is None and got[1]["message"].endswith(f"members judge it: python -m sagips.analyze {job}")


def test_the_data_error_judges_only_a_lower_bound_and_only_where_it_is_larger():
    epochs = np.arange(100, 1001, 100)
    series = np.stack([np.full(len(epochs), 1.0), 0.3 + 1e-4 * epochs], 1)  # res moves 0.02 over the last 20 %
    floor = np.array([0.005, 0.005])
    # the ranks' spread (0.03) is larger than the data's error: judged against it, converged
    ranks = stats.convergence(["mu", "res"], epochs, series, np.array([0.03, 0.03]), lower_bound=True,
                              floor=np.array([0.02, 0.02]))  # (1 bound: under stats.DRIFT_BOUNDS)
    assert ranks[1]["moving"] is False and ranks[1]["sigma"] == pytest.approx(0.03) and "ranks' spread" in \
        ranks[1]["message"]
    # independent members (no lower bound): the members' spread is sigma, the bound does not enter
    members = stats.convergence(["mu", "res"], epochs, series, np.array([0.01, 0.01]), floor=np.array([1.0, 1.0]))
    assert members[1]["moving"] is True and members[1]["sigma"] == pytest.approx(0.01)
    assert "Cramér-Rao" not in members[1]["message"]
    # members that barely move but stand far apart (more than FAR_FROM_FLOOR of the data's error): not converged
    slow = np.stack([np.full(len(epochs), 1.0), 0.3 + 5e-6 * epochs], 1)  # res moves 0.001 (0.2 bounds)
    apart = stats.convergence(["mu", "res"], epochs, slow, np.array([0.2, 0.2]), floor=floor)
    assert apart[0]["moving"] is None and apart[1]["moving"] is None and apart[1]["z"] == pytest.approx(0.005)
    assert apart[1]["message"].startswith("res: not judged: the members' spread puts σ at 40x the data's error (σ 0.2, ")
    assert apart[1]["message"].endswith("train longer (train.epochs)") and "\n" not in apart[1]["message"]
    # far apart, and still moving by 4 of the data's bounds (0.1σ): still moving, not merely "not judged"
    assert [c["moving"] for c in stats.convergence(["mu", "res"], epochs, series, np.array([0.2, 0.2]),
                                                   floor=floor)] == [None, True]
    near = stats.convergence(["mu", "res"], epochs, series, np.array([0.2, 0.2]), floor=np.array([0.05, 0.05]))
    assert [c["moving"] for c in near] == [False, False]  # 4x: within what members at their floor can show


class _Density:
    """A density environment's Fisher information per event (diagonal: the Cramér-Rao bound is 1/sqrt(I N))."""
    pipeline_method = "density"

    def __init__(self, info):
        self.info = np.diag(info)

    def fisher(self, p):
        np.testing.assert_allclose(p, [1.0, 0.4])  # at the run's final p^ (final_quality params)
        return self.info


def test_a_coupled_run_of_a_density_is_judged_against_its_data_error(tmp_path):
    """One run of exchanging ranks has no members, but a density knows its data's error (the Cramér-Rao bound):
    a parameter that moved more than that is still moving, one that moved less has converged, at the end of the run
    as in stats.convergence (sagips.analyze passes the bound it computes)."""
    epochs = list(range(100, 1001, 100))
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        for e in epochs:
            fh.write(json.dumps({"epoch": e, "params": [1.0, 0.3 + 1e-4 * e]}) + "\n")  # res moves 0.02 at the end
    final = {"params": [1.0, 0.4], "rank_params": [[1.0, 0.4001], [1.0, 0.3999]]}  # ranks agree: 1.4e-4
    info = {"mode": "arar", "reference_data": {"events": 10_000}}
    # data error 0.005 for res (I = 4 per event, N = 1e4): 0.02 is 4 sigma of the data -> still moving
    moving, _ = run_end_convergence(tmp_path, info, final, ["mu", "res"], _Density([4.0, 4.0]))
    assert moving[1]["moving"] is True and moving[1]["z"] == pytest.approx(4.0, rel=1e-3)
    assert moving[1]["sigma"] == pytest.approx(0.005) and moving[0]["sigma"] == pytest.approx(0.005)
    assert "Cramér-Rao" in moving[1]["message"] and "train longer" in moving[1]["message"]
    assert moving[0]["moving"] is False
    # data error 0.05: 0.02 is inside it -> converged, judged against the data's error, not the ranks' agreement
    still, what = run_end_convergence(tmp_path, info, final, ["mu", "res"], _Density([0.04, 0.04]))
    assert still[1]["moving"] is False and "Cramér-Rao" in still[1]["message"]
    assert "Cramér-Rao bound where it is larger" in what
    # a simulator (no density) or an unknown data size: not judged, as before
    for env, inf in ((None, info), (_Density([4.0, 4.0]), {"mode": "arar"})):
        assert run_end_convergence(tmp_path, inf, final, ["mu", "res"], env)[0][1]["moving"] is None


def test_independent_ranks_far_apart_are_not_called_converged_at_the_run_end(tmp_path):
    """--mode ensemble: the ranks are independent members, and the end of the run judges them as sagips.analyze does,
    with the data's Cramér-Rao bound: members that stand many bounds apart and barely move have not met (seen: a
    300-epoch proxy1d run read "converged" for every parameter at the run's end while analyze judged none of four)."""
    epochs = list(range(100, 1001, 100))
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        for e in epochs:
            fh.write(json.dumps({"epoch": e, "params": [1.0, 0.4 - 1e-6 * e]}) + "\n")  # res barely moves
    info = {"mode": "ensemble", "reference_data": {"events": 10_000},
            "config": {"environment": {"subset_fraction": 1}}}
    apart = {"params": [1.0, 0.4], "rank_params": [[1.0, 0.3], [1.0, 0.5], [1.0, 0.35], [1.0, 0.45]]}
    bound = 1 / math.sqrt(4.0 * 10_000)  # 0.005
    got, what = run_end_convergence(tmp_path, info, apart, ["mu", "res"], _Density([4.0, 4.0]))
    assert "Cramér-Rao" in what
    # res: the four ranks' mean has an error of std/2 = 0.0456 = 9 bounds, beyond FAR_FROM_FLOOR: not judged
    assert got[1]["moving"] is None and got[1]["message"].startswith("res: not judged: the members' spread puts σ at ")
    assert got[1]["sigma"] > stats.FAR_FROM_FLOOR * bound
    assert got[0]["moving"] is False and got[0]["sigma"] == pytest.approx(bound)  # mu: they agree; the data's floor
    # without the environment (no bound) the same run reads converged: the defect the floor mends
    assert run_end_convergence(tmp_path, info, apart, ["mu", "res"])[0][1]["moving"] is False
    # ranks near the data's floor are judged: every rank learned from all the data, so σ is their training noise
    # (the error of the mean of 4) and the bound in quadrature, and res moved 0.0002 < σ
    near = {"params": [1.0, 0.4], "rank_params": [[1.0, 0.395], [1.0, 0.405], [1.0, 0.4], [1.0, 0.4]]}
    got, _ = run_end_convergence(tmp_path, info, near, ["mu", "res"], _Density([4.0, 4.0]))
    noise = math.sqrt(2 * 0.005 ** 2 / 3) / 2
    assert [c["moving"] for c in got] == [False, False]
    assert got[1]["sigma"] == pytest.approx(math.hypot(noise, bound)) and got[0]["sigma"] == pytest.approx(bound)


def test_a_window_that_spans_the_whole_run_judges_nothing():
    """Records only at the run's first and last epoch (a short run, or checkpoints sparser than it): how far a fit
    moved since its start says nothing of whether it has settled, so neither "converged" nor "still moving" (seen: a
    2-epoch proxy1d run read "converged" for every parameter, its ranks unmoved from the box's middle)."""
    names = ["mu", "res"]
    for epochs, series in (([1, 2], [[1.0, 0.3], [1.0, 0.3]]), ([1, 3000], [[1.0, 0.3], [1.2, 0.3]])):
        got = stats.convergence(names, epochs, np.asarray(series), np.array([0.01, 0.01]))
        assert [c["moving"] for c in got] == [None, None]
        msg = got[1]["message"]
        assert msg.startswith(f"res: not judged: its only checkpoints in the window ({epochs[0]}-{epochs[1]}) are "
                              f"the run's first and last") and "\n" not in msg
        assert msg.endswith("lower train.checkpoint_every or train longer")
    # fewer than two records in the last 20 % (the window reaches back to the last two): not called converged (seen:
    # a 20-epoch run, a record every 5, "converged (0.0σ)" at max|r| 0.99), but a movement beyond σ is still moving
    few = stats.convergence(names, [1, 500, 1000], np.array([[1.0, 0.3], [1.2, 0.3], [1.2, 0.32]]),
                            np.array([0.01, 0.01]))
    assert [c["moving"] for c in few] == [None, True] and few[0]["window"] == [500, 1000]
    assert few[0]["message"] == ("mu: not judged: too few checkpoints in the last 20 % of epochs to say that it "
                                 "has settled (it moved 0.0σ between its last two, 500-1000): lower "
                                 "train.checkpoint_every or train longer")
    # at the run end the records are metrics.jsonl's: the advice names train.log_every
    logged = stats.convergence(names, [1, 500, 1000], np.array([[1.0, 0.3], [1.2, 0.3], [1.2, 0.32]]),
                               np.array([0.01, 0.01]), records=("log records", "train.log_every"))
    assert logged[0]["message"].endswith("lower train.log_every or train longer")
    assert logged[1]["message"].startswith("res moved 2.0σ between its last two log records (too few in the last "
                                           "20 % of epochs: lower train.log_every)")
    # a third record: the last two are judged as before, also where the series starts late (pruned checkpoints)
    late = stats.convergence(names, [800, 900, 1000], np.array([[1.0, 0.3], [1.0, 0.31], [1.0, 0.32]]),
                             np.array([0.01, 0.01]))
    assert [c["moving"] for c in late] == [False, True] and late[1]["z"] == pytest.approx(2.0)
    three = stats.convergence(names, [1, 2500, 3000], np.array([[1.0, 0.3], [1.2, 0.3], [1.2, 0.3]]),
                              np.array([0.01, 0.01]))
    assert [c["moving"] for c in three] == [False, False] and three[0]["window"] == [2500, 3000]


def test_a_fit_that_still_moves_by_bounds_of_the_data_is_not_converged_whatever_its_spread():
    """Members far apart make sigma wide (3 Cramér-Rao bounds here): a movement of 2.5 bounds over the last 20 % is
    0.83 sigma, under the sigma rule, but the fit has not settled at the data's precision (seen: a new user's
    detector resolution, each member still climbing from an early collapse, "converged" 3-4 sigma_ML below the ML
    fit). Judged and added to sigma alike; 1.2 bounds is still converged, and without the bound nothing changes."""
    epochs = np.arange(100, 1001, 100)
    b = np.array([1e-3, 1e-3])
    series = np.stack([0.3 + 2.5e-3 * (epochs - 800) / 200, 5.0 + 1.2e-3 * (epochs - 800) / 200], 1)
    spread = 3 * b
    got = stats.convergence(["res", "mu"], epochs, series, spread, floor=b)
    assert [c["moving"] for c in got] == [True, False], got
    assert got[0]["z"] == pytest.approx(2.5 / 3) and got[0]["message"] == (
        "res moved 2.5 Cramér-Rao bounds of the data (0.8σ; the members' spread is wide) over the last 20 % of epochs "
        "(800-1000): it has not settled at the data's precision: train longer, or raise environment.events_per_sample")
    assert [c["moving"] for c in stats.convergence(["res", "mu"], epochs, series, spread)] == [False, False]
    # one run of exchanging ranks whose spread is wide (a lower bound of sigma): the same rule
    ranks = stats.convergence(["res", "mu"], epochs, series, spread, lower_bound=True, floor=b)
    assert [c["moving"] for c in ranks] == [True, False] and "Cramér-Rao bounds" in ranks[0]["message"], ranks
    moved = np.array([2.5e-3, 1.2e-3])
    sigma, added = stats.compose_sigma(spread, moved, np.zeros(2), True, bound=b)
    assert added.tolist() == [True, False]
    np.testing.assert_allclose(sigma, [math.hypot(3e-3, 2.5e-3), 3e-3], rtol=1e-12)
    assert not stats.compose_sigma(spread, moved, np.zeros(2), True)[1].any()


def test_a_parameter_is_not_converged_while_its_valley_partner_still_moves(tmp_path):
    """Two parameters 99 % correlated in the data's information move together along their valley, each by its own
    share of its σ: one that moved less than 1σ is not called converged while its partner moved more (seen: proxy1d
    after 300 of 4,000 epochs, r_0 0.6σ and 14σ from its truth, r_1 1.4σ)."""
    epochs = np.arange(100, 1001, 100)
    series = np.stack([1.0 + 2.5e-6 * epochs, 0.3 + 1e-5 * epochs, np.full(len(epochs), 2.0)], 1)
    sigma = np.array([0.001, 0.001, 0.001])  # over 800-1000: mu 0.5σ, res 2σ, k 0
    names = ["mu", "res", "k"]
    corr = np.array([[1.0, 0.99, 0.0], [0.99, 1.0, 0.0], [0.0, 0.0, 1.0]])
    alone = stats.convergence(names, epochs, series, sigma)
    assert [c["moving"] for c in alone] == [False, True, False]
    got = stats.convergence(names, epochs, series, sigma, correlation=corr)
    assert [c["moving"] for c in got] == [None, True, False]  # k, uncorrelated, keeps its verdict
    assert got[0]["z"] == pytest.approx(0.5) and got[0]["message"] == (
        "mu: not judged: it moved 0.5σ over the last 20 % of epochs (800-1000), but res, +99 % correlated with it in "
        "the data's information, still moves, and along such a valley they move together: train longer, or raise "
        "environment.events_per_sample")
    # a correlation of another size (not this run's parameters) is not used
    assert [c["moving"] for c in stats.convergence(names, epochs, series, sigma, correlation=np.eye(2))] == [
        False, True, False]
    weak = corr.copy()
    weak[0, 1] = weak[1, 0] = -0.9  # below stats.CORRELATION_WARN: each judged on its own
    assert [c["moving"] for c in stats.convergence(names, epochs, series, sigma, correlation=weak)] == [False, True,
                                                                                                     False]
    # the correlation comes from the data's information, at the end of a run as in analyze: I = inverse of the
    # covariance [[1, .99], [.99, 1]] (unit bounds per event), so the estimates are +99 % correlated
    info = np.linalg.inv(np.array([[1.0, 0.99], [0.99, 1.0]]))
    np.testing.assert_allclose(stats.information_correlation(info), [[1.0, 0.99], [0.99, 1.0]])
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        for e in epochs:
            fh.write(json.dumps({"epoch": int(e), "params": [1.0 + 2.5e-6 * e, 0.4 + 1e-5 * e]}) + "\n")

    class Valley(_Density):
        def fisher(self, p):
            return info

    final = {"params": [1.0, 0.4], "rank_params": [[1.0, 0.4], [1.0, 0.4]]}  # ranks agree: the data's error judges
    run = {"mode": "arar", "reference_data": {"events": 10}}  # bound sqrt(1/10) = 0.316: nothing moves against it
    moved = {"mode": "arar", "reference_data": {"events": 10 ** 6}}  # bound 0.001: mu 0.5σ, res 2σ
    assert [c["moving"] for c in run_end_convergence(tmp_path, run, final, ["mu", "res"], Valley([1, 1]))[0]] == [
        False, False]
    got, _ = run_end_convergence(tmp_path, moved, final, ["mu", "res"], Valley([1, 1]))
    assert [c["moving"] for c in got] == [None, True] and "res, +99 % correlated" in got[0]["message"]


def test_a_parameter_is_not_converged_while_a_partner_still_moving_shifts_its_best_value():
    """A partner correlated with it at any size, still moving, shifts the data's best value of a parameter by the
    regression slope C_ij / C_jj of the data's covariance C = I^-1 per unit of its own movement: where that exceeds
    the parameter's sigma it is not called converged (seen: proxy1d at T1, the d valley -0.6 correlated with the still
    moving u valley, "converged" 3-4 sigma_ML from the data's ML fit). The slope here comes from C itself, not from
    the correlation and the bounds the diagnostic uses."""
    cov = np.array([[4.0, -1.3, 0.0], [-1.3, 1.0, 0.1], [0.0, 0.1, 1.0]])  # per event; rho_01 = -0.65
    n = 10 ** 6
    bound = np.sqrt(np.diag(cov) / n)
    corr = stats.information_correlation(np.linalg.inv(cov))
    epochs = np.arange(100, 1001, 100)
    # over 800-1000: mu moves 3 of its bounds, res 0.4 of its, k 0.2 of its
    series = np.stack([1.0 + 3 * bound[0] / 200 * epochs, 0.3 + 0.4 * bound[1] / 200 * epochs,
                       2.0 + 0.2 * bound[2] / 200 * epochs], 1)
    names = ["mu", "res", "k"]
    alone = stats.convergence(names, epochs, series, bound, lower_bound=True, floor=bound)
    assert [c["moving"] for c in alone] == [True, False, False]
    got = stats.convergence(names, epochs, series, bound, lower_bound=True, floor=bound, correlation=corr)
    shift = abs(cov[1, 0] / cov[0, 0] * (series[-1, 0] - series[-3, 0])) / bound[1]  # 0.325 * 6e-3 / 1e-3 = 1.95
    assert shift == pytest.approx(1.95)
    assert [c["moving"] for c in got] == [True, None, False]  # k: 0.05 x 3 bounds shifts it 0.15 of its own
    assert got[1]["message"] == (
        "res: not judged: it moved 0.4σ over the last 20 % of epochs (800-1000), but mu still moves, and at -65 % "
        f"correlation in the data's information its movement shifts the data's best res by {shift:.1f}σ: "
        "train longer, or raise environment.events_per_sample")
    # a partner that moves less, so that the shift stays under 1σ, leaves the verdict alone: 1.5 bounds x 0.65 = 0.98
    slow = series.copy()
    slow[:, 0] = 1.0 + 1.5 * bound[0] / 200 * epochs
    assert [c["moving"] for c in stats.convergence(names, epochs, slow, bound, lower_bound=True, floor=bound,
                                                   correlation=corr)] == [True, False, False]
    # a sigma below the data's bound (members' spread on split data): the shift is judged against the bound, so a
    # shift of 0.36 bounds (rho 0.3 x 1.2 bounds) does not call a parameter with sigma 0.3 bounds unsettled
    b2 = np.array([1e-3, 1e-3])
    weak = np.array([[1.0, 0.3], [0.3, 1.0]])
    pair = np.stack([1.0 + 1.2e-3 / 200 * epochs, 0.3 + 0.06e-3 / 200 * epochs], 1)  # mu 1.2 bounds, res 0.06
    got = stats.convergence(["mu", "res"], epochs, pair, np.array([1e-3, 0.3e-3]), floor=b2, correlation=weak)
    assert [c["moving"] for c in got] == [True, False]


    # without the data's bounds, only the valley rule (CORRELATION_WARN) applies
    assert [c["moving"] for c in stats.convergence(names, epochs, series, bound, lower_bound=True,
                                                   correlation=corr)] == [None, False, False]


def test_t_quantile_against_scipy():
    from scipy import stats as st
    for dof in (1, 2, 3, 4, 7, 19, 100, 5000, math.inf):
        for q in (0.5, 0.8413, 0.97725, 0.995):
            want = st.t.ppf(q, dof) if math.isfinite(dof) else st.norm.ppf(q)
            assert stats.t_quantile(q, dof) == pytest.approx(want, rel=1e-6, abs=1e-9), (dof, q)
    assert stats.interval_factor(stats.P68, math.inf) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError):
        stats.t_quantile(0.3, 3)


def test_noise_sampling_error_is_the_spread_of_p_hat_between_noise_batches(tmp_path, truth):
    """Generators that map their noise to a spread of parameters: the Monte-Carlo error analyze reports for K noise
    vectors must match how much p^ really moves from one noise batch (analyze --seed) to the next."""
    from sagips.analysis.ensemble import expand_run_dirs, group_uncertainty, load_run, predict_final, predict_group

    env, cfg = proxy1d()
    info = {"environment": "proxy1d", "mode": "ensemble", "world_size": 2, "member": 0,
            "truth": list(cfg.true_params), "config": {"seed": 1, "environment": {"name": "proxy1d", **ENV}}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(info))
    torch.manual_seed(3)
    for rank in range(2):
        G = env.build_generator()
        with torch.no_grad():
            G[-2].weight.mul_(3e3)  # the output now follows the noise (noise_scale 0.01): a spread of parameters
        for epoch in (1, 10):
            save_checkpoint(run, rank, epoch, float(epoch), G, "proxy1d")
    runs = [load_run(d) for d in expand_run_dirs([run])]
    k = 64
    hats, errs = [], []
    g = predict_group("g", runs, 8, 0)
    for seed in range(40):
        u, _ = group_uncertainty(g, final=predict_final(g, k, seed))
        hats.append(u.p_hat)
        errs.append(u.sampling)
    moved, claimed = np.std(hats, axis=0, ddof=1), np.mean(errs, axis=0)
    assert np.all(claimed > 0)
    # 40 batches: the sample std is within ~25 % of the true one (2 sigma); the claimed error within 10 %
    np.testing.assert_allclose(moved / claimed, 1.0, atol=0.35)
    # and it falls as 1/sqrt(K)
    u4 = group_uncertainty(g, final=predict_final(g, 4 * k, 0))[0]
    np.testing.assert_allclose(u4.sampling / claimed, 0.5, atol=0.15)
    assert np.all(u4.sigma >= u4.sampling)


def test_a_generator_of_one_point_has_no_noise_error():
    """Predictions that differ only by the rounding of their float64 averages (a generator of one point) read 0, a
    real spread of 1e-9 of p^ does not."""
    from sagips.analysis.stats import noise_sampling_error

    rng = np.random.default_rng(0)
    p = np.array([0.3, 7.0, -2.5])
    rounding = p * (1 + 4e-16 * rng.standard_normal((3, 256, 3)))
    assert np.all(noise_sampling_error(rounding) == 0.0)
    spread = p * (1 + 1e-9 * rng.standard_normal((3, 256, 3)))
    np.testing.assert_allclose(noise_sampling_error(spread), np.abs(p) * 1e-9 / np.sqrt(3 * 256), rtol=0.25)


def test_the_density_fisher_matrix_against_an_independent_quadrature():
    """ParametricEnvironment.fisher (torch, the sampler's grid) against benchmarks/toy1d.fisher (numpy, numerical
    derivatives on a 200,001-point grid), at two points (a simulator's: tests/test_simfisher.py)."""
    from benchmarks import toy1d
    from tests._plugins import TOY_SRC
    import sys

    sys.path[:0] = [str(TOY_SRC)]
    try:
        from sagips_toy1d import Toy1D
    finally:
        del sys.path[:1]
    cfg = from_dict(Toy1D.Config, {}, "environment.")
    env = Toy1D(cfg, "cpu", 0)
    for p in ([1.7, -0.4, 0.9], [2.5, -0.637, 1.028]):
        np.testing.assert_allclose(env.fisher(p), toy1d.fisher(np.asarray(p)), rtol=1e-4)


def test_the_fisher_matrix_of_a_density_with_zeros():
    """A narrow Gaussian (its tails underflow to 0 on the grid) and a density that is 0 at both ends of the support:
    the information is integrated where f > 0. Gaussian: diag(1/s^2, 2/s^2), analytically."""
    from sagips import ParametricEnvironment

    def density_env(name, parameters, density):
        """A 2-parameter density environment on [0, 1], its truth at its bounds' middle, built with its defaults."""
        truth = {k: (lo + hi) / 2 for k, (lo, hi) in parameters.items()}
        cls = type(name, (ParametricEnvironment,), {"name": name, "parameters": parameters, "true_params": truth,
                                                    "support": (0.0, 1.0), "density": density})
        return cls(from_dict(cls.Config, {}, "environment."), "cpu", 0)

    narrow = density_env("test_fisher_narrow", {"mu": (0.3, 0.7), "s": (0.005, 0.05)},
                         lambda self, p, x: torch.exp(-0.5 * ((x - p[:, :1]) / p[:, 1:2]) ** 2))
    edges = density_env("test_fisher_edges", {"a": (0.5, 2.0), "b": (0.0, 1.0)},
                        lambda self, p, x: p[:, :1] * x * (1 - x) + p[:, 1:2] * x * x * (1 - x))
    np.testing.assert_allclose(narrow.fisher([0.5, 0.01]), np.diag([1e4, 2e4]), rtol=1e-3, atol=1e-3)
    # (a x + b x^2)(1 - x) is 0 at both ends, but only b/a sets its shape: its information is singular, which rounding
    # can show as a tiny eigenvalue of either sign; an exponential family with 0 at both ends is not, and its
    # information is the covariance of its sufficient statistics (x, x^2), computed here by quadrature
    expfam = density_env("test_fisher_expfam", {"a": (-1.0, 2.0), "b": (-2.0, 1.0)},
                         lambda self, p, x: x * (1 - x) * torch.exp(p[:, :1] * x + p[:, 1:2] * x * x))
    from scipy.integrate import trapezoid

    x = np.linspace(0.0, 1.0, 200_001)
    w = x * (1 - x) * np.exp(0.5 * x - 1.0 * x * x)
    w /= trapezoid(w, x)
    t = np.stack([x, x * x])
    mean = trapezoid(t * w, x, axis=1)
    cov = trapezoid((t - mean[:, None])[:, None] * (t - mean[:, None])[None] * w, x, axis=2)
    np.testing.assert_allclose(expfam.fisher([0.5, -1.0]), cov, rtol=2e-3)
    assert np.linalg.eigvalsh(expfam.fisher([0.5, -1.0]))[0] > 0
    assert np.all(np.isfinite(edges.fisher([1.0, 0.5])))
    assert edges.fisher([-1.0, 0.5]) is None  # negative inside the support: no information matrix


def test_strongly_correlated_parameters_get_a_note():
    names = ["a", "b", "c"]
    cov = np.array([[1.0, -0.97, 0.5], [-0.97, 1.0, -0.4], [0.5, -0.4, 1.0]])
    (note,) = stats.correlated_pairs(np.linalg.inv(cov), names)
    assert note.startswith("a and b are -97 % correlated") and "environment.g_start" in note
    assert "train with environment.precondition=fisher" in note
    (pre,) = stats.correlated_pairs(np.linalg.inv(cov), names, preconditioned=True)
    assert "were preconditioned" in pre and "environment.g_start" in pre
    (bare,) = stats.correlated_pairs(np.linalg.inv(cov), names, options=False)  # proxy1d: neither option exists
    assert "environment." not in bare and "other seeds" in bare and "relax back" in bare
    assert stats.correlated_pairs(np.linalg.inv(np.eye(3) * 4), names) == []
    singular = np.array([[1.0, 1.0], [1.0, 1.0]])
    assert "singular" in stats.correlated_pairs(singular, names[:2])[0]
    # a parameter that only scales the density carries no information: singular to rounding, not exactly
    assert "singular" in stats.correlated_pairs(np.array([[2.0, 0.0], [0.0, 1e-31]]), names[:2])[0]
    assert stats.correlated_pairs(np.full((2, 2), np.nan), names[:2]) == []


def test_the_cramer_rao_bound_and_its_note():
    """sqrt(diag(I^-1)/N) by hand for a 2x2 information; the note where the members part is below what M - 1
    degrees of freedom allow at 1 % (chi^2 quantiles against scipy), and not above; a singular information has no
    bound; one member, no note."""
    from scipy import stats as st

    info = np.array([[4.0, 1.0], [1.0, 2.0]])  # inverse: [[2, -1], [-1, 4]] / 7
    bound = stats.cramer_rao(info, 100)
    np.testing.assert_allclose(bound, [math.sqrt(2 / 7 / 100), math.sqrt(4 / 7 / 100)], rtol=1e-12)
    assert stats.cramer_rao(np.ones((2, 2)), 100) is None and stats.cramer_rao(np.full((2, 2), np.nan), 9) is None
    for q, dof in ((0.01, 1), (0.01, 3), (0.01, 7), (0.5, 2.5), (0.99, 30), (0.01, 200)):
        assert stats.chi2_quantile(q, dof) == pytest.approx(st.chi2.ppf(q, dof), rel=1e-9)
    for m in (4, 8):
        edge = math.sqrt(st.chi2.ppf(stats.BOUND_P, m - 1) / (m - 1))
        notes = stats.below_cramer_rao(["a", "b"], bound * edge * 0.99, bound, m)
        assert [n.split(":")[0] for n in notes] == ["a", "b"] and "Cramér-Rao bound" in notes[0]
        assert stats.below_cramer_rao(["a", "b"], bound * edge * 1.01, bound, m) == []
    assert stats.below_cramer_rao(["a"], bound[:1] * 0.01, bound[:1], 1) == []


def test_the_datas_floor_by_hand():
    """data_floor: the bound, times sqrt(1 + (1/seen - 1)/M) for members that share one data set in half-samples;
    the bound itself for disjoint parts, for members that all saw everything, or an unknown fraction."""
    b = np.array([0.2, 0.05])
    np.testing.assert_allclose(stats.data_floor(b, 0.5, 4, True), b * math.sqrt(1.25), rtol=1e-12)
    np.testing.assert_allclose(stats.data_floor(b, 0.8, 1, True), b / math.sqrt(0.8), rtol=1e-12)  # one run
    for seen, shared in ((0.5, False), (1.0, True), (None, True)):
        np.testing.assert_allclose(stats.data_floor(b, seen, 4, shared), b, rtol=0)
    # members whose scatter holds the data's error: the larger part (a NaN members part: the floor)
    spread, low = stats.spread_with_floor(np.array([0.1, 0.3, np.nan]), np.array([0.2, 0.2, 0.2]), True)
    np.testing.assert_allclose(spread, [0.2, 0.3, 0.2])
    assert list(low) == [True, False, True]
    # members that hold only training noise: the data's error adds in quadrature, nothing is replaced
    spread, low = stats.spread_with_floor(np.array([0.3, 0.0]), np.array([0.4, 0.4]), False)
    np.testing.assert_allclose(spread, [0.5, 0.4])
    assert not low.any()


def test_the_bound_splits_the_scatter_exactly():
    """Monte Carlo of the estimator model of stats.members_factor and stats.split_scatter: M members share one data
    set, each estimating from a random half (an efficient estimate: the mean of its events, whose bound is 1/sqrt(n))
    plus training noise twice its statistical error. sigma from split_scatter is the rms error of the members' mean
    against the truth; the scale-all factor without the bound overstates it (by ~1.4x here)."""
    rng = np.random.default_rng(2)
    m, trials, n, train = 4, 8000, 400, 2.0
    x = rng.normal(size=(trials, n))  # each trial: one data set of n events, truth 0, bound 1/sqrt(n)
    keep = rng.random(size=(trials, m, n)) < 0.5  # each member keeps a random half
    stat = (keep * x[:, None, :]).sum(axis=2) / keep.sum(axis=2)
    est = stat + rng.normal(scale=train * math.sqrt(1 / n), size=stat.shape)
    err = est.mean(axis=1)
    s = est.std(axis=1, ddof=1)
    b = np.full(trials, 1 / math.sqrt(n))
    split, low, sampled = stats.split_scatter(s, b, 0.5, m)
    ratio = math.sqrt(np.mean(err ** 2) / np.mean(split ** 2))
    assert ratio == pytest.approx(1.0, abs=0.03)
    scale_all = math.sqrt(np.mean(err ** 2) / np.mean((s * stats.members_factor(0.5, m, True)) ** 2))
    assert scale_all < 0.8  # conservative: the training noise counted as if it did not average
    np.testing.assert_allclose(sampled, np.where(low, 0.0, s / 2), rtol=1e-12)
    assert 0 < low.mean() < 0.2  # the floor, where the scatter falls below the statistical part by chance
    # an unknown bound (NaN) keeps the scale-all rule, all of it sampled
    part, low, sampled = stats.split_scatter(np.array([0.3]), np.array([np.nan]), 0.5, m)
    assert part[0] == pytest.approx(0.3 * stats.members_factor(0.5, m, True)) and sampled[0] == part[0] and not low[0]


def test_sigma_is_floored_at_the_datas_error():
    """stats.uncertainty with a bound: four members on half-samples that agree more than the data allow get the
    data's floor as their spread part (not sampled: dof inf); a parameter above it gets the bound's statistical part
    and the rest of the scatter as training noise of the mean (split_scatter); one coupled run adds the floor of what
    it saw to its ranks' spread, and says so."""
    values = np.array([[1.0, 10.0], [1.001, 10.4], [0.999, 9.6], [1.0, 10.0]])
    bound = np.array([0.05, 0.05])
    u = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, bound=bound)
    s = values.std(axis=0, ddof=1)
    floor = bound * math.sqrt(1 + (1 / 0.5 - 1) / 4)
    assert s[0] < bound[0] and s[1] > bound[1]  # seen 0.5: the statistical part of a member's scatter is the bound
    # by hand: b^2 (1 + 1/M) + (s^2 - b^2)/M = b^2 + s^2/M above the floor
    np.testing.assert_allclose(u.members, [floor[0], math.sqrt(bound[1] ** 2 + s[1] ** 2 / 4)], rtol=1e-12)
    np.testing.assert_allclose(u.sigma, u.members, rtol=1e-12)
    assert u.sigma[1] < s[1] * math.sqrt(1 + 1 / 4)  # the scale-all rule without the bound is larger
    # only the scatter's part s^2/M is sampled (M - 1 dof); the bound's is known (Welch-Satterthwaite)
    assert list(u.floored) == [True, False] and u.dof[0] == math.inf
    assert u.dof[1] == pytest.approx(3 * (u.sigma[1] / (s[1] / 2)) ** 4, rel=1e-12)
    assert u.k68[0] == pytest.approx(1.0, abs=1e-6)
    # members that all saw the whole data set: the bound adds in quadrature, and it is known, so sigma's degrees of
    # freedom are the members' part's (Welch-Satterthwaite), not M - 1
    whole = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 1.0, True, bound=bound)
    m = s / 2  # members_factor: 1/sqrt(M)
    np.testing.assert_allclose(whole.sigma, np.sqrt(m ** 2 + bound ** 2), rtol=1e-12)
    np.testing.assert_allclose(whole.dof, 3 * (whole.sigma / m) ** 4, rtol=1e-12)
    assert not whole.floored.any() and "Cramér-Rao bound to it" in whole.notes[0]
    plain = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True)
    assert plain.floored is None and plain.sigma[0] == pytest.approx(s[0] * math.sqrt(1 + 1 / 4))
    # one coupled run of 4 ranks, each keeping half: seen 0.8; the ranks' spread is training noise
    one = stats.uncertainty(values[:1], np.array([0.02, 0.02]), 4, np.zeros(2), 0.8, True, bound=bound)
    np.testing.assert_allclose(one.sigma, np.sqrt((0.02 / 2) ** 2 + bound ** 2 / 0.8), rtol=1e-12)
    assert one.spread_from == "ranks" and "Cramér-Rao" in one.notes[0] and "lower bound" in one.notes[0]
    # its convergence is judged against the larger of its ranks' spread and the data's bound, each named
    conv = stats.convergence(["a"], [1, 800, 900, 1000], np.array([[0.0], [0.0], [0.01], [0.02]]), np.array([0.01]),
                             lower_bound=True, floor=np.array([0.05]))
    assert conv[0]["sigma"] == 0.05 and "Cramér-Rao" in conv[0]["message"] and conv[0]["moving"] is False


def analyze_four_members(tmp_path, truth, apart: float, events: int, nonclosure=None, args=()) -> dict:
    """Four proxy1d members at truth * (1 + apart * (1, -1, 0.5, -0.5)) on a data set of `events` (with
    analysis.nonclosure = nonclosure, or one per member), analyzed with `args`: the summary.json uncertainty of
    their group."""
    offsets = np.outer([1.0, -1.0, 0.5, -0.5], np.abs(truth)) * apart
    nc = nonclosure if isinstance(nonclosure, (list, tuple)) else [nonclosure] * 4
    for m in range(4):
        write_run(tmp_path / "job" / f"member{m:03d}", "ensemble", series(truth, offsets[m:m + 1]), member=m,
                  events=events, nonclosure=nc[m])
    assert main([str(tmp_path / "job"), "--out", str(tmp_path / "rep"), "--noise-samples", "4", "--resamples", "2",
                 "--final-noise-samples", "4", *args]) == 0
    return json.loads((tmp_path / "rep" / "summary.json").read_text())["groups"][0]["uncertainty"]


def test_analyze_floors_members_that_agree_more_than_proxy1ds_data_allow(tmp_path, truth):
    """The wiring, end to end: proxy1d's Fisher information (tests/test_ml_covariance.py checks it against the ML
    fit) gives analyze the bound of the run's 10,000 events; four members 1e-5 apart are far below it, so sigma is
    the data's floor for every parameter, and the summary says so."""
    u = analyze_four_members(tmp_path, truth, 1e-5, 10_000)
    env, _ = proxy1d()
    bound = stats.cramer_rao(env.fisher(np.array(u["p_hat"])), 10_000)
    np.testing.assert_allclose(u["cramer_rao"], bound, rtol=1e-6)
    np.testing.assert_allclose(u["sigma"], bound * math.sqrt(1 + 1 / 4), rtol=1e-4)  # seen 0.5, M = 4
    assert u["floored"] == [True] * 6 and u["dof"] == [None] * 6  # inf in JSON
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "σ's members part is the data's floor where the members scattered less" in md


def test_sigma_far_above_the_bound_is_noted():
    """A note where sigma exceeds FAR_FROM_FLOOR bounds, none just below it or without a bound."""
    bound = np.array([0.01, 0.02])
    limit = stats.FAR_FROM_FLOOR
    notes = stats.above_cramer_rao(["a", "b"], bound * limit * np.array([1.01, 0.99]), bound)
    assert len(notes) == 1 and notes[0].startswith("a: σ ") and f"is {limit * 1.01:.0f}x" in notes[0]
    assert stats.above_cramer_rao(["a"], np.array([1.0]), np.array([np.nan])) == []
    assert stats.above_cramer_rao(["a"], np.array([np.nan]), np.array([0.01])) == []


def test_analyze_notes_members_far_apart_on_proxy1d(tmp_path, truth):
    """End to end: four proxy1d members 2 % apart, far beyond the bound of 1e8 events, get the note in the summary
    for exactly the parameters whose sigma is beyond FAR_FROM_FLOOR bounds."""
    u = analyze_four_members(tmp_path, truth, 2e-2, 100_000_000)
    ratio = np.array(u["sigma"]) / np.array(u["cramer_rao"])
    far = [f"r_{i}" for i in range(6) if ratio[i] > stats.FAR_FROM_FLOOR]
    assert far and [n.split(":")[0] for n in u["notes"] if "far apart" in n] == far
    assert "x the data's Cramér-Rao bound" in (tmp_path / "rep" / "summary.md").read_text()


def test_the_nonclosure_adds_a_known_systematic_in_quadrature():
    """stats.uncertainty with analysis.nonclosure = 0.7: sigma^2 gains (0.7 bound)^2 by hand, the part is known
    (not sampled), so the degrees of freedom grow as (sigma / sigma without it)^4 (Welch-Satterthwaite), and a note
    names it; without a bound it cannot apply, sigma is unchanged and a note says so."""
    values = np.array([[1.0, 10.0], [1.001, 10.4], [0.999, 9.6], [1.0, 10.0]])
    bound = np.array([0.05, 0.05])
    base = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, bound=bound)
    u = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, bound=bound, nonclosure=0.7)
    np.testing.assert_allclose(u.nonclosure, 0.7 * bound, rtol=1e-12)
    np.testing.assert_allclose(u.sigma, np.sqrt(base.sigma ** 2 + (0.7 * bound) ** 2), rtol=1e-12)
    np.testing.assert_allclose(u.p_hat, base.p_hat)
    np.testing.assert_allclose(u.members, base.members)
    assert u.dof[0] == math.inf  # (the floor's parameter: nothing sampled either way)
    assert u.dof[1] == pytest.approx(base.dof[1] * (u.sigma[1] / base.sigma[1]) ** 4, rel=1e-12)
    assert [n for n in u.notes if "non-closure" in n] == [
        "σ includes a systematic of the training (non-closure) of 0.7 × the data's Cramér-Rao bound "
        "(analysis.nonclosure; a calibration on data of known truth measures it: docs/analysis.md)"]
    assert not base.nonclosure.any() and not any("non-closure" in n for n in base.notes)
    # per parameter: a mapping of names (those left out: 0); a name that is not a parameter is one line
    one = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, bound=bound,
                            nonclosure={"y": 0.7}, names=["x", "y"])
    np.testing.assert_allclose(one.sigma, [base.sigma[0], u.sigma[1]], rtol=1e-12)
    assert any("non-closure) of y 0.7 × the data's" in n for n in one.notes)
    with pytest.raises(ValueError, match="^analysis.nonclosure names 'z', which is not a parameter here"):
        stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, bound=bound, nonclosure={"z": 1},
                          names=["x", "y"])
    with pytest.raises(ValueError, match="^--nonclosure names 'z'"):  # the flag the user typed, not the setting
        stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, bound=bound, nonclosure={"z": 1},
                          names=["x", "y"], nonclosure_from="--nonclosure")
    plain = stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5, True, nonclosure=0.7)
    np.testing.assert_allclose(plain.sigma, stats.uncertainty(values, np.full(2, np.nan), 1, np.zeros(2), 0.5,
                                                              True).sigma, rtol=1e-12)
    assert not plain.nonclosure.any() and any("non-closure 0.7 (analysis.nonclosure)" in n and "not applied" in n
                                              for n in plain.notes)


def test_analyze_applies_the_runs_nonclosure_and_names_it(tmp_path, truth, capsys):
    """End to end on proxy1d members: the runs' analysis.nonclosure (from run.json) adds 0.7 x the bound to sigma,
    in the JSON's own part and a column of summary.md; --nonclosure overrides it (0: none, as a run.json from before
    the option); members made with different values stop with one line that names the option."""
    base = analyze_four_members(tmp_path / "old", truth, 2e-4, 10_000)
    u = analyze_four_members(tmp_path / "new", truth, 2e-4, 10_000, nonclosure=0.7)
    bound = np.asarray(u["cramer_rao"], dtype=float)
    np.testing.assert_allclose(u["nonclosure"], 0.7 * bound, rtol=1e-12)
    np.testing.assert_allclose(u["sigma"], np.sqrt(np.asarray(base["sigma"]) ** 2 + (0.7 * bound) ** 2), rtol=1e-9)
    md = (tmp_path / "new" / "rep" / "summary.md").read_text()
    assert "| noise (K) | non-closure | pull |" in md and "non-closure) of 0.7 × the data's Cramér-Rao" in md
    assert "| non-closure |" not in (tmp_path / "old" / "rep" / "summary.md").read_text()
    assert (tmp_path / "new" / "rep" / "uncertainty.png").stat().st_size > 0
    over = analyze_four_members(tmp_path / "over", truth, 2e-4, 10_000, nonclosure=0.7, args=["--nonclosure", "0"])
    np.testing.assert_allclose(over["sigma"], base["sigma"], rtol=1e-12)
    more = analyze_four_members(tmp_path / "more", truth, 2e-4, 10_000, args=["--nonclosure", "1.5"])
    np.testing.assert_allclose(more["sigma"], np.sqrt(np.asarray(base["sigma"]) ** 2 + (1.5 * bound) ** 2), rtol=1e-9)
    assert any("1.5 × the data's Cramér-Rao bound (--nonclosure;" in n for n in more["notes"])
    named = analyze_four_members(tmp_path / "named", truth, 2e-4, 10_000, args=["--nonclosure", "r_2=1.5"])
    expect = np.asarray(base["sigma"], dtype=float).copy()
    expect[2] = math.hypot(expect[2], 1.5 * bound[2])
    np.testing.assert_allclose(named["sigma"], expect, rtol=1e-9)
    offsets = np.outer([1.0, -1.0, 0.5, -0.5], np.abs(truth)) * 2e-4
    for m, nc in enumerate([0.7, 0.7, 0.5, None]):
        write_run(tmp_path / "mixed" / f"member{m:03d}", "ensemble", series(truth, offsets[m:m + 1]), member=m,
                  events=10_000, nonclosure=nc)
    capsys.readouterr()
    assert main([str(tmp_path / "mixed"), "--out", str(tmp_path / "rep"), "--noise-samples", "4"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "different analysis.nonclosure (0; 0.5; 0.7)" in err and "--nonclosure" in err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "mixed"), "--out", str(tmp_path / "rep"), "--nonclosure", "-1"])


def test_the_drift_advice_names_the_events_per_set_to_raise():
    """A parameter still moving is told to raise environment.events_per_sample: from the value its runs used (what
    `auto` chose, in run.json's batch_sized, or the config's number); unknown, the advice alone."""
    from sagips.analysis.stats import DRIFT_ADVICE, drift_advice

    auto = {"batch_sized": {"events_per_sample": 391}, "config": {"environment": {"events_per_sample": "auto"}}}
    fixed = {"batch_sized": None, "config": {"environment": {"events_per_sample": 400}}}
    assert drift_advice([auto, auto]) == DRIFT_ADVICE + " (391 here, chosen by auto)"
    assert drift_advice([fixed]) == DRIFT_ADVICE + " (400 here)"
    assert drift_advice([auto, fixed]) == DRIFT_ADVICE + " (391/400 here)"
    assert drift_advice([{"config": {"environment": {}}}]) == DRIFT_ADVICE == (
        "train longer, or raise environment.events_per_sample")
