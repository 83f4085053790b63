"""The scaling model (benchmarks/sim.py): hand-computed schedules, straggler semantics, and the calibration fit.

Every expected number below was computed by hand from the rules in benchmarks/sim.py's docstring; no MPI is used.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests._bench import load_benchmark

sim = load_benchmark("sim")
Link, Profile, allreduce_cost, project, rate = sim.Link, sim.Profile, sim.allreduce_cost, sim.project, sim.rate
ring_allreduce, ring_hops, simulate = sim.ring_allreduce, sim.ring_hops, sim.simulate

ROOT = Path(__file__).resolve().parents[1]


def flat(latency: float, bandwidth: float = math.inf) -> Link:
    return Link(latency, bandwidth)


def profile(**kw) -> Profile:
    base = dict(name="hand", epoch_s=1.0, intra=flat(0.25), inter=flat(0.25), ranks_per_node=4, n_floats=3,
                events_per_epoch=10)
    base.update(kw)
    return Profile(**base)


def ring_costs(prof: Profile, n_ranks: int, nbytes: float):
    m = np.arange(n_ranks).reshape(1, n_ranks)
    return m, prof.hop_cost(np.roll(m, 1, -1), m, nbytes), prof.hop_cost(m, np.roll(m, -1, -1), nbytes)


# ------------------------------------------------------------------------------------ a 4-rank ring, by hand
def test_whole_ring_hop_by_hop_two_nodes_eager():
    # ranks 0,1 on node 0 and 2,3 on node 1: links 0->1 and 2->3 intra (0.1 s), 1->2 and 3->0 inter (0.5 s).
    # Eager: F[r][k] = max(F[r][k-1], F[left][k-1]) + c(left -> r).
    prof = profile(intra=flat(0.1), inter=flat(0.5), ranks_per_node=2, rendezvous=False)
    m, c_recv, c_send = ring_costs(prof, 4, 1)
    f = ring_hops(np.ones((1, 4)), c_recv, c_send, hops=3, rendezvous=False)[:, 0]
    expected = [[1.0, 1.0, 1.0, 1.0],
                [1.5, 1.1, 1.5, 1.1],   # r0, r2 receive over an inter-node link
                [2.0, 1.6, 2.0, 1.6],   # r1: max(1.1, F0=1.5) + 0.1; r3: max(1.1, F2=1.5) + 0.1
                [2.5, 2.1, 2.5, 2.1]]
    np.testing.assert_allclose(f, expected, rtol=0, atol=1e-12)


def test_whole_ring_hop_by_hop_two_nodes_rendezvous():
    # Rendezvous: a send also waits for the receiver, so every rank pays the slower of its two links each hop.
    prof = profile(intra=flat(0.1), inter=flat(0.5), ranks_per_node=2, rendezvous=True)
    m, c_recv, c_send = ring_costs(prof, 4, 1)
    f = ring_hops(np.ones((1, 4)), c_recv, c_send, hops=3, rendezvous=True)[:, 0]
    np.testing.assert_allclose(f, [[1.0] * 4, [1.5] * 4, [2.0] * 4, [2.5] * 4], rtol=0, atol=1e-12)


def test_whole_ring_straggler_hop_by_hop():
    # Rank 3 arrives at 3.0, the others at 1.0; every hop costs 0.25 (eager). The delay travels one rank per hop.
    prof = profile(rendezvous=False)
    m, c_recv, c_send = ring_costs(prof, 4, 1)
    f = ring_hops(np.array([[1.0, 1.0, 1.0, 3.0]]), c_recv, c_send, hops=3, rendezvous=False)[:, 0]
    expected = [[1.0, 1.0, 1.0, 3.0],
                [3.25, 1.25, 1.25, 3.25],
                [3.5, 3.5, 1.5, 3.5],
                [3.75, 3.75, 3.75, 3.75]]
    np.testing.assert_allclose(f, expected, rtol=0, atol=1e-12)


def test_two_epochs_of_arar_on_four_ranks():
    # epoch_s = 1, rank 1 has +1 s of pipeline delay per epoch, hop = 0.05 latency + 16 B / 80 B/s = 0.25 s.
    # Epoch 1: arrive [1, 2, 1, 1] -> rendezvous hops: max of the 3 neighbours + 0.25:
    #   hop1 [2.25, 2.25, 2.25, 1.25], hop2 [2.5]*4, hop3 [2.75]*4.
    # Epoch 2: arrive [3.75, 4.75, 3.75, 3.75] -> the same pattern -> [5.5]*4.
    link = Link(0.05, 80.0)
    prof = profile(intra=link, inter=link)
    assert prof.nbytes == 16 and prof.hop_cost(np.array(0), np.array(1), prof.nbytes) == pytest.approx(0.25)
    res = simulate("arar", 4, 2, prof, delays={1: 1.0}, trace=True)
    np.testing.assert_allclose(res.epoch_ends, [[2.75] * 4, [5.5] * 4], rtol=0, atol=1e-12)
    # eager gives the same epoch ends here: the straggler reaches everybody within N-1 hops either way
    res = simulate("arar", 4, 2, profile(intra=link, inter=link, rendezvous=False), delays={1: 1.0}, trace=True)
    np.testing.assert_allclose(res.epoch_ends, [[2.75] * 4, [5.5] * 4], rtol=0, atol=1e-12)
    assert res.train_s == pytest.approx(5.5)
    assert rate(4, 10, 2, res.train_s) == pytest.approx(4 * 10 * 2 / 5.5)


def test_whole_ring_adds_the_rows_after_the_last_hop():
    # n = 3 floats, 0.01 s per float added: (N-1) * n * 0.01 = 0.09 s after the 3 hops of 0.25 s.
    prof = profile(reduce_s_per_float=0.01)
    end = ring_allreduce(np.ones(4), np.arange(4).reshape(1, 4), prof, "whole")[0]
    np.testing.assert_allclose(end, [1 + 3 * 0.25 + 0.09] * 4, rtol=0, atol=1e-12)


def test_chunked_ring_by_hand():
    # n = 7 floats -> n+1 = 8 -> chunks of 2 floats = 8 B; hop = 0.1 + 8 B / 80 B/s = 0.2 s; the 3 reduce-scatter
    # hops also add a chunk: 2 floats * 0.01 s = 0.02 s. Rank 2 arrives at 3.0, the others at 1.0 (eager):
    #   hop1 [1.22, 1.22, 3.22, 3.22], hop2 [3.44, 1.44, 3.44, 3.44], hop3 [3.66]*4, hops 4-6 +0.2 -> 4.26.
    link = Link(0.1, 80.0)
    prof = profile(intra=link, inter=link, n_floats=7, reduce_s_per_float=0.01, rendezvous=False)
    arrive = np.array([1.0, 1.0, 3.0, 1.0])
    end = ring_allreduce(arrive, np.arange(4).reshape(1, 4), prof, "chunked")[0]
    np.testing.assert_allclose(end, [4.26] * 4, rtol=0, atol=1e-12)
    m, c_recv, c_send = ring_costs(prof, 4, 8)
    f = ring_hops(arrive.reshape(1, 4), c_recv, c_send, 6, False, extra=0.02, extra_hops=3)[:, 0]
    np.testing.assert_allclose(f[1], [1.22, 1.22, 3.22, 3.22], atol=1e-12)
    np.testing.assert_allclose(f[2], [3.44, 1.44, 3.44, 3.44], atol=1e-12)
    np.testing.assert_allclose(f[3], [3.66] * 4, atol=1e-12)
    np.testing.assert_allclose(f[6], [4.26] * 4, atol=1e-12)


def test_allreduce_is_a_barrier_plus_rabenseifner_rounds():
    # N = 4: 2 rounds each way. B = 4 * (7 + 1) = 32 B, 32 B/s, latency 0.01:
    #   round 1 (distance 2, B/2): 0.51; round 2 (distance 1, B/4): 0.26; x2 (all-gather) = 1.54; + call 0.1.
    link = Link(0.01, 32.0)
    prof = profile(intra=link, inter=link, n_floats=7, call_overhead_s=0.1)
    assert allreduce_cost(4, prof) == pytest.approx(1.64)
    # MPICH's own work per byte of the buffer, beyond the rounds: 32 B x 0.01 s/B
    assert allreduce_cost(4, profile(intra=link, inter=link, n_floats=7, call_overhead_s=0.1,
                                     allreduce_s_per_byte=0.01)) == pytest.approx(1.64 + 0.32)
    res = simulate("allreduce", 4, 1, prof, delays={2: 0.5})
    # + the mode's count (1 float = 4 B): call 0.1 + 2 * (0.01 + 2/32) + 2 * (0.01 + 1/32) = 0.3275
    np.testing.assert_allclose(res.finish, [1.5 + 1.64 + 0.3275] * 4)
    # with 2 ranks per node, the first round (distance 2) crosses nodes: 2 * (0.01 + 16/8) instead of 2 * 0.51
    prof2 = profile(intra=link, inter=Link(0.01, 8.0), ranks_per_node=2, n_floats=7, call_overhead_s=0.1)
    assert allreduce_cost(4, prof2) == pytest.approx(0.1 + 2 * 2.01 + 2 * 0.26)


def test_rma_never_waits_and_outer_epoch_syncs():
    # rma-arar-arar, 8 ranks in 2 groups of 4, h = 3: local cost 0.1 + 3 * 0.05 = 0.25 per epoch.
    prof = profile(rma_fixed_s=0.1, rma_per_peer_s=0.05)
    res = simulate("rma-arar-arar", 8, 3, prof, outer_every=3, delays={5: 1.0}, trace=True)
    np.testing.assert_allclose(res.epoch_ends[0], [1.25] * 5 + [2.25] + [1.25] * 2)
    np.testing.assert_allclose(res.epoch_ends[1], [2.5] * 5 + [4.5] + [2.5] * 2)
    # Epoch 3 is an outer epoch. After the RMA step: [3.75]*5 + [6.75] + [3.75]*2. Leaders 0 and 4 run a 2-rank
    # ring (one 0.25 s hop: 4.0), then each group's broadcast (2 tree rounds x 0.25 s = 0.5 s) ends at the group's
    # latest arrival + 0.5 (rendezvous): group 0 at 4.0 + 0.5, group 1 at rank 5's 6.75 + 0.5.
    np.testing.assert_allclose(res.epoch_ends[2], [4.5] * 4 + [7.25] * 4)
    # eager: members wait for their leader only, the leader for nobody
    res = simulate("rma-arar-arar", 8, 3, profile(rma_fixed_s=0.1, rma_per_peer_s=0.05, rendezvous=False),
                   outer_every=3, delays={5: 1.0}, trace=True)
    np.testing.assert_allclose(res.epoch_ends[2], [4.5] * 5 + [7.25] + [4.5] * 2)


# ------------------------------------------------------------------------------------------- stragglers
@pytest.fixture
def straggler_runs():
    prof = profile(jitter_cv=0.0, rma_fixed_s=0.01, rma_per_peer_s=0.01)
    kw = dict(epochs=10, profile=prof, inner_size=4, outer_every=1000)
    out = {}
    for mode in ("arar", "arar-arar", "rma-arar-arar", "allreduce"):
        out[mode] = (simulate(mode, 8, **kw).finish, simulate(mode, 8, delays={5: 0.5}, **kw).finish)
    return out


def test_straggler_delays_everyone_in_arar_and_allreduce(straggler_runs):
    for mode in ("arar", "allreduce"):
        base, slow = straggler_runs[mode]
        np.testing.assert_allclose(slow - base, [5.0] * 8, atol=1e-9)  # 10 epochs x 0.5 s, on every rank


def test_straggler_delays_only_its_group_in_arar_arar(straggler_runs):
    base, slow = straggler_runs["arar-arar"]
    np.testing.assert_allclose(slow[:4], base[:4], atol=1e-12)       # the other group: untouched
    np.testing.assert_allclose(slow[4:] - base[4:], [5.0] * 4, atol=1e-9)


def test_straggler_delays_nobody_else_in_rma_between_outer_epochs(straggler_runs):
    base, slow = straggler_runs["rma-arar-arar"]
    others = [r for r in range(8) if r != 5]
    np.testing.assert_allclose(slow[others], base[others], atol=1e-12)
    assert slow[5] - base[5] == pytest.approx(5.0)


def test_outer_epochs_bring_the_straggler_delay_to_everyone():
    prof = profile(rma_fixed_s=0.01, rma_per_peer_s=0.01)
    # arar-arar: the straggler's leader is tied to it every epoch, so the leaders' ring at epoch 10 passes its
    # 10 x 0.5 s on to the other group
    base = simulate("arar-arar", 8, 10, prof, outer_every=10).finish
    slow = simulate("arar-arar", 8, 10, prof, outer_every=10, delays={5: 0.5}).finish
    np.testing.assert_allclose(slow - base, [5.0] * 8, atol=1e-9)
    # rma-arar-arar (1.04 s per epoch: compute + 0.04 s RMA): at epoch 10 only the straggler's group waits, in the
    # broadcast. Base: all at 10.4, leaders' ring -> 10.65, broadcast -> 11.15. Straggler: rank 5 at 15.4, so
    # group 1 ends at 15.4 + 0.5 = 15.9 (+4.75), group 0 at 11.15 (+0).
    base = simulate("rma-arar-arar", 8, 20, prof, outer_every=10, trace=True)
    slow = simulate("rma-arar-arar", 8, 20, prof, outer_every=10, delays={5: 0.5}, trace=True)
    np.testing.assert_allclose(base.epoch_ends[9], [11.15] * 8, atol=1e-9)
    np.testing.assert_allclose(slow.epoch_ends[9], [11.15] * 4 + [15.9] * 4, atol=1e-9)
    # Its late leader (26.3 after epoch 20's RMA step) then holds up the leaders' ring at epoch 20 (group 0 would
    # be at 21.55): ring -> 26.55, broadcasts -> group 0 at 27.05 (base 22.3: +4.75), group 1 at 31.3 + 0.5.
    np.testing.assert_allclose(base.finish, [22.3] * 8, atol=1e-9)
    np.testing.assert_allclose(slow.finish, [27.05] * 4 + [31.8] * 4, atol=1e-9)


def test_jitter_costs_synchronous_modes_more_than_rma():
    prof = profile(epoch_s=1.0, jitter_cv=0.1, intra=flat(1e-3), inter=flat(1e-3), rma_fixed_s=1e-3)
    t = {m: simulate(m, 16, 100, prof, outer_every=1000, seed=3).train_s for m in
         ("ensemble", "rma-arar-arar", "arar-arar", "arar")}
    assert t["rma-arar-arar"] < t["arar-arar"] < t["arar"]
    assert t["ensemble"] < t["arar-arar"]


# ------------------------------------------------------------------------------------------- projection
def test_project_extrapolates_a_periodic_schedule_exactly():
    link = Link(1e-5, 1e10)
    prof = profile(epoch_s=0.035, intra=link, inter=link, hop_overhead_s=2e-5, rma_fixed_s=1e-4, n_floats=50_688)
    for mode in ("allreduce", "arar", "arar-arar", "rma-arar-arar"):
        full = simulate(mode, 8, 400, prof, outer_every=100).train_s
        p = project(mode, 8, prof, epochs=400, sim_epochs=200, outer_every=100)
        assert p["train_s"] == pytest.approx(full, rel=1e-9), mode
        assert p["rate"] == pytest.approx(8 * prof.events_per_epoch * 400 / full)


def test_grouped_modes_scale_and_the_whole_ring_saturates():
    # A Polaris-like profile at 4 and 64 ranks: the grouped modes keep their per-epoch time, the whole ring does not.
    prof = Profile(name="p", epoch_s=0.035, intra=Link(1e-6, 10e9), inter=Link(2.5e-6, 25e9), hop_overhead_s=3e-5,
                   reduce_s_per_float=2e-10, rma_fixed_s=1e-4, rma_per_peer_s=1e-4, ranks_per_node=4)
    gain = {}
    for mode in ("arar", "arar-arar", "rma-arar-arar"):
        r4 = project(mode, 4, prof, 100_000, sim_epochs=50 if mode == "arar" else 2000)
        r64 = project(mode, 64, prof, 100_000, sim_epochs=50 if mode == "arar" else 2000)
        gain[mode] = r64["rate"] / r4["rate"]
    assert gain["arar-arar"] > 0.97 * 16 and gain["rma-arar-arar"] > 0.97 * 16
    assert gain["arar"] < 0.95 * 16


def test_oversubscribed_compute_is_shared():
    prof = profile(cpu_cores=2, ranks_per_node=10 ** 6)
    assert prof.compute_factor(1) == 1.0 and prof.compute_factor(2) == 1.0 and prof.compute_factor(4) == 2.0
    assert simulate("ensemble", 4, 3, prof).train_s == pytest.approx(6.0)
    co = profile(cpu_cores=2, ranks_per_node=10 ** 6, corun_factor=1.25)  # measured: ensemble at N=cores vs N=1
    assert co.compute_factor(1) == 1.0 and co.compute_factor(2) == 1.25 and co.compute_factor(4) == 2.5


def test_bad_inputs():
    with pytest.raises(ValueError):
        simulate("ring", 4, 1, profile())
    with pytest.raises(ValueError):
        simulate("arar", 4, 1, profile(), ring="tree")


# ------------------------------------------------------------------------------------------- calibration
def _benchmark_module():
    from tests._bench import load_benchmark

    return load_benchmark("scaling_model")


LOCAL = {"add_s_per_float": 2e-10, "copy_s_per_float": 1.5e-10, "divide_s_per_float": 3e-10,
         "memcpy_s_per_byte": 4e-11, "crc32_s_per_byte": 3e-10}


def synthetic_records(sm, alpha, beta, t0, call, ns=(2,), call_by_n=None, ar_per_byte=50e-12):
    """Exchange records as measure.py writes them, made from known constants: ring calls, hops alone, one
    Iallreduce per size and mode allreduce's exchange (two Iallreduce calls), the RMA at N=2."""
    recs = []
    for n_ranks in ns:
        over = (call_by_n or {}).get(n_ranks, call)
        for n in (16, 12_672, 50_688):
            for tech in ("ring-whole", "ring-chunked"):
                hops, nbytes, loc = sm._ring_parts(tech, n_ranks, n, LOCAL)
                t = loc + t0 + hops * (alpha + nbytes * beta)
                recs.append({"technique": tech, "n_ranks": n_ranks, "n_floats": n, "seconds": t, "p10_s": t})
            t = alpha + (4 * n + 8) * beta
            recs.append({"technique": "hop", "n_ranks": n_ranks, "n_floats": n, "seconds": t, "p10_s": t})
            t = over + sm._allreduce_rounds(n_ranks, n, beta, LOCAL) + 4 * (n + 1) * ar_per_byte
            recs.append({"technique": "allreduce", "n_ranks": n_ranks, "n_floats": n, "seconds": t, "p10_s": t})
        t = 2 * over + sm._allreduce_rounds(n_ranks, 50_688, beta, LOCAL) + \
            sm._allreduce_rounds(n_ranks, 1, beta, LOCAL) + 4 * (50_688 + 1 + 1 + 1) * ar_per_byte
        recs.append({"technique": "allreduce-mode", "n_ranks": n_ranks, "n_floats": 50_688, "seconds": t, "p10_s": t})
    recs.append({"technique": "rma", "n_ranks": 2, "n_floats": 50_688, "seconds": 5e-4, "p10_s": 5e-4})
    return recs


