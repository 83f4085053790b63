"""`scaling_model.py report`: the page docs/benchmarks/scaling_model.md and its figures, from scaling_model.json.

It simulates and measures nothing: `project` writes the JSON and then calls write_page.
"""
from __future__ import annotations

import json

import numpy as np

from scaling.common import FIG_RATE, FIG_TIME, N_WEIGHTS, NOTES_MD, OUT_JSON, OUT_MD, REPO, VALIDATION_INNER


def _us(x):
    return f"{x * 1e6:.1f} µs"


def g_sc(r: dict, scenario: str, curve: str) -> float:
    """Gain 4 -> 400 of `curve` in `scenario` (nan if absent)."""
    for sc in r["scenarios"]:
        if sc["scenario"] == scenario:
            return sc["gains"].get(curve, float("nan"))
    return float("nan")


def startup_for_gain(r: dict, target: float) -> float:
    """Extra fixed seconds at N=400 (vs N=4) that would lower the grouped gain to `target`."""
    c = r["projection"]["curves"]["ARAR-ARAR (grouped)"]["points"]
    t4, t400 = c[0]["train_s"], c[-1]["train_s"]
    ratio = c[-1]["n_ranks"] / c[0]["n_ranks"]
    return max(ratio * t4 / target - t400, 0.0)


