"""`scaling_model.py report`: the page docs/benchmarks/scaling_model.md and its figures, whole, from the JSON.

The page holds only what scaling_model.json holds (written by `project`: the calibration, the validations, the
Polaris profile with its sources, the projection and the scenarios) under short fixed headings and labels; it
simulates and measures nothing. Explanations, history and claims are written by hand in
docs/benchmarks/scaling_model_notes.md, which the page links and no script writes.
"""
from __future__ import annotations

import json

import numpy as np

from scaling.calibrate import ROUNDS_BOUNDS, WAKE_BOUNDS_S
from scaling.common import (
    FIG_RATE,
    FIG_TIME,
    GROUPED_TARGET_GAIN,
    NOTES_MD,
    OUT_JSON,
    OUT_MD,
    PAPER_GAINS,
    REPO,
    VALIDATION_CONFIG,
    VALIDATION_INNER,
    VALIDATION_TOLERANCE,
)

GROUPED = ("ARAR-ARAR (grouped)", "RMA-ARAR-ARAR (grouped)")
WHOLE_RING = "conventional ARAR (whole ring)"
STATISTICS = {"p10_s": "10th percentile over reps", "p25_s": "25th percentile over reps", "seconds": "median over reps",
              "p90_s": "90th percentile over reps"}


def _us(x):
    return f"{x * 1e6:.1f} µs"


def _pct(x):
    return f"{100 * x:.0f}%"


def startup_for_gain(r: dict, target: float) -> float:
    """Extra fixed seconds at N=400 (vs N=4) that would lower the grouped gain to `target`."""
    c = r["projection"]["curves"]["ARAR-ARAR (grouped)"]["points"]
    t4, t400 = c[0]["train_s"], c[-1]["train_s"]
    ratio = c[-1]["n_ranks"] / c[0]["n_ranks"]
    return max(ratio * t4 / target - t400, 0.0)


def polling_at_bounds(poll: dict | None) -> list[str]:
    """The wait-loop parameters whose fit (a bisection in calibrate.fit_polling) ended on an end of its interval."""
    if not poll or poll.get("fitted_on") is None:
        return []
    return [name for name, bounds in (("wake_s", WAKE_BOUNDS_S), ("collective_rounds", ROUNDS_BOUNDS))
            if min(abs(poll[name] - b) for b in bounds) <= 1e-6 * (bounds[1] - bounds[0])]