def test_calibrate_recovers_each_constant_from_the_measurement_that_isolates_it():
    sm = _benchmark_module()
    alpha, beta, t0, call = 30e-6, 1e-9, 20e-6, 25e-6
    recs = synthetic_records(sm, alpha, beta, t0, call)
    cal = sm.calibrate({"meta": {"cores": 2}, "local": LOCAL, "exchange": recs})
    assert cal["hop_fit"] == "hop"
    assert cal["alpha_s"] == pytest.approx(alpha, rel=1e-6)
    assert cal["beta_s_per_byte"] == pytest.approx(beta, rel=1e-6)
    assert cal["t0_s"] == pytest.approx(t0, rel=1e-6)
    assert cal["call_overhead_s"] == pytest.approx(call, rel=1e-6)
    assert cal["allreduce_s_per_byte"] == pytest.approx(50e-12, rel=1e-6)
    assert all(abs(r["rel_error"]) < 1e-6 for r in cal["residuals"])
    assert all(abs(r["rel_error_median"]) < 1e-6 for r in cal["allreduce_check"])
    assert cal["rma_fixed_s"] + cal["rma_per_peer_s"] == pytest.approx(5e-4)
    assert cal["at_bounds"] == []
    assert [label for label, _, _ in sm.hop_scenarios(cal)] == ["Python hop overhead / 3", "Python hop overhead x 3"]
    # no fixed cost per ring call: t0 sits at 0, and the page says so
    recs = synthetic_records(sm, alpha, beta, 0.0, call)
    cal = sm.calibrate({"meta": {"cores": 2}, "local": LOCAL, "exchange": recs})
    assert cal["at_bounds"] == ["t0_s"]
    # a per-hop cost below the MPI latency leaves nothing for Python: hop_overhead_s is clamped, and flagged
    cal = sm.calibrate({"meta": {"cores": 2}, "local": LOCAL,
                        "exchange": synthetic_records(sm, 0.5e-6, beta, t0, call)})
    assert cal["hop_overhead_s"] == 0.0 and cal["at_bounds"] == ["hop_overhead_s"]
    assert all("assumed" in label for label, _, _ in sm.hop_scenarios(cal))


