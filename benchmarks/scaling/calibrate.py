"""Calibration: the model's exchange inputs fitted on this machine's measurements, and the local profiles.

calibrate(measurements_json) fits alpha and beta (one ring hop timed alone, at 3 sizes), t0 (the rest of a ring
call), the per-call overhead of a collective, and the RMA costs, each on the measurement that isolates it; it also reads the comm
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


def _hop_bytes(n: int) -> int:
    """Bytes of one hop of the whole ring carrying n floats: the data and the 8-byte weight beside it."""
    return 4 * n + 8


def _wire_bytes(n_floats: int) -> int:
    """Bytes of a buffer of n_floats as sim.allreduce_cost counts them (prof.nbytes: + the weight float)."""
    return 4 * (n_floats + 1)


def _allreduce_rounds(n_ranks: int, n_floats: int, beta: float, local: dict) -> float:
    """The modelled MPI part of one Iallreduce of n_floats (sim.allreduce_cost without the call overhead, on this
    machine's link), plus the divide of the buffer that follows it in watchdog-timed code."""
    from sim import allreduce_cost

    p = Profile(name="fit", epoch_s=0.0, intra=Link(LOCAL_MPI_LATENCY_S, 1.0 / beta),
                inter=Link(LOCAL_MPI_LATENCY_S, 1.0 / beta), ranks_per_node=10 ** 9,
                reduce_s_per_float=local["add_s_per_float"], n_floats=n_floats)
    return allreduce_cost(n_ranks, p) + n_floats * local["divide_s_per_float"]


def calibrate(measurements_json, extra_json=None, stat: str = "p10_s") -> dict:
    """Fit the model's exchange inputs from measured exchange times on one machine.

    measurements_json: path or dict in the format of scaling_measurements.json (needs "local" and "exchange") or
    of benchmarks/exchange.py (then the local per-element costs must come from `extra_json`, ours).

    Every constant is fitted on the `stat` quantile (default the 10th percentile over reps: the cost when no
    process was preempted, which is what a dedicated node sees; this machine's cores are shared with other jobs)
    of the timings at N <= cores, each from the measurement that isolates it:
    - alpha (s per hop) and beta (s per byte): one hop of the whole ring alone ("hop" records, 3 sizes):
      hop = alpha + bytes * beta, non-negative least squares. hop_overhead_s = alpha minus the MPI shared-memory
      latency (the Python/mpi4py part of a hop);
    - t0_s: the rest of a ring call (the ring times minus their hops and their measured local work: copy-in, row or
      chunk additions, divide), the median over the ring records;
    - call_overhead_s and allreduce_s_per_byte: one Iallreduce + watchdog wait (3 sizes) minus the modelled MPI
      rounds and the divide = call_overhead_s + bytes * allreduce_s_per_byte, non-negative least squares: the
      collective's own Python/mpi4py cost per call, and MPICH's work per byte beyond the modelled rounds;
    - rma_fixed_s / rma_per_peer_s: bottom-up per peer, the fixed rest from N=2.
    Without "hop" records (benchmarks/exchange.py's format, or older measurements) alpha, beta and t0 come from the
    ring times alone: time = t0 + hops * (alpha + bytes * beta), which at N <= 2 cannot tell a hop from a call.
    Per N (from the MEDIAN times; at N > cores they contain the OS time-slicing of an oversubscribed machine; only
    the local validation uses them): alpha_by_n, the per-hop cost, and call_overhead_by_n, the collective's
    overhead. A fit that lands on its bound measured nothing: its name is in at_bounds (the page lists them).
    allreduce_check: the model of mode `allreduce` (the buffer's and the count's Iallreduce) against its
    measured exchange, at every N.
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
    hops_rec = [r for r in recs if r["technique"] == "hop"]
    hop_rows = [r for r in hops_rec if r["n_ranks"] <= n_cores]

    def q(r):
        return r.get(stat, r["seconds"])

    def ring_rest(r, alpha, beta, value):  # a ring time minus its hops and its local work
        hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
        return value - loc - hops * (alpha + nbytes * beta)

    if len({r["n_floats"] for r in hop_rows}) > 1:  # the hop alone: alpha and beta; the ring calls: t0
        A = np.array([[1.0, _hop_bytes(r["n_floats"])] for r in hop_rows])
        alpha, beta = (float(v) for v in _nnls(A, np.array([q(r) for r in hop_rows])))
        beta_c = max(beta, 1e-13)
        t0 = float(np.median([ring_rest(r, alpha, beta_c, q(r)) for r in fit_rows]))
        fit_points = len(hop_rows)
    elif len({r["n_floats"] for r in fit_rows}) > 1:
        A, y = [], []
        for r in fit_rows:
            hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
            A.append([1.0, hops, hops * nbytes])
            y.append(q(r) - loc)
        t0, alpha, beta = (float(v) for v in _nnls(np.array(A, float), np.array(y, float)))
        fit_points = len(fit_rows)
    else:  # one size: alpha and beta are not separable; beta from the measured memcpy bandwidth, no t0
        t0, beta = 0.0, local["memcpy_s_per_byte"]
        alpha = float(np.mean([ring_rest(r, 0.0, beta, q(r)) / _ring_parts(r["technique"], r["n_ranks"],
                                                                           r["n_floats"], local)[0]
                               for r in fit_rows]))
        fit_points = len(fit_rows)
    # a fit that lands on its bound measured nothing: say so (the page lists these, and no scenario scales them)
    at_bounds = [name for name, v, lo in (("t0_s", t0, 0.0), ("alpha_s", alpha, 1e-7), ("beta_s_per_byte", beta, 1e-13))
                 if v <= lo + 1e-12]
    if alpha - LOCAL_MPI_LATENCY_S <= 0.0:
        at_bounds.append("hop_overhead_s")
    t0, alpha, beta = max(t0, 0.0), max(alpha, 1e-7), max(beta, 1e-13)
    residuals = []
    for r in rings:
        hops, nbytes, loc = _ring_parts(r["technique"], r["n_ranks"], r["n_floats"], local)
        pred = loc + t0 + hops * (alpha + nbytes * beta)
        residuals.append({"technique": r["technique"], "n_ranks": r["n_ranks"], "n_floats": r["n_floats"],
                          "measured_s": q(r), "median_s": r["seconds"], "predicted_s": pred,
                          "rel_error": (pred - q(r)) / q(r), "in_fit": r["n_ranks"] <= n_cores,
                          "source": r["source"]})
    for r in hops_rec:
        pred = alpha + _hop_bytes(r["n_floats"]) * beta
        residuals.append({"technique": "hop", "n_ranks": r["n_ranks"], "n_floats": r["n_floats"],
                          "measured_s": q(r), "median_s": r["seconds"], "predicted_s": pred,
                          "rel_error": (pred - q(r)) / q(r), "in_fit": r["n_ranks"] <= n_cores,
                          "source": r["source"]})
    # per-N effective hop cost at the exchanged size, from the medians (beta fixed; t0 fixed without hop records)
    alpha_by_n = {}
    for n_ranks in sorted({r["n_ranks"] for r in rings}):
        alone = [r for r in hops_rec if r["n_ranks"] == n_ranks]
        if alone:
            big = max(r["n_floats"] for r in alone)
            vals = [r["seconds"] - _hop_bytes(big) * beta for r in alone if r["n_floats"] == big]
        else:
            big = max(r["n_floats"] for r in rings if r["n_ranks"] == n_ranks)
            vals = [ring_rest(r, 0.0, beta, r["seconds"] - t0) / _ring_parts(r["technique"], n_ranks, big, local)[0]
                    for r in rings if r["n_ranks"] == n_ranks and r["n_floats"] == big]
        alpha_by_n[n_ranks] = max(float(np.mean(vals)), alpha)
    # one Iallreduce + watchdog wait minus its modelled MPI rounds = call_overhead + bytes * allreduce_s_per_byte:
    # the collective's own cost per call, and MPICH's per-byte work beyond the rounds (3 sizes at N <= cores);
    # per N from the medians, the per-byte cost fixed
    allreduces = [r for r in recs if r["technique"] == "allreduce"]
    ar_rows = [r for r in allreduces if r["n_ranks"] <= n_cores]

    def ar_rest(r, value):
        return value - _allreduce_rounds(r["n_ranks"], r["n_floats"], beta, local)

    if len({r["n_floats"] for r in ar_rows}) > 1:
        A = np.array([[1.0, _wire_bytes(r["n_floats"])] for r in ar_rows])
        call_overhead, ar_per_byte = (float(v) for v in _nnls(A, np.array([ar_rest(r, q(r)) for r in ar_rows])))
        if ar_per_byte <= 0.0:
            at_bounds.append("allreduce_s_per_byte")
    else:  # one size (exchange.json): no per-byte part can be told from the call
        call_overhead = float(np.median([ar_rest(r, q(r)) for r in ar_rows])) if ar_rows else alpha
        ar_per_byte = 0.0
    if call_overhead <= 0.0:
        at_bounds.append("call_overhead_s")
    call_overhead = max(call_overhead, 0.0)
    call_by_n = {}
    for n_ranks in sorted({r["n_ranks"] for r in allreduces}):
        vals = [ar_rest(r, r["seconds"]) - _wire_bytes(r["n_floats"]) * ar_per_byte
                for r in allreduces if r["n_ranks"] == n_ranks]
        call_by_n[n_ranks] = max(float(np.median(vals)), 0.0)
    for r in allreduces:
        pred = _allreduce_rounds(r["n_ranks"], r["n_floats"], beta, local) + call_by_n[r["n_ranks"]] + \
            _wire_bytes(r["n_floats"]) * ar_per_byte
        residuals.append({"technique": "allreduce", "n_ranks": r["n_ranks"], "n_floats": r["n_floats"],
                          "measured_s": q(r), "median_s": r["seconds"], "predicted_s": pred,
                          "rel_error": (pred - q(r)) / q(r), "in_fit": r["n_ranks"] <= n_cores,
                          "source": r["source"]})
    # mode `allreduce` as measured (its whole exchange) against the model: two collectives, buffer and count
    allreduce_check = []
    for r in recs:
        if r["technique"] == "allreduce-mode":
            over = call_by_n.get(r["n_ranks"], call_overhead)
            pred = 2 * over + _allreduce_rounds(r["n_ranks"], r["n_floats"], beta, local) + \
                _allreduce_rounds(r["n_ranks"], 1, beta, local) + \
                (_wire_bytes(r["n_floats"]) + _wire_bytes(1)) * ar_per_byte
            allreduce_check.append({"n_ranks": r["n_ranks"], "measured_s": q(r), "median_s": r["seconds"],
                                    "predicted_median_s": pred, "rel_error_median": (pred - r["seconds"]) / r["seconds"],
                                    "source": r["source"]})
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
            "call_overhead_s": call_overhead, "call_overhead_by_n": call_by_n, "allreduce_s_per_byte": ar_per_byte,
            "reduce_s_per_float": local["add_s_per_float"],
            "buffer_s": (N_WEIGHTS + 1) * local["copy_s_per_float"] + N_WEIGHTS * local["divide_s_per_float"],
            "rma_fixed_s": rma_fixed, "rma_fixed_median_s": rma_fixed_median, "rma_per_peer_s": per_peer,
            "rma_check": rma_check, "allreduce_check": allreduce_check, "at_bounds": at_bounds,
            "hop_fit": "hop" if len({r["n_floats"] for r in hop_rows}) > 1 else "ring",
            "alpha_by_n": alpha_by_n, "cores": n_cores, "fit_points": fit_points, "residuals": residuals}


def calibrate_all(data: dict) -> dict:
    """calibrate() + the polling parameters fitted on the schedule replay (when it exists)."""
    cal = calibrate(data)
    if data.get("schedule_replay"):
        cal["polling"] = fit_polling(data["schedule_replay"], cal)
    return cal


def _at_n(by_n: dict | None, n_ranks: int, default: float) -> float:
    """A per-N value (keys int, or str after a JSON round trip), else `default`."""
    by_n = by_n or {}
    return by_n.get(n_ranks, by_n.get(str(n_ranks), default))


def local_profile(cal: dict, epoch: dict, n_ranks: int, jitter: str = "robust") -> Profile:
    """This machine: all ranks on one node, compute shared by `cores` cores, the hop and the collective's call
    overhead as each was measured at this N (their medians: time-slicing included at N > cores)."""
    alpha = max(_at_n(cal["alpha_by_n"], n_ranks, cal["alpha_s"]), cal["alpha_s"])
    call = _at_n(cal.get("call_overhead_by_n"), n_ranks, cal["call_overhead_s"])
    return Profile(
        name=f"local-{n_ranks}", epoch_s=epoch["mean_s"],
        intra=Link(LOCAL_MPI_LATENCY_S, cal["intra_bandwidth_Bps"]), inter=Link(LOCAL_MPI_LATENCY_S,
                                                                                 cal["intra_bandwidth_Bps"]),
        ranks_per_node=10 ** 6, jitter_cv=epoch["robust_cv"] if jitter == "robust" else epoch["cv"],
        hop_overhead_s=alpha - LOCAL_MPI_LATENCY_S, call_overhead_s=call,
        reduce_s_per_float=cal["reduce_s_per_float"], offload_s=cal["buffer_s"] + cal["t0_s"],
        rma_fixed_s=cal.get("rma_fixed_median_s", cal["rma_fixed_s"]),
        rma_per_peer_s=cal["rma_per_peer_s"], cpu_cores=cal["cores"], corun_factor=epoch.get("corun_factor", 1.0),
        n_floats=N_WEIGHTS,
        events_per_epoch=epoch["events_per_epoch"], polling="polling" in cal,
        wake_s=cal.get("polling", {}).get("wake_s", 0.0),
        collective_rounds=cal.get("polling", {}).get("collective_rounds", 1.0),
        allreduce_s_per_byte=cal.get("allreduce_s_per_byte", 0.0))


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
WAKE_BOUNDS_S = (0.0, 0.1)  # the interval wake_s is searched in (a fit at an end measured nothing)
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
