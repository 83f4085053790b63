"""The epoch on one device, eager against the recorded step (train.cuda_graph): ms, kernels, host syncs, busy.

    python benchmarks/gpu_step.py --device cuda                 # the three cases of issue 38 + make run's job
    python benchmarks/gpu_step.py --device cpu --epochs 5       # the eager CPU figures (and a check of the script)

Cases (each a Trainer in this process, one rank):
  proxy-fp32 / proxy-bf16  proxy 1D at the paper batch (1024 sets x 100 events, 1 critic step), as benchmarks/flops.py
                           builds it (bf16 only on CUDA or a CPU with native bf16)
  optigan                  configs/optigan-quick.yaml (batch 128, 3 critic steps with the gradient penalty, EMA), with
                           benchmarks/batch_sweep.py's data-size overrides (they shrink the MC data, not an epoch)
For each case and each of train.cuda_graph = off, on (on: CUDA only): `--warmup` epochs, then `--epochs` epochs back
to back with one synchronize at the end (ms per epoch), then `--profile-epochs` epochs under torch.profiler, from
whose trace: device kernels per epoch, host syncs per epoch (cudaStreamSynchronize, cudaDeviceSynchronize,
cudaEventSynchronize and blocking cudaMemcpy calls), graph launches, and GPU busy = the sum of kernel durations over
the wall time of the profiled epochs. `--job-epochs N` (CUDA) adds make run's job: 4 ranks of rma-arar-arar
(inner_size 2) sharing the one GPU, N epochs with graphs off and on: epochs/s per rank and the start-up phases from
run.json.

Writes docs/benchmarks/gpu_step[_cpu].json and the page .md generated whole from it (notes by hand in
docs/benchmarks/gpu_step.notes.md, which this script never writes).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.batch_sweep import DATA as OPTIGAN_DATA  # noqa: E402
from benchmarks.loop_closure import machine  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
GRAPH_LAUNCH = "cudaGraphLaunch"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(case: str, device: torch.device, graph: str, reference: dict):
    """A Trainer of `case` with train.cuda_graph=`graph` on `device` (the reference data made once per case)."""
    from sagips.config import load
    from sagips.environment import get_environment
    from sagips.trainer import Trainer

    common = ["train.progress=false", f"train.device={device.type}", f"train.cuda_graph={graph}"]
    if case.startswith("proxy"):
        amp = "none" if case == "proxy-fp32" else "bf16"
        cfg = load(None, ["environment.param_samples=1024", "environment.events_per_sample=100",
                          f"train.amp={amp}", "environment.reference_events=1000000", *common])
    else:
        cfg = load(str(ROOT / "configs" / "optigan-quick.yaml"), OPTIGAN_DATA + common)
    env_cls = get_environment(cfg.environment.name)
    if case not in reference:
        reference[case] = env_cls.generate_reference(cfg.environment, cfg.seed)
    env = env_cls(cfg.environment, device, seed=1)
    env.attach_data(*reference[case], np.random.default_rng(0))
    torch.manual_seed(1)
    return Trainer(cfg, env, 0, 1, tempfile.mkdtemp(prefix="gpu_step-"), is_root=False)


def trace_counts(prof, epochs: int, wall_s: float) -> dict:
    """Per-epoch counts from a torch.profiler trace of `epochs` epochs that took `wall_s` seconds."""
    kernels = kernel_us = syncs = graphs = ops = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            kernel_us += e.device_time
        elif e.name in SYNC_CALLS:
            syncs += 1
        elif e.name == GRAPH_LAUNCH:
            graphs += 1
        elif e.name.startswith("aten::") and e.cpu_parent is None:
            ops += 1
    out = {"top_level_aten_ops_per_epoch": ops / epochs, "profiled_ms_per_epoch": 1e3 * wall_s / epochs}
    if kernels or syncs or graphs:
        out.update(kernels_per_epoch=kernels / epochs, host_syncs_per_epoch=syncs / epochs,
                   graph_launches_per_epoch=graphs / epochs, gpu_busy=kernel_us / 1e6 / wall_s)
    return out


def measure(case: str, graph: str, device: torch.device, args, reference: dict) -> dict:
    tr = build(case, device, graph, reference)
    epoch = 0
    for _ in range(args.warmup):
        epoch += 1
        tr.step(epoch)
    sync(device)
    times = []
    for _ in range(args.repeats):  # back to back, one synchronize at the end: the pipelined epoch
        t0 = time.perf_counter()
        for _ in range(args.epochs):
            epoch += 1
            tr.step(epoch)
        sync(device)
        times.append((time.perf_counter() - t0) / args.epochs)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(args.profile_epochs):
            epoch += 1
            tr.step(epoch)
        sync(device)
        wall = time.perf_counter() - t0
    row = {"case": case, "cuda_graph": graph, "ms_per_epoch": 1e3 * statistics.median(times),
           "ms_per_epoch_repeats": [round(1e3 * t, 4) for t in times], "graph": tr.graphs.record(),
           "precision": tr.precision["resolved"], "events_per_epoch": tr.env.events_per_epoch,
           **trace_counts(prof, args.profile_epochs, wall)}
    print(f"{case:10s} graph={graph:3s}: {row['ms_per_epoch']:.2f} ms/epoch"
          + (f", {row['kernels_per_epoch']:.0f} kernels, {row['host_syncs_per_epoch']:.1f} syncs, busy "
             f"{100 * row['gpu_busy']:.0f} %" if "kernels_per_epoch" in row else
             f", {row['top_level_aten_ops_per_epoch']:.0f} aten ops") + f" ({row['graph']['why']})", flush=True)
    return row


def job(graph: str, epochs: int, out_dir: Path) -> dict:
    """make run's job (4 ranks, rma-arar-arar, inner_size 2) on this machine's one GPU, `epochs` epochs."""
    from benchmarks.graph_modes import launch

    run = launch(out_dir, f"job-{graph}", ["--mode", "rma-arar-arar", "--epochs", str(epochs), "--set",
                                           f"train.cuda_graph={graph}"], 300)
    info = json.loads((Path(run["dir"]) / "run.json").read_text())
    train_s = info["train_seconds"]
    return {"cuda_graph": graph, "epochs": info["epochs"], "train_seconds": train_s,
            "epochs_per_s_per_rank": [info["epochs"] / t for t in train_s], "startup_s": info.get("startup_s"),
            "startup_phases_s": (info.get("startup") or {}).get("rank0_phases_s"), "graph": info.get("cuda_graph")}


def page(data: dict) -> str:
    mach, dev = data["machine"], data["device"]
    where = data.get("gpu") or f"{mach['cpu_model']} (vector flags {' '.join(mach['vector_flags'])}; torch " \
                                f"dispatches {mach['torch_cpu_capability']})"
    lines = ["# The epoch on one device: eager against the recorded step", "",
             "<!-- generated by benchmarks/gpu_step.py; notes by hand: gpu_step.notes.md -->", "",
             f"Device: **{dev}**, {where}; torch {mach['torch']}. Command: `{data['command']}`.", "",
             "| case | cuda_graph | ms per epoch | kernels per epoch | host syncs per epoch | graph launches | "
             "GPU busy | top-level aten ops per epoch | what ran |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        def f(k, fmt):
            return fmt % r[k] if k in r else "—"
        lines.append(f"| {r['case']} | {r['cuda_graph']} | {r['ms_per_epoch']:.2f} | {f('kernels_per_epoch', '%.0f')} "
                     f"| {f('host_syncs_per_epoch', '%.1f')} | {f('graph_launches_per_epoch', '%.1f')} | "
                     f"{('%.0f %%' % (100 * r['gpu_busy'])) if 'gpu_busy' in r else '—'} | "
                     f"{r['top_level_aten_ops_per_epoch']:.0f} | {r['graph']['why']} |")
    for case in dict.fromkeys(r["case"] for r in data["rows"]):
        pair = {r["cuda_graph"]: r for r in data["rows"] if r["case"] == case}
        if "off" in pair and "on" in pair:
            ratio = pair["on"]["ms_per_epoch"] / pair["off"]["ms_per_epoch"]
            lines.append(f"\n{case}: the recorded step takes **{ratio:.2f}x** "
                         "the eager epoch's time.")
    if data.get("jobs"):
        lines += ["", "make run's job, 4 ranks sharing the GPU:", "", "| cuda_graph | epochs | epochs/s per rank "
                  "(min-max) | start-up s |", "|---|---|---|---|"]
        for j in data["jobs"]:
            eps = j["epochs_per_s_per_rank"]
            lines.append(f"| {j['cuda_graph']} | {j['epochs']} | {min(eps):.1f}-{max(eps):.1f} | {j['startup_s']} |")
    if data.get("errors"):
        lines += ["", "Failed (see the run's log):", ""] + [f"- {e}" for e in data["errors"]]
    notes = ROOT / "docs" / "benchmarks" / "gpu_step.notes.md"
    if notes.exists():
        lines += ["", f"Notes: [{notes.name}]({notes.name})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--cases", default="proxy-fp32,proxy-bf16,optigan")
    ap.add_argument("--warmup", type=int, default=6, help="eager epochs first (the graph records after 3)")
    ap.add_argument("--epochs", type=int, default=50, help="epochs per timed repeat")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    ap.add_argument("--profile-epochs", type=int, default=10)
    ap.add_argument("--job-epochs", type=int, default=0, help="make run's job with N epochs (CUDA; 0 = skip)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    a = ap.parse_args(argv)
    if a.warmup < 4:
        ap.error("--warmup must be at least 4: the step records after train.cuda_graph_warmup (3) eager epochs")
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here")
    from sagips.precision import cpu_native_bf16

    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    if device.type == "cpu" and not cpu_native_bf16():
        cases = [c for c in cases if c != "proxy-bf16"]  # emulated bf16: not a case anyone runs
    graphs = ("off", "on") if device.type == "cuda" else ("off",)
    reference: dict = {}
    data = {"device": str(device), "machine": machine(), "rows": [], "errors": [],
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "command": "python benchmarks/gpu_step.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    stem = "gpu_step" if device.type == "cuda" else "gpu_step_cpu"
    a.out.mkdir(parents=True, exist_ok=True)

    def attempt(what: str, fn, into: list) -> None:
        # a failure of one row (a recording that breaks on this device, say) is recorded and the others still run;
        # the page is rewritten after every row, so a run cut off by a time limit keeps what it measured
        try:
            into.append(fn())
        except Exception as err:  # noqa: BLE001 - reported in the data and on stderr, never swallowed silently
            traceback.print_exc()
            data["errors"].append(f"{what}: {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
        (a.out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
        (a.out / f"{stem}.md").write_text(page(data))

    for c in cases:
        for g in graphs:
            attempt(f"{c} cuda_graph={g}", lambda c=c, g=g: measure(c, g, device, a, reference), data["rows"])
    if a.job_epochs and device.type == "cuda":
        data["jobs"] = []
        with tempfile.TemporaryDirectory() as tmp:
            for g in ("off", "on"):
                attempt(f"make run's job cuda_graph={g}", lambda g=g: job(g, a.job_epochs, Path(tmp)), data["jobs"])
    print(f"wrote {a.out / stem}.json and .md" + (f"; {len(data['errors'])} failed: {data['errors']}"
                                                  if data["errors"] else ""))
    return 1 if data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