def report(r: dict) -> str:
    cal, prof = r["calibration"], r["polaris_profile"]["inputs"]
    proj = r["projection"]
    L = []
    w = L.append
    w("# Scaling model: training time and analysis rate vs ranks\n")
    w("Written by `benchmarks/scaling_model.py` (model: `benchmarks/sim.py`). A discrete-event simulation of every mode's "
      "schedule per epoch: compute time per rank (mean + jitter + stragglers), ring hops that wait for their "
      "neighbours (whole: N-1 hops of the full buffer; chunked: 2(N-1) hops of buffer/N), MPI_Allreduce "
      "(Rabenseifner: 2 log2 N rounds, a barrier-like collective), the RMA inner step (local cost only, never "
      "waits), and the leaders' ring every h epochs followed by a broadcast inside each group. "
      "Times are the slowest rank's; rate = eq. 9 = N · N_disc · E / time.\n")
    w("![training time](scaling_time.png) ![analysis rate](scaling_rate.png)\n")

    w("## Projection for Polaris (4 → 400 ranks, 100k epochs, h = 1000)\n")
    w("| curve | " + " | ".join(f"N={n}" for n in proj["ranks"]) + " | gain 4→400 |")
    w("|---|" + "---|" * len(proj["ranks"]) + "---|")
    for label, c in proj["curves"].items():
        w(f"| {label}: time [h] | " + " | ".join(f"{p['train_s'] / 3600:.3f}" for p in c["points"]) + " | |")
        w(f"| {label}: rate [events/s] | " + " | ".join(f"{p['rate']:.3g}" for p in c["points"]) +
          f" | **{c['gain']:.1f}x** |")
    s = proj["single_gpu"]
    w(f"\nSingle GPU (ensemble of one, no exchange): {s['train_s'] / 3600:.3f} h, {s['rate']:.3g} events/s "
      "(the dashed line of the rate figure).\n")
    g = r["gains_4_to_400"]
    grouped = min(g["ARAR-ARAR (grouped)"], g["RMA-ARAR-ARAR (grouped)"])
    w("**Target** (gain from 4 to 400 ranks >= 90x for the grouped modes; conventional ARAR saturates): "
      f"grouped modes {g['ARAR-ARAR (grouped)']:.1f}x (ARAR-ARAR) and {g['RMA-ARAR-ARAR (grouped)']:.1f}x "
      f"(RMA-ARAR-ARAR) -> {'reached' if grouped >= 90 else 'NOT reached'}; conventional ARAR "
      f"{g['conventional ARAR (whole ring)']:.1f}x (whole ring, the paper's), "
      f"{g['conventional ARAR (chunked ring)']:.1f}x (chunked ring); MPI_Allreduce "
      f"{g['allreduce (MPI_Allreduce)']:.1f}x. The paper measured ~40x (conventional) and ~80x (grouped).\n")
    w("Why: a whole ring over N ranks costs N-1 sequential hops every epoch, each a Python-level Isend/Irecv/wait "
      f"(fitted here: {_us(prof['hop_overhead_s'])} per hop beyond the MPI latency, beside a fixed "
      f"{_us(r['calibration'].get('t0_s', 0.0))} per call) plus the 202 kB transfer, plus the addition of N rows, and "
      "every hop whose data is late makes the waiting rank fall into the watchdog's sleep back-off, from which it "
      "wakes late (each sleep costs at least the timer slack, modelled as 60 µs); the lateness passes on to its "
      "neighbour in the next hop. At 400 ranks this is comparable to the A100 epoch itself and grows linearly "
      "with N: the rate saturates. The chunked ring moves 1/N of the bytes per hop but makes twice as many "
      "hops, so while per-hop costs dominate (they do: 200 kB cross Slingshot in ~8 µs) it is *slower*. "
      "MPI_Allreduce needs only 2 log2 N rounds, but as a nonblocking collective polled by the same sleeping loop "
      "each round waits for the early ranks' next test. The grouped modes pay 3 intra-node hops per epoch (or an "
      "RMA step that never waits) and 99 inter-node hops only every 1000 epochs: their per-epoch time is nearly "
      "that of 4 ranks. Their remaining losses are the synchronisation of all ranks at every outer step (the "
      "slowest group of 100 after 1000 jittered epochs), and inside a group the slowest of 4 ranks each epoch "
      "(ARAR-ARAR, also at N = 4).\n")
    sat = proj["curves"]["conventional ARAR (whole ring)"]["points"]
    slope = (sat[-1]["epoch_s"] - sat[0]["epoch_s"]) / (sat[-1]["n_ranks"] - sat[0]["n_ranks"])
    limit = prof["events_per_epoch"] / slope if slope > 0 else float("inf")
    w(f"Saturation: the whole ring adds {_us(slope)} per epoch per rank (4 -> 400), so its rate N · N_disc / "
      f"time tends to N_disc / {_us(slope)} = {limit:.3g} events/s; at 400 ranks it is at "
      f"{100 * sat[-1]['rate'] / limit:.0f}% of that (red dotted line), while the grouped modes still grow "
      "linearly. Without the wait-loop overshoot (one slowest hop plus one row addition per rank) the limit would "
      f"be {proj.get('whole_ring_limit_no_overshoot', float('nan')):.3g} events/s.\n")
    w("Design changes that lift conventional ARAR (and the allreduce baseline), from the scenarios: "
      f"(1) wait without sleeping during an exchange (busy-wait on Test/Waitall, or a back-off capped near the hop "
      f"time instead of 1 ms): whole ring {g_sc(r, 'busy-wait exchanges (no sleep back-off)', 'conventional ARAR (whole ring)'):.0f}x, "
      f"MPI_Allreduce {g_sc(r, 'busy-wait exchanges (no sleep back-off)', 'allreduce (MPI_Allreduce)'):.0f}x; "
      "(2) a tree / recursive-doubling allreduce (MPI_Allreduce with a blocking or busy wait, or NCCL's double "
      "binary tree): log2 N rounds instead of N-1 hops; (3) overlapping the exchange with the next epoch's critic "
      "step (one-step-stale gradients, as Stochastic Gradient Push), which hides it while it is shorter than the "
      "epoch; (4) the chunked ring only once the transfer, not the per-hop cost, dominates (bigger generators, or "
      "a C-level ring such as MPI's own). The grouped modes need none of these to pass 90x.\n")

    w("## Scenarios (gain 4 → 400, one input changed at a time)\n")
    labels = list(r["gains_4_to_400"])
    w("| scenario | " + " | ".join(labels) + " |")
    w("|---|" + "---|" * len(labels))
    for sc in r["scenarios"]:
        w(f"| {sc['scenario']} | " + " | ".join(f"{sc['gains'][k]:.1f}x" for k in labels) + " |")
    p = r["paper_like_hop"]
    conv = g["conventional ARAR (whole ring)"]
    w(f"\nThe paper's ~40x for conventional ARAR: the baseline gives {conv:.0f}x. (For reference, the per-hop "
      f"Python cost that would give exactly 40x is {_us(p['hop_overhead_s'])} instead of the "
      f"{_us(prof['hop_overhead_s'])} measured here.) The model does not reproduce the paper's ~80x for the "
      "grouped modes from the exchange: they stay near 100x in every scenario. The paper's 'total training time' "
      "may include start-up (imports on 400 ranks, the broadcast of the reference data), which sagips.run keeps "
      "out of train_seconds and this model does not contain: 80x instead of "
      f"{g['ARAR-ARAR (grouped)']:.0f}x would take ~{startup_for_gain(r, 80) / 60:.0f} min more start-up at 400 "
      "ranks than at 4.\n")
    w("## Inputs of the Polaris profile\n")
    w("| input | value | source |")
    w("|---|---|---|")
    src = r["polaris_profile"]["sources"]
    rows = [("epoch_s", f"{prof['epoch_s'] * 1e3:.1f} ms"), ("jitter_cv", f"{prof['jitter_cv']:.2f}"),
            ("ranks_per_node", prof["ranks_per_node"]),
            ("inter.latency_s", _us(prof["inter"]["latency_s"])),
            ("inter.bandwidth_Bps", f"{prof['inter']['bandwidth_Bps'] / 1e9:.1f} GB/s"),
            ("intra.latency_s", _us(prof["intra"]["latency_s"])),
            ("intra.bandwidth_Bps", f"{prof['intra']['bandwidth_Bps'] / 1e9:.2f} GB/s"),
            ("hop_overhead_s", _us(prof["hop_overhead_s"])), ("call_overhead_s", _us(prof["call_overhead_s"])),
            ("reduce_s_per_float", f"{prof['reduce_s_per_float'] * 1e12:.0f} ps"),
            ("offload_s", _us(prof["offload_s"])), ("rma_fixed_s", _us(prof["rma_fixed_s"])),
            ("rma_per_peer_s", _us(prof["rma_per_peer_s"])), ("rendezvous", prof["rendezvous"]),
            ("polling", prof["polling"]), ("wake_s", _us(prof["wake_s"])),
            ("collective_rounds", f"{prof['collective_rounds']:.2f}"),
            ("n_floats", f"{prof['n_floats']:,}"), ("events_per_epoch", f"{prof['events_per_epoch']:,}"),
            ("epochs", f"{r['polaris_profile']['epochs']:,}"), ("outer_every", r["polaris_profile"]["outer_every"])]
    for k, v in rows:
        w(f"| {k} | {v} | {src.get(k, '')} |")
    bounds = r["calibration"].get("at_bounds")
    if bounds:
        w(f"\n**Fits at a bound (these inputs were not measured, only clamped):** {', '.join(bounds)}. A scenario "
          "that scales such an input by a factor would equal the baseline; the hop-overhead scenarios then use "
          "assumed absolute values, labelled so.")
    elif bounds is None:
        w("\n(This calibration predates the bound check: rerun `scaling_model.py all` to know whether a fit sat at "
          "its bound.)")

    w("\n## Calibration on this machine\n")
    m = r["local_measurements"]
    meta = m.get("meta") or {}
    la = [meta.get("loadavg_before", [float("nan")])[0], meta.get("loadavg_after", [float("nan")])[0]]
    w(f"{meta.get('cpu', '?')}, {meta.get('cores', '?')} cores shared with other jobs (load average "
      f"{la[0]:.1f} before, {la[1]:.1f} after the measurements). Ring times (10th percentile over reps: the "
      "cost when no rank was preempted) at N <= cores were fitted with time = t0 + hops · (alpha + bytes · beta) "
      f"after removing the measured local work (row additions, copy-in, divide); t0 = {_us(cal['t0_s'])}:\n")
    w(f"- alpha = {_us(cal['alpha_s'])} per hop, beta = {cal['beta_s_per_byte'] * 1e12:.1f} ps/byte "
      f"({cal['intra_bandwidth_Bps'] / 1e9:.2f} GB/s), {cal['fit_points']} points;")
    w(f"- Iallreduce + watchdog call overhead {_us(cal['call_overhead_s'])}; numpy add "
      f"{cal['reduce_s_per_float'] * 1e12:.0f} ps/float; RMA {_us(cal['rma_fixed_s'])} + "
      f"{_us(cal['rma_per_peer_s'])} per peer;")
    w("- per-hop cost by N (at N > cores it contains the OS time-slicing of an oversubscribed machine): " +
      ", ".join(f"N={k}: {_us(v)}" for k, v in cal["alpha_by_n"].items()) + ".\n")
    w("| technique | N | floats | measured p10 (median) | model | error | in fit |")
    w("|---|---|---|---|---|---|---|")
    for x in cal["residuals"]:
        w(f"| {x['technique']} | {x['n_ranks']} | {x['n_floats']:,} | {x['measured_s'] * 1e3:.3f} ms "
          f"({x['median_s'] * 1e3:.3f}) | {x['predicted_s'] * 1e3:.3f} ms | {100 * x['rel_error']:+.0f}% | "
          f"{'yes' if x['in_fit'] else 'no (oversubscribed)'} |")
    cross = r.get("calibration_from_exchange_json")
    if cross and "alpha_s" in cross:
        w(f"\nCross-check with the comm layer's `exchange.json` (benchmarks/exchange.py: one buffer size, N = 2, 4, "
          f"8, another time of day): with one size alpha and beta cannot be separated; with beta fixed to the "
          f"memcpy bandwidth the whole transfer lands in alpha = {_us(cross['alpha_s'])} (vs alpha + 202 kB · beta "
          f"= {_us(cal['alpha_s'] + 4 * (N_WEIGHTS + 1) * cal['beta_s_per_byte'])} here). Per-hop cost by N from "
          "its medians: " + ", ".join(f"N={k}: {_us(v)}" for k, v in cross["alpha_by_n"].items()) + ".")
    ep = m.get("epoch") or {}
    if ep:
        reps = ep.get("repeats", [])
        w(f"\nSingle-rank epoch timing (validation settings: batch {ep.get('events_per_epoch')}, 1 thread), "
          f"{len(reps)} repeats: " + ", ".join(f"{x['train_s'] / x['epochs'] * 1e3:.1f}" for x in reps) +
          f" ms/epoch; the least disturbed, {ep['mean_s'] * 1e3:.1f} ms/epoch, is the local epoch_s (its "
          f"per-epoch CV {ep['cv']:.2f}, robust {ep['robust_cv']:.2f}, is the local jitter).\n")
        if ep.get("corun_s"):
            w("Co-run timing (the same ensemble with one rank per core, no exchange): " +
              ", ".join(f"{t * 1e3:.1f}" for t in ep["corun_s"]) + f" ms/epoch; the least disturbed over the "
              f"single-rank epoch_s is the co-run factor {ep['corun_factor']:.2f}: how much slower a rank computes "
              "while the other core computes too (shared caches, memory bandwidth, clocks). The local profile "
              "multiplies compute by it from N = 2 on (1 on Polaris: one GPU per rank).\n")

    w("## Validation: predicted vs measured time (this machine)\n")
    v = r["validation"]
    if v.get("schedule_replay"):
        st = v["replay_settings"]
        pf = v["polling_fit"] or {}
        w("### 1. Schedule replay: the real exchanges between sleeping pipelines (N = 1, 2, 4)\n")
        w(f"`validate --schedule`: under mpiexec, every mode built by `sagips.comm.modes.build_exchange` (the code "
          f"sagips.run uses) exchanges the 50,688-float buffer for {st['epochs']} epochs; between exchanges each "
          f"rank sleeps a known time ({st['epoch_s'] * 1e3:.0f} ms x (1 + 10% N(0,1)), or +15 ms every epoch on the "
          f"last rank), inner groups of {st['inner_size']}, h = {st['outer_every']}. A sleeping pipeline does not "
          "compete for the 2 shared cores, so this isolates what the model is about: the schedule and its waits. "
          "The model replays the same sleeps. Two parameters of the watchdog's wait loop are fitted on one case "
          f"({pf.get('fitted_on')}): wake_s = {pf.get('wake_s', 0) * 1e3:.2f} ms (how late a sleeping rank wakes "
          f"on this machine) and collective_rounds = {pf.get('collective_rounds', 1):.2f}; every other row "
          "is a prediction.\n")
        w("| case | mode | N | measured [s] | predicted [s] | error |")
        w("|---|---|---|---|---|---|")
        for x in v["schedule_replay"]:
            w(f"| {x['case']} | {x['mode']} | {x['n_ranks']} | {x['measured_s']:.3f} | {x['predicted_s']:.3f} | "
              f"{100 * x['rel_error']:+.1f}%{' (fitted)' if x['fitted'] else ''} |")
        pred_rows = [x for x in v["schedule_replay"] if not x["fitted"]]
        ok = sum(abs(x["rel_error"]) <= 0.2 for x in pred_rows)
        worst = max(pred_rows, key=lambda x: abs(x["rel_error"]))
        w(f"\n{ok} of {len(pred_rows)} predicted rows are within 20%; the largest error is "
          f"{100 * v['max_abs_error_replay']:.1f}% ({worst['mode']}, N={worst['n_ranks']}, {worst['case']}): the "
          "polled rounds of MPI's nonblocking allreduce are the crudest part of the model (fitted at N=2 as "
          "collective_rounds x 2 ceil(log2 N); the measured cost grows more slowly with N). "
          "The straggler rows show the semantics: with +15 ms on the last rank, arar and allreduce run at the "
          "straggler's pace plus their waits; rma-arar-arar stays near the straggler's own time (nobody waits "
          "for it between outer epochs). Before the wait loop was modelled (polling off) the synchronous modes were "
          "under-predicted by 10-39%: on this machine a rank that sleeps in the back-off wakes milliseconds late.\n")
    if v.get("pairs"):
        w("### 2. Tiny training runs (sagips.run), paired\n")
        w(f"Runs (`validate --paired`): configs/proxy1d-quick.yaml, {v['settings']['epochs']} epochs, " +
          ", ".join(f"`{s}`" for s in v["settings"]["sets"]) + f", `comm.inner_size=min({VALIDATION_INNER}, N)`. "
          "This machine's 2 cores are shared with other jobs whose load changes the speed of a run by up to "
          "several times within minutes. So every run is paired with a single-rank reference run of the same "
          "settings started right before it, and is predicted from that reference's epoch time (compute slowed by "
          "the co-run factor from N = 2 on and by N / cores beyond the cores; all ranks on one node; the per-hop cost measured at that "
          "N; the jitter of the epoch timing). The N=1 row compares two consecutive single-rank runs: it is the "
          "noise floor of the method.\n")
        w("| mode | N | reference [ms/epoch] | measured [s] | predicted [s] | error per pair | median error |")
        w("|---|---|---|---|---|---|---|")
        for x in v["pairs"]:
            w(f"| {x['mode']} | {x['n_ranks']} | " + ", ".join(f"{t * 1e3:.0f}" for t in x["ref_epoch_s"]) + " | " +
              ", ".join(f"{t:.2f}" for t in x["measured_s"]) + " | " +
              ", ".join(f"{t:.2f}" for t in x["predicted_s"]) + " | " +
              ", ".join(f"{100 * e:+.0f}%" for e in x["rel_errors"]) + f" | **{100 * x['rel_error']:+.0f}%** |")
        w(f"\nLargest median error: {100 * v['max_abs_median_error_pairs']:.0f}%. The N=1 row, two consecutive "
          "identical single-rank runs, already differs by up to tens of percent: the noise floor of CPU-bound "
          "runs on this shared machine is above the 20% target, so these rows cannot confirm or refute the model "
          "to 20%; the schedule replay above is the validation that can.\n")
    if v["runs"]:
        w("### 3. Tiny training runs, unpaired repeats (calibrated on separate epoch timings)\n")
        w(f"Runs (`validate --run`): configs/proxy1d-quick.yaml, {v['settings']['epochs']} epochs, " +
          ", ".join(f"`{s}`" for s in v["settings"]["sets"]) + f", `comm.inner_size=min({VALIDATION_INNER}, N)`"
          ". The local profile: the single-rank epoch time above, compute slowed by the co-run factor from N = 2 "
          "on and by N / cores beyond the 2 cores, all ranks on one node, the per-hop cost measured at that N.\n")
        w("Runs of one configuration scatter with the background load (the median and maximum columns). The model "
          "is calibrated on the least disturbed single-rank timing, so it is compared with the least disturbed "
          "(minimum) run of each configuration.\n")
        w("| mode | N | epochs | measured [s]: min (median, max) of repeats | predicted [s] | error vs min |")
        w("|---|---|---|---|---|---|")
        for x in v["runs"]:
            w(f"| {x['mode']} | {x['n_ranks']} | {x['epochs']} | {x['measured_s']:.2f} ({x['measured_median_s']:.2f}, "
              f"{x['measured_max_s']:.2f}; {x['repeats']} runs) | {x['predicted_s']:.2f} | "
              f"{100 * x['rel_error']:+.1f}% |")
        ok = sum(abs(x["rel_error"]) <= 0.2 for x in v["runs"])
        worst = max(v["runs"], key=lambda x: abs(x["rel_error"]))
        load = v.get("loadavg")
        w(f"\n{ok} of {len(v['runs'])} configurations are within 20%; the largest error is "
          f"{100 * v['max_abs_error']:.1f}% ({worst['mode']}, N={worst['n_ranks']}), whose own repeats span "
          f"{100 * (worst['measured_max_s'] / worst['measured_s'] - 1):.0f}% (max over min)." +
          (f" Load average (1, 5, 15 min) after the runs: {', '.join(f'{x:.1f}' for x in load)}." if load else "") +
          "\n")
        if v.get("note"):
            w(v["note"] + "\n")
    if not v["runs"] and not v.get("pairs"):
        w("Not run yet: `benchmarks/scaling_model.py validate --paired`.\n")
    w("## Limits\n")
    w("- No GPU and no Polaris in this session: the A100 epoch time is derived from the paper, Slingshot numbers "
      "are vendor figures, and the Python/mpi4py overheads are measured on this (shared, 2-core) machine.\n"
      "- The broadcast after an outer ring is a group barrier + a binomial tree's depth of hops (rendezvous); "
      "MPI_Allreduce a barrier + Rabenseifner rounds; no network contention between simultaneous hops "
      "(one inter-node hop per node pair per ring step, so none is expected for block placement); no OS noise "
      "beyond the Gaussian jitter and the straggler scenarios.\n"
      "- The Python per-hop overhead was measured on this machine's Xeon and is used as-is for Milan; the A100 "
      "epoch time is the input the projection is most sensitive to for conventional ARAR (scenarios).\n"
      "- Start-up (imports, data broadcast) and checkpoint/log time are not modelled (sagips.run keeps them out "
      "of train_seconds too).\n")
    return "\n".join(L) + "\n"


