"""Calibration: the model's exchange inputs fitted on this machine's measurements, and the local profiles.

calibrate(measurements_json) fits alpha and beta (least squares over the ring times at N <= cores, after removing
the measured local work), the per-call overhead of a collective, and the RMA costs; it also reads the comm
layer's docs/benchmarks/exchange.json (one buffer size) as a cross-check. fit_polling fits two parameters of the
watchdog's wait loop (wake_s, collective_rounds) on one case of the schedule replay (`validate --schedule`).
local_profile is this machine as a sim.Profile (the validations predict with it).
"""
from __future__ import annotations

import math

import numpy as np
from sim import Link, Profile, simulate

from scaling.common import (
    LOCAL_MPI_LATENCY_S,
    N_WEIGHTS,
    SCHED_CASES,
    SCHED_EPOCH_S,
    SCHED_EPOCHS,
    VALIDATION_INNER,
    cores,
    load_json,
    sched_compute,
)


def exchange_records(data: dict) -> list[dict]:
    """Exchange timings as records {technique, n_ranks, n_floats, seconds, source}, from either format:
    ours (scaling_measurements.json: "exchange" list) or benchmarks/exchange.py's (meta + runs[].techniques)."""
    if "exchange" in data:
        return [{**r, "source": "scaling_measurements.json"} for r in data["exchange"]]
    if "runs" in data and "meta" in data:
        names = {"ring-whole": "ring-whole", "ring-chunked": "ring-chunked", "rma": "rma",
                 "iallreduce-watchdog": "allreduce", "allreduce": "allreduce-blocking",
                 "ring-whole-waitall": "ring-whole-waitall"}
        out = []
        for run in data["runs"]:
            for tech, st in run["techniques"].items():
                out.append({"technique": names.get(tech, tech), "n_ranks": run["n_ranks"],
                            "n_floats": data["meta"]["n_floats"], "seconds": st["median_ms"] / 1e3,
                            "p10_s": st["p10_ms"] / 1e3, "p90_s": st["p90_ms"] / 1e3, "source": "exchange.json"})
        return out
    raise ValueError("unknown measurement format: expected 'exchange' records or exchange.py's 'meta' + 'runs'")