def test_calibrate_without_hop_records_fits_the_rings_alone():
    sm = _benchmark_module()
    alpha, beta = 30e-6, 1e-9
    recs = [r for r in synthetic_records(sm, alpha, beta, 0.0, 25e-6) if r["technique"] != "hop"]
    cal = sm.calibrate({"meta": {"cores": 2}, "local": LOCAL, "exchange": recs})
    assert cal["hop_fit"] == "ring"
    assert cal["alpha_s"] == pytest.approx(alpha, rel=1e-6)
    assert cal["beta_s_per_byte"] == pytest.approx(beta, rel=1e-6)
    assert cal["at_bounds"] == ["t0_s"]


def test_local_profile_takes_each_overhead_as_measured_at_its_n():
    """The local profile's call overhead at N is the one measured at N: never scaled by a ratio of hop costs (with
    alpha at its bound that ratio multiplied a 25 us overhead into milliseconds)."""
    sm = _benchmark_module()
    alpha, beta, t0 = 30e-6, 1e-9, 20e-6
    # oversubscribed N=4: hops and calls both slower, by different factors
    recs = synthetic_records(sm, alpha, beta, t0, 25e-6, ns=(2,), call_by_n={2: 25e-6})
    slow = synthetic_records(sm, 5 * alpha, beta, t0, 0.0, ns=(4,), call_by_n={4: 300e-6})
    recs += [r for r in slow if r["technique"] != "rma"]
    cal = sm.calibrate({"meta": {"cores": 2}, "local": LOCAL, "exchange": recs})
    epoch = {"mean_s": 0.03, "cv": 0.0, "robust_cv": 0.0, "events_per_epoch": 1}
    assert cal["call_overhead_by_n"][4] == pytest.approx(300e-6, rel=1e-6)
    p2, p4 = sm.local_profile(cal, epoch, 2), sm.local_profile(cal, epoch, 4)
    assert p2.call_overhead_s == pytest.approx(25e-6, rel=1e-6)
    assert p4.call_overhead_s == pytest.approx(300e-6, rel=1e-6)
    assert p4.hop_overhead_s + 1e-6 == pytest.approx(5 * alpha, rel=1e-6)
    # the same after a JSON round trip (keys become strings)
    back = json.loads(json.dumps(cal))
    assert sm.local_profile(back, epoch, 4).call_overhead_s == pytest.approx(300e-6, rel=1e-6)