def write_page(result: dict) -> None:
    """The figures and the page from a parsed scaling_model.json; the notes are left alone."""
    figures(result["projection"])
    OUT_MD.write_text(report(result))
    if not NOTES_MD.exists():
        print(f"warning: {NOTES_MD.relative_to(REPO)} (hand-written notes, linked from the page) does not exist")


def cmd_report(args=None) -> None:
    """Only the page and figures, again, from the stored JSON (no simulation, no measurement)."""
    write_page(json.loads(OUT_JSON.read_text()))
    print(f"wrote {OUT_MD.relative_to(REPO)}, {FIG_TIME.name}, {FIG_RATE.name} from {OUT_JSON.relative_to(REPO)}")


def figures(proj: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"allreduce": ("tab:gray", "o", "-"), "arar": ("tab:red", "s", "-"),
              "arar-arar": ("tab:blue", "^", "-"), "rma-arar-arar": ("tab:green", "D", "-")}
    ranks = np.array(proj["ranks"])

    def add_node_axis(ax):
        top = ax.secondary_xaxis("top", functions=(lambda n: n / 4, lambda m: m * 4))
        nodes = [n // 4 for n in proj["ranks"]]
        top.set_xticks(nodes, [str(m) for m in nodes])
        top.minorticks_off()
        top.set_xlabel("nodes (4 A100 each)", color="tab:red")
        top.tick_params(axis="x", colors="tab:red")

    # Fig. 11 style: training time vs ranks (log x)
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    for label, c in proj["curves"].items():
        color, marker, ls = styles[c["mode"]]
        if c["ring"] == "chunked":
            ls, marker = "--", "x"
        ax.plot(ranks, [p["train_s"] / 3600 for p in c["points"]], ls, color=color, marker=marker, label=label)
    ax.axhline(proj["single_gpu"]["train_s"] / 3600, color="k", ls=":", lw=1, label="single GPU (no exchange)")
    ax.set_xscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("N(ranks)")
    ax.set_ylabel("total training time [h] (100k epochs)")
    ax.set_title("Projected training time on Polaris (model, h = 1000)", fontsize=10)
    add_node_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(FIG_TIME, dpi=130)
    plt.close(fig)

    # Fig. 12 style: analysis rate vs ranks (log-log), single-GPU rate dashed, rates at N=400 in the corner
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    lines = []
    for label, c in proj["curves"].items():
        color, marker, ls = styles[c["mode"]]
        if c["ring"] == "chunked":
            ls, marker = "--", "x"
        ax.plot(ranks, [p["rate"] for p in c["points"]], ls, color=color, marker=marker, label=label)
        lines.append(f"{label.split(' (')[0]}{' (chunked)' if c['ring'] == 'chunked' else ''}: "
                     f"{c['points'][-1]['rate']:.2e}/s ({c['gain']:.0f}x)")
    ax.axhline(proj["single_gpu"]["rate"], color="k", ls="--", lw=1,
               label=f"single GPU: {proj['single_gpu']['rate']:.2e} events/s")
    if proj.get("whole_ring_limit"):
        ax.axhline(proj["whole_ring_limit"], color="tab:red", ls=":", lw=1,
                   label=f"whole-ring saturation (N -> inf): {proj['whole_ring_limit']:.2e} events/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("N(ranks)")
    ax.set_ylabel("analysis rate [events/s] (eq. 9)")
    ax.set_title("Projected analysis rate on Polaris (model, h = 1000)", fontsize=10)
    add_node_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.text(0.98, 0.03, "N = 400 (gain vs N = 4):\n" + "\n".join(lines), transform=ax.transAxes, fontsize=6.5,
            ha="right", va="bottom", bbox=dict(boxstyle="round", fc="white", ec="0.7"))
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(FIG_RATE, dpi=130)
    plt.close(fig)