def _ring_parts(tech: str, n_ranks: int, n: int, local: dict) -> tuple[float, float, float]:
    """(hops, bytes per hop, seconds of local work) of one ring call, as sagips/comm/ring.py does it."""
    m = n + 1
    load_divide = m * local["copy_s_per_float"] + n * local["divide_s_per_float"]
    if tech in ("ring-whole", "ring-whole-waitall"):
        return n_ranks - 1, 4 * m, load_divide + (n_ranks - 1) * m * local["add_s_per_float"]
    chunk = math.ceil(m / n_ranks)
    return 2 * (n_ranks - 1), 4 * chunk, load_divide + (n_ranks - 1) * chunk * local["add_s_per_float"]


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best of the least-squares fits over every subset
    of free unknowns (the others at 0) whose solution is non-negative. Exact, and 2^k fits is nothing for k = 3."""
    import itertools

    k = A.shape[1]
    best, best_res = np.zeros(k), float(np.sum(y ** 2))
    for r in range(1, k + 1):
        for free in itertools.combinations(range(k), r):
            x_free, *_ = np.linalg.lstsq(A[:, free], y, rcond=None)
            if np.any(x_free < 0):
                continue
            x = np.zeros(k)
            x[list(free)] = x_free
            res = float(np.sum((A @ x - y) ** 2))
            if res < best_res - 1e-30:
                best, best_res = x, res
    return best


def calibrate(measurements_json, extra_json=None, stat: str = "p10_s") -> dict:
    """Fit the model's exchange inputs from measured exchange times on one machine.

    measurements_json: path or dict in the format of scaling_measurements.json (needs "local" and "exchange") or
    of benchmarks/exchange.py (then the local per-element costs must come from `extra_json`, ours).

    The link is fitted on the `stat` quantile (default the 10th percentile over reps: the cost when no process
    of the ring was preempted, which is what a dedicated node sees; this machine's 2 cores are shared with other
    jobs) of the ring times at N <= cores, after removing the measured local work (copy-in, row or chunk
    additions, divide): time = t0 + hops * (alpha + bytes * beta), non-negative least squares.
    Returns alpha/beta/t0 (all ranks on one node: the intra-node link), hop_overhead_s (alpha minus the MPI
    shared-memory latency: the Python/mpi4py part of a hop), call_overhead_s (Iallreduce + watchdog wait beyond the
    MPI rounds), rma_fixed_s / rma_per_peer_s, reduce_s_per_float, buffer_s (copy in + divide out per call), the
    fit residuals, and alpha_by_n: the per-hop cost at every N from the MEDIAN times with t0 and beta fixed (at
    N > cores it contains the OS time-slicing of an oversubscribed machine; only the local validation uses it).
    """
    data = load_json(measurements_json)
    extra = load_json(extra_json) if extra_json is not None else {}
    local = data.get("local") or extra.get("local")
    if local is None:
        raise ValueError("calibrate: no local per-element timings ('local'); run `scaling_model.py measure`")
    n_cores = data.get("meta", {}).get("cores") or extra.get("meta", {}).get("cores") or cores()
    recs = exchange_records(data)
    rings = [r for r in recs if r["technique"] in ("ring-whole", "ring-chunked")]
    fit_rows = [r for r in rings if r["n_ranks"] <= n_cores]
    if not fit_rows:
        raise ValueError("calibrate: no ring timings at N <= cores")

    def q(r):
        return r.get(stat, r["seconds"])

    A, y = [], []
    for r in fit_rows:
        hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
        A.append([1.0, hops, hops * nbytes])
        y.append(q(r) - loc)
    A, y = np.array(A, float), np.array(y, float)
    if len({r["n_floats"] for r in fit_rows}) > 1:
        t0, alpha, beta = (float(v) for v in _nnls(A, y))
    else:  # one size: alpha and beta are not separable; beta from the measured memcpy bandwidth, no t0
        t0, beta = 0.0, local["memcpy_s_per_byte"]
        alpha = float(np.mean((y - A[:, 2] * beta) / A[:, 1]))
    # a fit that lands on its bound measured nothing: say so (the page lists these, and no scenario scales them)
    at_bounds = [name for name, v, lo in (("t0_s", t0, 0.0), ("alpha_s", alpha, 1e-7), ("beta_s_per_byte", beta, 1e-13))
                 if v <= lo + 1e-12]
    if alpha - LOCAL_MPI_LATENCY_S <= 0.0:
        at_bounds.append("hop_overhead_s")
    alpha, beta = max(alpha, 1e-7), max(beta, 1e-13)
    residuals = []
    for r in rings:
        hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
        pred = loc + t0 + hops * (alpha + nbytes * beta)
        residuals.append({"technique": r["technique"], "n_ranks": r["n_ranks"], "n_floats": r["n_floats"],
                          "measured_s": q(r), "median_s": r["seconds"], "predicted_s": pred,
                          "rel_error": (pred - q(r)) / q(r), "in_fit": r["n_ranks"] <= n_cores,
                          "source": r["source"]})
    # per-N effective hop cost from the medians at the exchanged size (t0 and beta fixed)
    alpha_by_n = {}
    for n_ranks in sorted({r["n_ranks"] for r in rings}):
        big = max(r["n_floats"] for r in rings if r["n_ranks"] == n_ranks)
        vals = []
        for r in rings:
            if r["n_ranks"] == n_ranks and r["n_floats"] == big:
                hops, nbytes, loc = _ring_parts(r["technique"], n_ranks, r["n_floats"], local)
                vals.append((r["seconds"] - loc - t0) / hops - nbytes * beta)
        alpha_by_n[n_ranks] = max(float(np.mean(vals)), alpha)
    # the collective's own Python/mpi4py cost: Iallreduce + watchdog wait, minus the modelled MPI rounds
    from sim import allreduce_cost

    calls = []
    for r in recs:
        if r["technique"] == "allreduce" and r["n_ranks"] <= n_cores:
            p = Profile(name="fit", epoch_s=0.0, intra=Link(LOCAL_MPI_LATENCY_S, 1.0 / beta),
                        inter=Link(LOCAL_MPI_LATENCY_S, 1.0 / beta), ranks_per_node=10 ** 9,
                        reduce_s_per_float=local["add_s_per_float"], n_floats=r["n_floats"])
            calls.append(q(r) - allreduce_cost(r["n_ranks"], p) - r["n_floats"] * local["divide_s_per_float"])
    call_overhead = max(float(np.median(calls)), 0.0) if calls else alpha
    # RMA: bottom-up per peer (store into the peer's window + snapshot copy + crc32 + add), fixed from N=2
    slot = 4 * N_WEIGHTS + 40
    per_peer = 2 * slot * local["memcpy_s_per_byte"] + slot * local["crc32_s_per_byte"] + \
        N_WEIGHTS * local["add_s_per_float"]
    rma2 = [q(r) for r in recs if r["technique"] == "rma" and r["n_ranks"] == 2]
    rma_fixed = max(float(np.median(rma2)) - per_peer, 0.0) if rma2 else slot * local["crc32_s_per_byte"]
    rma2_med = [r["seconds"] for r in recs if r["technique"] == "rma" and r["n_ranks"] == 2]
    rma_fixed_median = max(float(np.median(rma2_med)) - per_peer, 0.0) if rma2_med else rma_fixed
    rma_check = [{"n_ranks": r["n_ranks"], "measured_s": q(r), "median_s": r["seconds"],
                  "predicted_s": rma_fixed + (r["n_ranks"] - 1) * per_peer, "source": r["source"]}
                 for r in recs if r["technique"] == "rma"]
    return {"statistic": stat, "t0_s": t0, "alpha_s": alpha, "beta_s_per_byte": beta,
            "intra_bandwidth_Bps": 1.0 / beta, "hop_overhead_s": max(alpha - LOCAL_MPI_LATENCY_S, 0.0),
            "call_overhead_s": call_overhead, "reduce_s_per_float": local["add_s_per_float"],
            "buffer_s": (N_WEIGHTS + 1) * local["copy_s_per_float"] + N_WEIGHTS * local["divide_s_per_float"],
            "rma_fixed_s": rma_fixed, "rma_fixed_median_s": rma_fixed_median, "rma_per_peer_s": per_peer,
            "rma_check": rma_check, "at_bounds": at_bounds,
            "alpha_by_n": alpha_by_n, "cores": n_cores, "fit_points": len(fit_rows), "residuals": residuals}


def calibrate_all(data: dict) -> dict:
    """calibrate() + the polling parameters fitted on the schedule replay (when it exists)."""
    cal = calibrate(data)
    if data.get("schedule_replay"):
        cal["polling"] = fit_polling(data["schedule_replay"], cal)
    return cal


def local_profile(cal: dict, epoch: dict, n_ranks: int, jitter: str = "robust") -> Profile:
    """This machine: all ranks on one node, compute shared by `cores` cores, hop costs as measured at this N."""
    alpha = cal["alpha_by_n"].get(str(n_ranks), cal["alpha_by_n"].get(n_ranks, cal["alpha_s"]))
    alpha = max(alpha, cal["alpha_s"])
    return Profile(
        name=f"local-{n_ranks}", epoch_s=epoch["mean_s"],
        intra=Link(LOCAL_MPI_LATENCY_S, cal["intra_bandwidth_Bps"]), inter=Link(LOCAL_MPI_LATENCY_S,
                                                                                 cal["intra_bandwidth_Bps"]),
        ranks_per_node=10 ** 6, jitter_cv=epoch["robust_cv"] if jitter == "robust" else epoch["cv"],
        hop_overhead_s=alpha - LOCAL_MPI_LATENCY_S, call_overhead_s=cal["call_overhead_s"] * alpha / cal["alpha_s"],
        reduce_s_per_float=cal["reduce_s_per_float"], offload_s=cal["buffer_s"] + cal["t0_s"],
        rma_fixed_s=cal.get("rma_fixed_median_s", cal["rma_fixed_s"]),
        rma_per_peer_s=cal["rma_per_peer_s"], cpu_cores=cal["cores"], corun_factor=epoch.get("corun_factor", 1.0),
        n_floats=N_WEIGHTS,
        events_per_epoch=epoch["events_per_epoch"], polling="polling" in cal,
        wake_s=cal.get("polling", {}).get("wake_s", 0.0),
        collective_rounds=cal.get("polling", {}).get("collective_rounds", 1.0))


def replay_profile(cal: dict, n: int, wake_s: float, rounds: float) -> Profile:
    prof = local_profile(cal, {"mean_s": SCHED_EPOCH_S, "robust_cv": 0.0, "cv": 0.0, "events_per_epoch": 1}, n)
    prof.cpu_cores = None  # sleeping ranks do not share the cores
    prof.polling, prof.wake_s, prof.collective_rounds = True, wake_s, rounds
    return prof


def _replay_sim(rep: dict, mode: str, prof: Profile):
    n = rep["n_ranks"]
    cv, straggle = SCHED_CASES[rep["case"]]
    compute = sched_compute(n, cv)
    if n > 1:
        compute[:, n - 1] += straggle
    return simulate(mode, n, SCHED_EPOCHS, prof, inner_size=min(VALIDATION_INNER, n), outer_every=20,
                    compute=compute)


def _bisect(f, lo: float, hi: float, target: float, steps: int = 30) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (clipped to the interval)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


FIT_CASE = ("jitter 10%", 2)  # the replay the two polling parameters are fitted on; the others validate them
WAKE_BOUNDS_S = (0.0, 0.02)  # the interval wake_s is searched in (a fit at an end measured nothing)
ROUNDS_BOUNDS = (0.0, 200.0)  # the interval collective_rounds is searched in


def fit_polling(replays: list[dict], cal: dict) -> dict:
    """wake_s from the arar ring and collective_rounds from allreduce, both in the jitter replay at N=2."""
    rep = next((r for r in replays if (r["case"], r["n_ranks"]) == FIT_CASE), None)
    if rep is None:
        return {"wake_s": 0.0, "collective_rounds": 1.0, "fitted_on": None}
    n = rep["n_ranks"]
    wake = _bisect(lambda w: _replay_sim(rep, "arar", replay_profile(cal, n, w, 1.0)).train_s, *WAKE_BOUNDS_S,
                   max(rep["finish"]["arar"]))
    rounds = _bisect(lambda x: _replay_sim(rep, "allreduce", replay_profile(cal, n, wake, x)).train_s, *ROUNDS_BOUNDS,
                     max(rep["finish"]["allreduce"]))
    return {"wake_s": wake, "collective_rounds": rounds, "fitted_on": f"{FIT_CASE[0]}, N={FIT_CASE[1]} "
            "(arar -> wake_s, allreduce -> collective_rounds)"}