def report(r: dict) -> str:
    """The page, from scaling_model.json (parsed): numbers and short labels only; prose lives in the notes."""
    cal, prof = r["calibration"], r["polaris_profile"]["inputs"]
    proj, g = r["projection"], r["gains_4_to_400"]
    meta = (r.get("local_measurements") or {}).get("meta") or {}
    v = r["validation"]
    bounds = cal.get("at_bounds")
    poll_bounds = polling_at_bounds(v.get("polling_fit"))
    n_lo, n_hi = proj["ranks"][0], proj["ranks"][-1]
    L = []
    w = L.append
    w("# Scaling model: training time and analysis rate vs ranks\n")
    w(f"Generated whole by `benchmarks/scaling_model.py` (`project`, or `report` from the stored JSON) from "
      f"`{OUT_JSON.name}`; model: `benchmarks/sim.py`. What the model is, how to read this page, and its limits: "
      f"[{NOTES_MD.name}]({NOTES_MD.name}) (written by hand).\n")
    w(f"Calibrated on: {meta.get('cpu', '?')} ({meta.get('cpu_capability', 'vector level not recorded')}), "
      f"{meta.get('cores', '?')} cores, measurements of "
      f"{meta.get('date', '?')}. Projected for: Polaris (the profile's inputs below).\n")
    w("![training time](scaling_time.png) ![analysis rate](scaling_rate.png)\n")

    # ------------------------------------------------------------------------------------------ projection
    pp = r["polaris_profile"]
    w(f"## Projection for Polaris ({n_lo} → {n_hi} ranks, {pp['epochs']:,} epochs, h = {pp['outer_every']})\n")
    w("| curve | " + " | ".join(f"N={n}" for n in proj["ranks"]) + f" | gain {n_lo}→{n_hi} |")
    w("|---|" + "---|" * len(proj["ranks"]) + "---|")
    for label, c in proj["curves"].items():
        w(f"| {label}: time [h] | " + " | ".join(f"{p['train_s'] / 3600:.3f}" for p in c["points"]) + " | |")
        w(f"| {label}: rate [events/s] | " + " | ".join(f"{p['rate']:.3g}" for p in c["points"]) +
          f" | **{c['gain']:.1f}x** |")
    s = proj["single_gpu"]
    w(f"\nSingle GPU (ensemble of one, no exchange; the dashed line of the rate figure): {s['train_s'] / 3600:.3f} h, "
      f"{s['rate']:.3g} events/s.\n")
    w(f"| curve | gain {n_lo}→{n_hi}, model | the paper (Fig. 12) |")
    w("|---|---|---|")
    for label, gain in g.items():
        paper = PAPER_GAINS.get(label)
        w(f"| {label} | {gain:.1f}x | {f'~{paper}x' if paper else ''} |")
    grouped = min(g[k] for k in GROUPED)
    w(f"\n**Target** (grouped modes >= {GROUPED_TARGET_GAIN}x from {n_lo} to {n_hi} ranks): "
      f"{'reached' if grouped >= GROUPED_TARGET_GAIN else 'NOT reached'} (" +
      ", ".join(f"{k.split(' (')[0]} {g[k]:.1f}x" for k in GROUPED) + ").\n")
    sat = proj["curves"][WHOLE_RING]["points"]
    slope = (sat[-1]["epoch_s"] - sat[0]["epoch_s"]) / (sat[-1]["n_ranks"] - sat[0]["n_ranks"])
    limit = prof["events_per_epoch"] / slope if slope > 0 else float("inf")
    w(f"Whole-ring saturation (from its N = {sat[0]['n_ranks']} and N = {sat[-1]['n_ranks']} points; the red dotted "
      "line of the rate figure):\n")
    w(f"- time added per epoch per rank: {_us(slope)};")
    w(f"- limit of the rate, N_disc / that: {limit:.3g} events/s; at N = {sat[-1]['n_ranks']}: "
      f"{_pct(sat[-1]['rate'] / limit)} of it;")
    w(f"- limit without the wait-loop overshoot (one slowest hop + one row addition per rank): "
      f"{proj.get('whole_ring_limit_no_overshoot', float('nan')):.3g} events/s.\n")

    # ------------------------------------------------------------------------------------------ scenarios
    w(f"## Scenarios (gain {n_lo} → {n_hi}, one input changed at a time)\n")
    labels = list(g)
    w("| scenario | " + " | ".join(labels) + " |")
    w("|---|" + "---|" * len(labels))
    for sc in r["scenarios"]:
        w(f"| {sc['scenario']} | " + " | ".join(f"{sc['gains'][k]:.1f}x" for k in labels) + " |")
    p = r["paper_like_hop"]
    hop_note = ", a fit at its bound" if bounds and "hop_overhead_s" in bounds else ""
    w("\nReference points:\n")
    w(f"- the Python per-hop cost that gives the paper's ~{PAPER_GAINS[WHOLE_RING]}x for the whole ring: "
      f"{_us(p['hop_overhead_s'])} (the profile's{hop_note}: {_us(prof['hop_overhead_s'])});")
    target = PAPER_GAINS["ARAR-ARAR (grouped)"]
    w(f"- extra start-up at N = {n_hi} over N = {n_lo} that would lower ARAR-ARAR from "
      f"{g['ARAR-ARAR (grouped)']:.1f}x to the paper's ~{target}x: ~{startup_for_gain(r, target) / 60:.0f} min.\n")

    # ------------------------------------------------------------------------------------------ inputs
    w("## Inputs of the Polaris profile\n")
    w("| input | value | source |")
    w("|---|---|---|")
    src = pp["sources"]
    clamped = set(bounds or []) | set(poll_bounds)
    rows = [("epoch_s", f"{prof['epoch_s'] * 1e3:.1f} ms"), ("jitter_cv", f"{prof['jitter_cv']:.2f}"),
            ("ranks_per_node", prof["ranks_per_node"]),
            ("inter.latency_s", _us(prof["inter"]["latency_s"])),
            ("inter.bandwidth_Bps", f"{prof['inter']['bandwidth_Bps'] / 1e9:.1f} GB/s"),
            ("intra.latency_s", _us(prof["intra"]["latency_s"])),
            ("intra.bandwidth_Bps", f"{prof['intra']['bandwidth_Bps'] / 1e9:.2f} GB/s"),
            ("hop_overhead_s", _us(prof["hop_overhead_s"])), ("call_overhead_s", _us(prof["call_overhead_s"])),
            ("allreduce_s_per_byte", f"{prof.get('allreduce_s_per_byte', 0.0) * 1e12:.0f} ps"),
            ("reduce_s_per_float", f"{prof['reduce_s_per_float'] * 1e12:.0f} ps"),
            ("offload_s", _us(prof["offload_s"])), ("rma_fixed_s", _us(prof["rma_fixed_s"])),
            ("rma_per_peer_s", _us(prof["rma_per_peer_s"])), ("rendezvous", prof["rendezvous"]),
            ("polling", prof["polling"]), ("wake_s", _us(prof["wake_s"])),
            ("collective_rounds", f"{prof['collective_rounds']:.2f}"),
            ("n_floats", f"{prof['n_floats']:,}"), ("events_per_epoch", f"{prof['events_per_epoch']:,}"),
            ("epochs", f"{pp['epochs']:,}"), ("outer_every", pp["outer_every"])]
    for k, val in rows:
        w(f"| {k} | {val}{' **(fit at its bound)**' if k in clamped else ''} | {src.get(k, '')} |")
    if bounds is None:
        w("\nFits at a bound: not recorded by this calibration (it predates the check; rerun `scaling_model.py all`).")
    elif bounds or poll_bounds:
        w("\n**Fits at a bound (clamped, not measured):** " + ", ".join(
            [*bounds, *(f"{x} (wait-loop fit on the schedule replay)" for x in poll_bounds)]) + ".")

    # ------------------------------------------------------------------------------------------ calibration
    w("\n## Calibration on this machine\n")
    m = r["local_measurements"]
    la = [meta.get("loadavg_before", [float("nan")])[0], meta.get("loadavg_after", [float("nan")])[0]]
    w(f"{meta.get('cpu', '?')} ({meta.get('cpu_capability', 'vector level not recorded')}), "
      f"{meta.get('cores', '?')} cores; load average {la[0]:.1f} before, {la[1]:.1f} after "
      "the measurements.\n")
    stat = STATISTICS.get(cal.get("statistic"), cal.get("statistic"))
    if cal.get("hop_fit") == "hop":
        w(f"Fits on the {stat} of the timings at N <= {cal['cores']}, each constant on the measurement that isolates "
          "it:\n")
        w(f"- one ring hop alone = alpha + bytes · beta ({cal['fit_points']} points): alpha = {_us(cal['alpha_s'])} "
          f"per hop, beta = {cal['beta_s_per_byte'] * 1e12:.1f} ps/byte ({cal['intra_bandwidth_Bps'] / 1e9:.2f} GB/s);")
        w(f"- t0 = {_us(cal['t0_s'])}: a ring call minus its hops and its measured local work (median over the ring "
          "records);")
    else:
        w(f"Ring fit: time = t0 + hops · (alpha + bytes · beta) on the {stat} of the ring times at N <= "
          f"{cal['cores']}, measured local work removed ({cal['fit_points']} points):\n")
        w(f"- t0 = {_us(cal['t0_s'])}, alpha = {_us(cal['alpha_s'])} per hop, beta = "
          f"{cal['beta_s_per_byte'] * 1e12:.1f} ps/byte ({cal['intra_bandwidth_Bps'] / 1e9:.2f} GB/s);")
    w(f"- Iallreduce + watchdog call overhead {_us(cal['call_overhead_s'])} + "
      f"{cal.get('allreduce_s_per_byte', 0.0) * 1e12:.0f} ps/byte beyond the modelled rounds; numpy add "
      f"{cal['reduce_s_per_float'] * 1e12:.0f} ps/float; RMA {_us(cal['rma_fixed_s'])} + "
      f"{_us(cal['rma_per_peer_s'])} per peer;")
    w("- per-hop cost by N, from the medians (at N > cores with the OS time-slicing): " +
      ", ".join(f"N={k}: {_us(val)}" for k, val in cal["alpha_by_n"].items()) + ";")
    if cal.get("call_overhead_by_n"):
        w("- Iallreduce call overhead by N, from the medians: " +
          ", ".join(f"N={k}: {_us(val)}" for k, val in cal["call_overhead_by_n"].items()) + ".\n")
    else:
        w("")
    if cal.get("allreduce_check"):
        w("Mode allreduce's whole exchange (buffer + count Iallreduce), measured against the model with the call "
          "overhead at that N:\n")
        w("| N | measured p10 (median) | model | error vs median |")
        w("|---|---|---|---|")
        for x in cal["allreduce_check"]:
            w(f"| {x['n_ranks']} | {x['measured_s'] * 1e3:.3f} ms ({x['median_s'] * 1e3:.3f}) | "
              f"{x['predicted_median_s'] * 1e3:.3f} ms | {100 * x['rel_error_median']:+.0f}% |")
        w("")
    w("| technique | N | floats | measured p10 (median) | model | error | in fit |")
    w("|---|---|---|---|---|---|---|")
    for x in cal["residuals"]:
        w(f"| {x['technique']} | {x['n_ranks']} | {x['n_floats']:,} | {x['measured_s'] * 1e3:.3f} ms "
          f"({x['median_s'] * 1e3:.3f}) | {x['predicted_s'] * 1e3:.3f} ms | {100 * x['rel_error']:+.0f}% | "
          f"{'yes' if x['in_fit'] else 'no (oversubscribed)'} |")
    cross = r.get("calibration_from_exchange_json")
    if cross and "alpha_s" in cross:
        nbytes = 4 * (prof["n_floats"] + 1)
        w(f"\nCross-check, the comm layer's `exchange.json` (benchmarks/exchange.py; one buffer size, beta fixed to "
          f"the memcpy bandwidth): alpha = {_us(cross['alpha_s'])}, against alpha + {nbytes / 1e3:.1f} kB · beta = "
          f"{_us(cal['alpha_s'] + nbytes * cal['beta_s_per_byte'])} here; per-hop cost by N from its medians: " +
          ", ".join(f"N={k}: {_us(val)}" for k, val in cross["alpha_by_n"].items()) + ".")
    elif cross and "error" in cross:
        w(f"\nCross-check with `exchange.json`: not possible ({cross['error']}).")
    ep = m.get("epoch") or {}
    if ep:
        reps = ep.get("repeats", [])
        w(f"\nSingle-rank epoch timing (validation settings, batch {ep.get('events_per_epoch')}), {len(reps)} "
          "repeats: " + ", ".join(f"{x['train_s'] / x['epochs'] * 1e3:.1f}" for x in reps) +
          f" ms/epoch; local epoch_s (the least disturbed): {ep['mean_s'] * 1e3:.1f} ms/epoch; its per-epoch CV "
          f"{ep['cv']:.2f}, robust {ep['robust_cv']:.2f} (the local jitter).\n")
        if ep.get("corun_s"):
            w("Co-run timing (the same ensemble, one rank per core, no exchange): " +
              ", ".join(f"{t * 1e3:.1f}" for t in ep["corun_s"]) + " ms/epoch; co-run factor (the least disturbed "
              f"over epoch_s): {ep['corun_factor']:.2f}.\n")

    # ------------------------------------------------------------------------------------------ validation
    w("## Validation: predicted vs measured time (this machine)\n")
    tol = _pct(VALIDATION_TOLERANCE)
    if v.get("schedule_replay"):
        st = v["replay_settings"]
        pf = v["polling_fit"] or {}
        ns = sorted({x["n_ranks"] for x in v["schedule_replay"]})
        w(f"### 1. Schedule replay (`validate --schedule`): the real exchanges between sleeping pipelines "
          f"(N = {', '.join(map(str, ns))})\n")
        cases = "; ".join(f"{name} (sleep cv {cv:.2f}" + (f", last rank +{extra * 1e3:.0f} ms per epoch" if extra else "")
                          + ")" for name, (cv, extra) in st["cases"].items())
        w(f"- settings: {st['epochs']} epochs, sleep {st['epoch_s'] * 1e3:.0f} ms per epoch and rank, inner groups of "
          f"{st['inner_size']}, h = {st['outer_every']}, {prof['n_floats']:,} floats; cases: {cases};")
        pb = {x: " (at its bound)" for x in poll_bounds}
        w(f"- wait-loop fit on {pf.get('fitted_on')}: wake_s = {pf.get('wake_s', 0) * 1e3:.2f} ms"
          f"{pb.get('wake_s', '')}, collective_rounds = {pf.get('collective_rounds', 1):.2f}"
          f"{pb.get('collective_rounds', '')}; the rows marked (fitted) are that fit, the others predictions.\n")
        w("| case | mode | N | measured [s] | predicted [s] | error |")
        w("|---|---|---|---|---|---|")
        for x in v["schedule_replay"]:
            w(f"| {x['case']} | {x['mode']} | {x['n_ranks']} | {x['measured_s']:.3f} | {x['predicted_s']:.3f} | "
              f"{100 * x['rel_error']:+.1f}%{' (fitted)' if x['fitted'] else ''} |")
        pred_rows = [x for x in v["schedule_replay"] if not x["fitted"]]
        ok = sum(abs(x["rel_error"]) <= VALIDATION_TOLERANCE for x in pred_rows)
        worst = max(pred_rows, key=lambda x: abs(x["rel_error"]))
        w(f"\n{ok} of {len(pred_rows)} predicted rows within {tol}; largest error "
          f"{100 * v['max_abs_error_replay']:.1f}% ({worst['mode']}, N={worst['n_ranks']}, {worst['case']}).\n")
    settings = (f"{VALIDATION_CONFIG}, {v['settings']['epochs']} epochs, " +
                ", ".join(f"`{s}`" for s in v["settings"]["sets"]) + f", `comm.inner_size=min({VALIDATION_INNER}, N)`")
    if v.get("pairs"):
        w("### 2. Tiny training runs (`validate --paired`), each predicted from its own single-rank reference run\n")
        w(f"Settings: {settings}. The N=1 row compares two consecutive single-rank runs.\n")
        w("| mode | N | reference [ms/epoch] | measured [s] | predicted [s] | error per pair | median error |")
        w("|---|---|---|---|---|---|---|")
        for x in v["pairs"]:
            w(f"| {x['mode']} | {x['n_ranks']} | " + ", ".join(f"{t * 1e3:.0f}" for t in x["ref_epoch_s"]) + " | " +
              ", ".join(f"{t:.2f}" for t in x["measured_s"]) + " | " +
              ", ".join(f"{t:.2f}" for t in x["predicted_s"]) + " | " +
              ", ".join(f"{100 * e:+.0f}%" for e in x["rel_errors"]) + f" | **{100 * x['rel_error']:+.0f}%** |")
        w(f"\nLargest median error: {100 * v['max_abs_median_error_pairs']:.0f}%.\n")
    if v["runs"]:
        w("### 3. Tiny training runs (`validate --run`), unpaired repeats, predicted from the epoch timing above\n")
        w(f"Settings: {settings}. Measured: the least disturbed (minimum) run of each configuration, with the median "
          "and maximum.\n")
        w("| mode | N | epochs | measured [s]: min (median, max) of repeats | predicted [s] | error vs min |")
        w("|---|---|---|---|---|---|")
        for x in v["runs"]:
            w(f"| {x['mode']} | {x['n_ranks']} | {x['epochs']} | {x['measured_s']:.2f} ({x['measured_median_s']:.2f}, "
              f"{x['measured_max_s']:.2f}; {x['repeats']} runs) | {x['predicted_s']:.2f} | "
              f"{100 * x['rel_error']:+.1f}% |")
        ok = sum(abs(x["rel_error"]) <= VALIDATION_TOLERANCE for x in v["runs"])
        worst = max(v["runs"], key=lambda x: abs(x["rel_error"]))
        load = v.get("loadavg")
        w(f"\n{ok} of {len(v['runs'])} configurations within {tol}; largest error "
          f"{100 * v['max_abs_error']:.1f}% ({worst['mode']}, N={worst['n_ranks']}), whose own repeats span "
          f"{100 * (worst['measured_max_s'] / worst['measured_s'] - 1):.0f}% (max over min)." +
          (f" Load average (1, 5, 15 min) after the runs: {', '.join(f'{x:.1f}' for x in load)}." if load else "") +
          "\n")
        if v.get("note"):
            w(f"Note stored with the runs: {v['note']}\n")
    if not v["runs"] and not v.get("pairs"):
        w("Not run yet: `benchmarks/scaling_model.py validate --paired`.\n")
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
