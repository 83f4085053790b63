"""Epoch time of every preset under train.amp = auto (what it resolves to here) against float32 and bf16.

    python benchmarks/precision.py [--presets proxy1d-quick,proxy1d,optigan-quick,optigan] [--epochs 6] [--rounds 3]

One rank in this process, 1 torch thread, the preset's own batch (the paper presets at their full batch: these are
the epochs a user meets). For every preset one Trainer per precision (auto, none, bf16) is built on the same data;
they run round-robin, one epoch each per round, so that background load on a shared machine hits them alike; the
figure is the median epoch after one warm-up epoch. The target of issue 19: on a CPU without native bf16, no preset
with `auto` is slower than 1.2x its float32 epoch. Writes docs/benchmarks/precision.{json,md}.

`--decisions N --presets proxy1d-quick` (issue 38, item 5): N fresh starts, each with its own probe, and each
judged by timed epochs of both precisions: auto's epoch must be within 1.1x the faster one in N of N. Writes
docs/benchmarks/precision_decisions_<ISA>.{json,md} (one per ISA that torch dispatches: avx512, avx2).

To see what `auto` does on a CPU without native bf16 on one that has it: `ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/precision.py` (torch then emulates bf16 as such a CPU would).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.loop_closure import machine  # noqa: E402
from sagips.config import load  # noqa: E402
from sagips.environment import get_environment  # noqa: E402
from sagips.trainer import Trainer  # noqa: E402

SMALL = {  # the optiGAN presets' data sets are large to make; their epochs do not depend on how many photons exist
    "optigan": ["environment.photons_per_point=2000", "environment.heldout_points=2", "environment.heldout_photons=200"],
    "optigan-quick": ["environment.heldout_points=2", "environment.heldout_photons=200"],
}


_REFERENCE: dict = {}  #: each preset's reference data, made once per process (--decisions starts many trainers)


def epochs_of(preset: str, amps: list[str], epochs: int, rounds: int) -> dict:
    sets = ["train.progress=false", "train.threads=1", "train.device=cpu", *SMALL.get(preset, [])]
    cfg0 = load(str(ROOT / "configs" / f"{preset}.yaml"), sets)
    env_cls = get_environment(cfg0.environment.name)
    if preset not in _REFERENCE:
        _REFERENCE[preset] = env_cls.generate_reference(cfg0.environment, cfg0.seed)
    arrays, attrs = _REFERENCE[preset]
    trainers = {}
    for amp in amps:
        cfg = load(str(ROOT / "configs" / f"{preset}.yaml"), sets + [f"train.amp={amp}"])
        env = env_cls(cfg.environment, torch.device("cpu"), seed=0)
        env.attach_data(arrays, attrs, np.random.default_rng(0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the bf16 warning is what this script measures
            trainers[amp] = Trainer(cfg, env, 0, 1, str(ROOT / "runs" / "precision-tmp"), is_root=False)
    times = {amp: [] for amp in amps}
    for r in range(rounds):
        for amp, tr in trainers.items():
            for e in range(epochs + (1 if r == 0 else 0)):
                t0 = time.perf_counter()
                tr.step(e + 1)
                dt = time.perf_counter() - t0
                if not (r == 0 and e == 0):  # the first epoch warms up allocations and kernels
                    times[amp].append(dt)
    med = {amp: statistics.median(v) for amp, v in times.items()}
    return {"preset": preset, "events_per_epoch": trainers[amps[0]].env.events_per_epoch,
            "auto_resolved": trainers["auto"].precision["resolved"], "auto_reason": trainers["auto"].precision["reason"],
            "probe": trainers["auto"].precision.get("probe"), "median_epoch_s": med,
            "auto_over_float32": med["auto"] / med["none"],
            "bf16_over_float32": med["bf16"] / med["none"] if "bf16" in med else None, "samples": len(times["none"])}


def decisions(preset: str, n: int, epochs: int, rounds: int, out: Path) -> dict:
    """N fresh starts of `preset` under auto (each probes anew), each judged against timed float32 and bf16 epochs."""
    runs = []
    for i in range(n):
        row = epochs_of(preset, ["auto", "none", "bf16"], epochs, rounds)
        m = row["median_epoch_s"]
        best = min(m["none"], m["bf16"])
        runs.append({"resolved": row["auto_resolved"], "probe": row["probe"], "median_epoch_s": m,
                     "bf16_over_float32_epoch": m["bf16"] / m["none"],
                     "chosen_over_faster": (m["bf16"] if row["auto_resolved"] == "bf16" else m["none"]) / best})
        r = runs[-1]
        print(f"{preset} start {i + 1}/{n}: auto -> {r['resolved']} (probe "
              f"{(r['probe'] or {}).get('bf16_ratio')}); epochs bf16/float32 {r['bf16_over_float32_epoch']:.2f}; "
              f"chosen/faster {r['chosen_over_faster']:.2f}", flush=True)
    mach = machine()
    met = sum(r["chosen_over_faster"] <= 1.1 for r in runs)
    res = {"machine": mach, "preset": preset, "runs": runs, "within_1.1": met, "n": n}
    stem = f"precision_decisions_{mach['torch_cpu_capability'].lower()}"  # one page per dispatched ISA
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = ["# train.amp = auto: is the probe's choice the faster epoch?", "",
             "<!-- generated by benchmarks/precision.py --decisions -->", "",
             f"Machine: **{mach['cpu_model']}**, vector flags {' '.join(mach['vector_flags'])}; torch dispatches "
             f"**{mach['torch_cpu_capability']}**, native bf16: {'yes' if mach['native_bf16'] else 'no'}. Preset "
             f"`{preset}`, one rank, 1 thread. Each start probes anew (the run's own critic batch and chunks, "
             "medians of alternated rounds); its choice is judged by timed epochs of both precisions (medians, "
             "round-robin).", "",
             f"Command: `python benchmarks/precision.py --decisions {n} --presets {preset}`", "",
             "| start | auto chose | probe bf16/fp32 | its rounds | epoch bf16/fp32 | chosen / faster |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        pr = r["probe"] or {}
        lines.append(f"| {i} | {r['resolved']} | {pr.get('bf16_ratio', '—')} | "
                     f"{', '.join(str(x) for x in pr.get('round_ratios', [])) or '—'} | "
                     f"{r['bf16_over_float32_epoch']:.2f} | {r['chosen_over_faster']:.2f} |")
    lines += ["", f"**{met} of {n}** starts ran within 1.1x the faster precision's epoch (target: {n} of {n}).", ""]
    (out / f"{stem}.md").write_text("\n".join(lines))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="proxy1d-quick,proxy1d,optigan-quick,optigan")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per precision per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--amps", default="auto,none,bf16", help="precisions to time (auto and none are needed)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    ap.add_argument("--decisions", type=int, default=0, help="N fresh starts of the first preset, each judged")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.decisions:
        res = decisions(a.presets.split(",")[0].strip(), a.decisions, a.epochs, a.rounds, Path(a.out))
        return 0 if res["within_1.1"] == res["n"] else 1
    rows = []
    for preset in [p.strip() for p in a.presets.split(",") if p.strip()]:
        row = epochs_of(preset, [x.strip() for x in a.amps.split(",")], a.epochs, a.rounds)
        rows.append(row)
        m = row["median_epoch_s"]
        print(f"{preset}: auto -> {row['auto_resolved']} ({row['auto_reason']}); epoch auto {m['auto']:.3f} s, "
              f"float32 {m['none']:.3f} s: auto/float32 {row['auto_over_float32']:.2f}" +
              (f", bf16/float32 {row['bf16_over_float32']:.2f}" if row["bf16_over_float32"] else ""), flush=True)
    mach = machine()
    out = Path(a.out)
    prev = out / "precision.json"
    if prev.exists():  # keep the other presets' rows measured on this same CPU (presets can be timed one call each)
        old = json.loads(prev.read_text())
        if old.get("machine", {}).get("cpu_model") == mach["cpu_model"]:
            done = {r["preset"] for r in rows}
            rows = [r for r in old["rows"] if r["preset"] not in done] + rows
    (out / "precision.json").write_text(json.dumps({"machine": mach, "rows": rows}, indent=1) + "\n")
    lines = ["# train.amp = auto: the epoch of every preset against float32", "",
             "<!-- generated by benchmarks/precision.py -->", "",
             f"Machine: **{mach['cpu_model']}**, vector flags {' '.join(mach['vector_flags'])}; torch "
             f"{mach['torch']} dispatches **{mach['torch_cpu_capability']}**, native bf16: "
             f"{'yes' if mach['native_bf16'] else 'no'}. One rank, 1 torch thread, the preset's own batch; the median "
             "epoch per precision, the precisions run round-robin (epochs per precision in the last column).", "",
             "Command: `python benchmarks/precision.py`", "",
             "| preset | events per epoch | auto resolves to | why | auto | float32 | bf16 | auto / float32 | "
             "bf16 / float32 | epochs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median_epoch_s"]
        lines.append(f"| {r['preset']} | {r['events_per_epoch']:,} | {r['auto_resolved']} | {r['auto_reason']} | "
                     f"{m['auto'] * 1e3:.0f} ms | {m['none'] * 1e3:.0f} ms | "
                     f"{'%.0f ms' % (m['bf16'] * 1e3) if 'bf16' in m else 'not timed'} | "
                     f"**{r['auto_over_float32']:.2f}** | "
                     f"{'%.2f' % r['bf16_over_float32'] if r['bf16_over_float32'] else '—'} | {r['samples']} |")
    lines += ["", "Target (issue 19): on a CPU without native bf16, auto / float32 ≤ 1.2 for every preset.", ""]
    (out / "precision.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