def test_allreduce_mode_pays_the_buffer_and_the_count_collectives():
    # sagips.comm.modes.Allreduce: the buffer's Iallreduce, then a 1-float count; both after the last arrival
    link = Link(0.01, 80.0)
    prof = profile(epoch_s=1.0, intra=link, inter=link, n_floats=7, call_overhead_s=0.1)
    res = simulate("allreduce", 4, 1, prof)
    expected = 1.0 + allreduce_cost(4, prof) + allreduce_cost(4, prof, n_floats=1)
    assert allreduce_cost(4, prof, n_floats=1) == pytest.approx(0.1 + 2 * (0.01 + 2 / 80) + 2 * (0.01 + 1 / 80))
    np.testing.assert_allclose(res.finish, expected)


def test_calibrate_reads_the_exchange_benchmark_format():
    sm = _benchmark_module()
    data = {"meta": {"n_floats": 51_206, "cores": 2},
            "runs": [{"n_ranks": 2, "reps": 10, "techniques": {
                "ring-whole": {"median_ms": 0.4, "p10_ms": 0.3, "p90_ms": 1.0},
                "ring-chunked": {"median_ms": 0.35, "p10_ms": 0.25, "p90_ms": 1.0},
                "iallreduce-watchdog": {"median_ms": 0.3, "p10_ms": 0.2, "p90_ms": 1.0},
                "rma": {"median_ms": 0.7, "p10_ms": 0.6, "p90_ms": 1.0}}}]}
    recs = sm.exchange_records(data)
    assert {r["technique"] for r in recs} == {"ring-whole", "ring-chunked", "allreduce", "rma"}
    cal = sm.calibrate(data, extra_json={"local": LOCAL})
    assert cal["alpha_s"] > 0 and cal["beta_s_per_byte"] == pytest.approx(4e-11)


def test_validate_reports_the_relative_error():
    sm = _benchmark_module()
    cal = {"alpha_s": 3e-5, "alpha_by_n": {}, "intra_bandwidth_Bps": 1e9, "call_overhead_s": 3e-5, "t0_s": 0.0,
           "reduce_s_per_float": 2e-10, "buffer_s": 2e-5, "rma_fixed_s": 1e-4, "rma_per_peer_s": 1e-4, "cores": 2}
    epoch = {"mean_s": 0.05, "cv": 0.0, "robust_cv": 0.0, "events_per_epoch": 1600}
    run = {"mode": "ensemble", "world_size": 1, "epochs": 100, "train_seconds": [4.0], "events_per_epoch": 1600,
           "layout": {"inner_size": 1}, "config": {"comm": {"inner_size": 1, "outer_every": 20, "ring": "whole"}}}
    (row,) = sm.validate([run], cal, epoch)
    assert row["predicted_s"] == pytest.approx(5.0)
    assert row["rel_error"] == pytest.approx(0.25)


# ------------------------------------------------------------------------------------------- the wait loop
def test_poll_finish_follows_the_watchdog_back_off():
    # spin 50 us, no yield phase, then tests after sleeps of 10, 20, 40, 80 us ... (+ wake_s each): tests at
    # 50, 60, 80, 120, 200 us (wake 0); with wake 5 us: 50, 65, 90, 135 us.
    collective_delay, poll_finish, poll_interval = sim.collective_delay, sim.poll_finish, sim.poll_interval

    prof = profile(polling=True, poll_spin_s=50e-6, poll_yield_s=0.0, poll_min_sleep_s=10e-6, poll_max_sleep_s=1e-3,
                   wake_s=0.0)
    got = poll_finish(prof, np.array([30e-6, 55e-6, 100e-6, 150e-6]))
    np.testing.assert_allclose(got, [30e-6, 60e-6, 120e-6, 200e-6], rtol=1e-6)
    prof5 = profile(polling=True, poll_spin_s=50e-6, poll_yield_s=0.0, poll_min_sleep_s=10e-6, poll_max_sleep_s=1e-3,
                    wake_s=5e-6)
    np.testing.assert_allclose(poll_finish(prof5, np.array([100e-6])), [135e-6], rtol=1e-6)
    # after a long wait the gap between tests is the cap (1 ms); a collective's rounds each wait half of it
    assert poll_interval(prof, np.array([0.01]))[0] == pytest.approx(1e-3)
    assert collective_delay(prof, np.array([0.0, 0.01]), rounds=2) == pytest.approx(2 * 0.5e-3)
    assert poll_finish(profile(), np.array([1e-4]))[0] == pytest.approx(1e-4)  # polling off: exact


def test_the_model_waits_as_the_watchdog_does():
    """The model's defaults are the watchdog's own constants (sagips.comm.waitpolicy), and a wait shorter than the
    spin + yield phases is noticed at once; a longer one at the back-off's tests: 2 ms, then + 50, + 100, + 200 us."""
    from sagips.comm import waitpolicy, watchdog

    prof = profile(polling=True)
    assert (prof.poll_spin_s, prof.poll_yield_s, prof.poll_min_sleep_s, prof.poll_max_sleep_s) == (
        watchdog._SPIN_S, watchdog._YIELD_S, watchdog._MIN_SLEEP_S, watchdog._MAX_SLEEP_S) == (
        waitpolicy.SPIN_S, waitpolicy.YIELD_S, waitpolicy.MIN_SLEEP_S, waitpolicy.MAX_SLEEP_S)
    y, m = waitpolicy.YIELD_S, waitpolicy.MIN_SLEEP_S
    got = sim.poll_finish(prof, np.array([1e-3, y, y + 1e-6, y + m + 1e-6, y + 3 * m + 1e-6]))
    np.testing.assert_allclose(got, [1e-3, y, y + m, y + 3 * m, y + 7 * m], rtol=1e-9)
    assert sim.poll_interval(prof, np.array([1e-3]))[0] == 0.0  # still yielding: tests continuously


def test_a_late_neighbour_costs_the_back_off_overshoot_in_a_ring():
    # 2 ranks, hop 10 us; rank 1 arrives 100 us late. Without polling rank 0 ends at 100 + 10 us; with the
    # back-off it notices at its first test after 110 us: 120 us.
    link = Link(10e-6, math.inf)
    for polling, expected in ((False, 110e-6), (True, 120e-6)):
        prof = profile(intra=link, inter=link, polling=polling, poll_spin_s=50e-6, poll_yield_s=0.0,
                       poll_min_sleep_s=10e-6, poll_max_sleep_s=1e-3)
        end = ring_allreduce(np.array([0.0, 100e-6]), np.arange(2).reshape(1, 2), prof, "whole")[0]
        assert end[0] == pytest.approx(expected, rel=1e-6)
        assert end[1] == pytest.approx(110e-6, rel=1e-6)  # the late rank finds its data there: no wait
