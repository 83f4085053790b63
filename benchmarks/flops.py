"""Achieved training FLOP/s of the proxy 1D app at the paper's batch, against the matmul peak of the same run.

    .venv/bin/python benchmarks/flops.py               # ~3-5 min on 2 cores: docs/benchmarks/flops.{json,png,md}
    .venv/bin/python benchmarks/flops.py --quick       # < 1 min, writes runs/flops-quick/
    .venv/bin/python benchmarks/flops.py --tag before --no-retain-memory   # a reference run of older code
                                                       # (run with PYTHONPATH=<old tree>): flops_before.json

The batch is the paper's: 1024 parameter sets × 100 events = N = 102,400 events per step
(environment.param_samples=1024, environment.events_per_sample=100, one critic step per generator step).
Every configuration (train.amp = none | bf16, torch threads = 1 | 2) gets its own Trainer; the configurations run
round-robin, one epoch (`Trainer.step`) each per round, so that background load on a shared machine hits them
alike. Each round also re-measures the peaks; the best epoch and the best peak over the rounds are reported
(the machine's capability, not its average load), the median epoch beside it.

FLOPs counted (the AI4NP poster's convention, `sagips.perf.train_flops`: forward 2·Φ, backward 4·Φ per row, Φ =
parameter count; D: 50,049, G: 51,206), counting the work each step needs:
    critic step     G forward without grad on B = 1024 rows            2·Φ_G·B
                    D forward + backward on N real + N fake rows       6·Φ_D·2N
    generator step  G forward + backward on B rows                     6·Φ_G·B
                    D forward + input-gradient backward on N rows      4·Φ_D·N   (D's weight gradients are not
                    needed and not computed: the trainer freezes D's weights while the graph is built)
The pipeline (inverse-CDF sampler), the losses and the optimizers are counted as zero FLOPs but their time is in
the step. The critic / generator split of the epoch time comes from time stamps at `env.real_batch()`, the first
call of each phase in `Trainer.step` (no re-implementation of the step here).

The peaks: `sagips.perf.matmul_peak` (a 2048² matmul, the usual "peak") and a shape-matched reference,
`sagips.perf.matmul_rate(N, 128, 128)`: the forward matmul of one hidden layer at this batch, in the same dtype.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks"
PHASES = ("critic", "generator", "epoch", "critic_network")  #: the last: D forward + backward alone, no pipeline
NOTES_MARKER = "<!-- hand-written notes below: kept when benchmarks/flops.py rewrites this file -->"
CATEGORIES = (  # profiler op name -> category (first match wins)
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::_addmm_activation", "aten::linear")),
    ("leaky_relu fwd+bwd", ("leaky_relu",)),
    ("copies and casts", ("aten::copy_", "aten::cat", "aten::_to_copy", "aten::index", "aten::clone")),
    ("bias-gradient sums", ("aten::sum",)),
    ("pipeline: sampler kernels", ("aten::searchsorted", "aten::gather", "aten::cumsum", "aten::exp", "aten::log",
                            "aten::flip", "aten::scatter_add_", "aten::uniform_", "aten::stack")),
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, short peaks, output runs/flops-quick/ (< 1 min)")
    p.add_argument("--rounds", type=int, default=0, help="timed epochs per configuration (default 6, quick 2)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--amp", nargs="+", default=["none", "bf16"], choices=["none", "bf16", "fp16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-retain-memory", action="store_true",
                   help="do not call sagips.perf.retain_freed_memory (run.py calls it on CPU)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    p.add_argument("--tag", default="", help="write flops_TAG.json only (e.g. 'before' for a run of older code)")
    p.add_argument("--replot", action="store_true", help="only rewrite flops.png and flops.md from flops.json")
    p.add_argument("--out", default=None, help="output folder (default docs/benchmarks, quick: runs/flops-quick)")
    return p.parse_args(argv)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseClock:
    """Time stamps at every env.real_batch() call: the first of each step starts the critic phase, the second
    (after the critic steps) the generator phase."""

    def __init__(self, env, device):
        self.stamps: list[float] = []
        inner = env.real_batch

        def real_batch():
            sync(device)
            self.stamps.append(time.perf_counter())
            return inner()

        env.real_batch = real_batch


def build(amp: str, device, arrays, attrs):
    from sagips.config import load
    from sagips.trainer import Trainer
    from sagips_environments.proxy1d import Proxy1D

    cfg = load(None, ["environment.param_samples=1024", "environment.events_per_sample=100",
                      "train.progress=false", f"train.amp={amp}", f"train.device={device.type}"])
    env = Proxy1D(cfg.environment, device, seed=1)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    tr = Trainer(cfg, env, 0, 1, str(REPO / "runs" / "flops-tmp"), is_root=False)
    return tr, PhaseClock(env, device)


def flop_counts(tr) -> dict[str, float]:
    from sagips.perf import n_params, train_flops

    env = tr.env
    phi_d, phi_g = n_params(tr.D), n_params(tr.G)
    b, n = env.cfg.param_samples, env.cfg.param_samples * env.cfg.events_per_sample
    critic = 2.0 * phi_g * b + train_flops(phi_d, 2 * n)
    generator = train_flops(phi_g, b) + 4.0 * phi_d * n
    return {"phi_d": phi_d, "phi_g": phi_g, "param_samples": b, "events": n,
            "critic": critic, "generator": generator, "epoch": critic + generator,
            "critic_network": train_flops(phi_d, 2 * n),
            # what an implementation that also computes D's (unused) weight gradients in the generator step executes
            "generator_with_d_weight_grads": train_flops(phi_g, b) + train_flops(phi_d, n)}


def timed_step(tr, clock, epoch, device) -> dict[str, float]:
    clock.stamps.clear()
    sync(device)
    t0 = time.perf_counter()
    tr.step(epoch)
    sync(device)
    t1 = time.perf_counter()
    gen_start = clock.stamps[tr.env.n_critic]
    return {"epoch": t1 - t0, "critic": gen_start - t0, "generator": t1 - gen_start}


def timed_critic_network(tr, batch, device) -> float:
    """Seconds of the critic's forward + backward alone (env.d_loss on a fixed batch; no pipeline, no optimizer)."""
    real, fake = batch
    sync(device)
    t0 = time.perf_counter()
    tr.opt_d.zero_grad(set_to_none=True)
    with tr._autocast():
        loss = tr.env.d_loss(tr.D, real, fake)
    loss.backward()
    sync(device)
    return time.perf_counter() - t0


def profile(tr, epoch0: int, steps: int, top: int = 14) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if tr.env.device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for k in range(steps):
            tr.step(epoch0 + k)
    ev = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in ev)
    ev.sort(key=lambda e: -e.self_cpu_time_total)
    ops = [{"op": e.key, "calls_per_step": e.count / steps, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "pct": 100.0 * e.self_cpu_time_total / total} for e in ev[:top]]
    cats: dict[str, float] = {}
    for e in ev:
        name = next((c for c, keys in CATEGORIES if any(k in e.key for k in keys)), "other")
        cats[name] = cats.get(name, 0.0) + 100.0 * e.self_cpu_time_total / total
    return {"steps": steps, "self_cpu_ms_per_step": total / 1e3 / steps, "top_ops": ops,
            "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1]))}


def measure(args) -> dict:
    try:  # the installed sagips, or the tree on PYTHONPATH (a "before" run of older code)
        import sagips
    except ImportError:
        sys.path.insert(0, str(REPO))
        import sagips
    from sagips import perf
    from sagips_environments.proxy1d import Proxy1D

    device = torch.device(args.device)
    retained = False if args.no_retain_memory else perf.retain_freed_memory()
    rounds = args.rounds or (1 if args.quick else 6)
    peak_s = 0.1 if args.quick else 0.3
    dtypes = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    from sagips.config import load

    env_cfg = load(None, []).environment
    arrays, attrs = Proxy1D.generate_reference(env_cfg, 0, n_events=200_000 if args.quick else None)
    configs = [(amp, th) for amp in args.amp for th in args.threads]
    trainers = {amp: build(amp, device, arrays, attrs) for amp in args.amp}
    counts = flop_counts(trainers[args.amp[0]][0])
    n = counts["events"]
    res = {(amp, th): {"epoch": [], "critic": [], "generator": [], "critic_network": [], "peak": 0.0,
                       "shape_peak": 0.0}
           for amp, th in configs}
    epoch = {amp: 1 for amp in args.amp}
    for amp, th in configs:  # warm-up: first-touch of every buffer, oneDNN kernel selection, Adam state
        torch.set_num_threads(th)
        tr, clock = trainers[amp]
        tr.resolve_chunk_rows()
        timed_step(tr, clock, epoch[amp], device)
        epoch[amp] += 1
    batches = {}
    for amp, (tr, _) in trainers.items():  # a fixed batch for the critic-network-only timing
        real = tr.env.real_batch()
        with torch.no_grad():
            batches[amp] = (real, tr.env.synthesize(tr.G, real))
    t_start = time.perf_counter()
    for r in range(rounds):
        for amp, th in configs:
            torch.set_num_threads(th)
            tr, clock = trainers[amp]
            rec = res[amp, th]
            rec["chunk_rows"] = tr.resolve_chunk_rows()  # train.chunk_rows=auto depends on the threads
            rec["peak"] = max(rec["peak"], perf.matmul_peak(device, dtypes[amp], min_seconds=peak_s))
            rec["shape_peak"] = max(rec["shape_peak"], perf.matmul_rate(n, 128, 128, device, dtypes[amp],
                                                                        min_seconds=peak_s))
            t = timed_step(tr, clock, epoch[amp], device)
            epoch[amp] += 1
            for k, v in t.items():
                rec[k].append(v)
            rec["critic_network"].append(timed_critic_network(tr, batches[amp], device))
        print(f"round {r + 1}/{rounds} done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
    rows = []
    for (amp, th), rec in res.items():
        row = {"amp": amp, "dtype": str(dtypes[amp]).replace("torch.", ""), "threads": th,
               "peak_gflops": rec["peak"] / 1e9, "shape_peak_gflops": rec["shape_peak"] / 1e9,
               "chunk_rows": rec.get("chunk_rows")}
        for ph in PHASES:
            best = min(rec[ph])
            row[f"{ph}_s_best"] = best
            row[f"{ph}_s_median"] = statistics.median(rec[ph])
            row[f"{ph}_gflops"] = counts[ph] / best / 1e9
            row[f"{ph}_pct_peak"] = 100.0 * counts[ph] / best / rec["peak"]
            row[f"{ph}_pct_shape_peak"] = 100.0 * counts[ph] / best / rec["shape_peak"]
        rows.append(row)
    profiles = {}
    if not args.no_profile:
        for amp in args.amp[:1] if args.quick else args.amp:
            torch.set_num_threads(args.threads[0])
            tr, _ = trainers[amp]
            tr.resolve_chunk_rows()
            profiles[f"{amp}-t{args.threads[0]}"] = profile(tr, epoch[amp], 1 if args.quick else 2)
            epoch[amp] += 2
    return {
        "command": " ".join([Path(sys.executable).name, "benchmarks/flops.py", *sys.argv[1:]]),
        "sagips": str(Path(sagips.__file__).parent), "tag": args.tag, "quick": args.quick, "rounds": rounds, "retain_freed_memory": retained,
        "machine": {"platform": platform.platform(), "processor": _cpu_name(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "device": str(device),
                    "load_avg_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "flops_per_step": counts, "rows": rows, "profiles": profiles,
    }


def _cpu_name() -> str:
    """The CPU's model name and the matmul-relevant ISA flags (AVX-512, AVX512-BF16, AMX)."""
    name, flags = platform.processor(), []
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                flags = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in have]
                break
    except OSError:
        pass
    return f"{name} ({', '.join(flags) or 'no AVX-512/AMX'})"


# ------------------------------------------------------------------------------------------------ outputs
def figure(data: dict, before: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    labels = [f"{'fp32' if r['amp'] == 'none' else r['amp']}\n{r['threads']} thr" for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    w = 0.2
    ax.bar(x - 1.5 * w, [r["peak_gflops"] for r in rows], w, label="peak: 2048² matmul", color="0.75")
    ax.bar(x - 0.5 * w, [r["shape_peak_gflops"] for r in rows], w, label="shape-matched: N×128 @ 128×128",
           color="0.5")
    ax.bar(x + 0.5 * w, [r["critic_gflops"] for r in rows], w, label="critic step", color="C0")
    ax.bar(x + 1.5 * w, [r["generator_gflops"] for r in rows], w, label="generator step", color="C1")
    ax.set_xticks(x, labels)
    ax.set_ylabel("GFLOP/s")
    ax.set_title("achieved training FLOP/s and the matmul references")
    ax.legend(fontsize=8)
    ax.set_yscale("log")
    ax = axes[1]
    bmap = {(r["amp"], r["threads"]): r for r in before["rows"]} if before else {}
    w = 0.13
    for k, ph in enumerate(("critic", "generator", "epoch")):
        off = (k - 1) * 2 * w
        ax.bar(x + off - w / 2, [r[f"{ph}_pct_peak"] for r in rows], w, color=f"C{k}", label=f"{ph}, after")
        if bmap:
            ax.bar(x + off + w / 2, [bmap.get((r["amp"], r["threads"]), {}).get(f"{ph}_pct_peak", 0) for r in rows],
                   w, color=f"C{k}", alpha=0.35, hatch="//", label=f"{ph}, before")
    ax.axhline(60, color="k", ls="--", lw=1, label="target 60%")
    ax.set_xticks(x, labels)
    ax.set_ylabel("% of the 2048² matmul peak (same dtype, same run)")
    ax.set_title("% of peak per step")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(rows: list[dict]) -> list[str]:
    out = ["| dtype | threads | step | best s | median s | GFLOP/s | % of 2048² peak | % of shape-matched |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dt = "fp32" if r["amp"] == "none" else f"{r['amp']} autocast"
        for ph in PHASES:
            out.append(f"| {dt} | {r['threads']} | {ph} | {r[f'{ph}_s_best']:.3f} | {r[f'{ph}_s_median']:.3f} | "
                       f"{r[f'{ph}_gflops']:.1f} | {r[f'{ph}_pct_peak']:.0f}% | {r[f'{ph}_pct_shape_peak']:.0f}% |")
    out += ["", "| dtype | threads | peak: 2048² matmul, GFLOP/s | shape-matched N×128 @ 128×128, GFLOP/s |",
            "|---|---|---|---|"]
    for r in rows:
        dt = "fp32" if r["amp"] == "none" else r["amp"]
        out.append(f"| {dt} | {r['threads']} | {r['peak_gflops']:.1f} | {r['shape_peak_gflops']:.1f} |")
    return out


def _profile_lines(prof: dict) -> list[str]:
    out = [f"Self CPU time per epoch under the profiler: {prof['self_cpu_ms_per_step']:.0f} ms.", "",
           "| category | % of step |", "|---|---|"]
    out += [f"| {k} | {v:.1f}% |" for k, v in prof["categories"].items()]
    out += ["", "| op | calls / epoch | self ms / epoch | % |", "|---|---|---|---|"]
    out += [f"| `{o['op']}` | {o.get('calls_per_step', o.get('calls', 0) / prof['steps']):g} | {o['self_ms_per_step']:.1f} | {o['pct']:.1f}% |" for o in prof["top_ops"]]
    return out


def markdown(data: dict, before: dict | None, notes: str) -> str:
    c, m = data["flops_per_step"], data["machine"]
    lines = ["# Training FLOP/s against the matmul peak (proxy 1D, paper batch)", "",
             "```bash", data["command"], "```", "",
             f"Machine: {m['processor']}, {m['cores']} cores, {m['platform']}, torch {m['torch']}, device "
             f"{m['device']}; load average at the end {tuple(round(v, 1) for v in m['load_avg_at_end'] or ())} "
             "(the machine is shared: other jobs ran at the same time, so best-of-rounds figures are reported).",
             "", "## What is counted", "",
             f"Batch: {c['param_samples']} parameter sets × {c['events'] // c['param_samples']} events = "
             f"N = {c['events']:,} events per step; Φ_D = {c['phi_d']:,}, Φ_G = {c['phi_g']:,}. A forward pass costs "
             "2·Φ FLOPs per row, a backward pass 4·Φ (2·Φ for the input gradients, 2·Φ for the weight gradients).",
             "", "| step | work | FLOPs |", "|---|---|---|",
             f"| critic | G forward (no grad) on {c['param_samples']} rows + D forward+backward on 2N = "
             f"{2 * c['events']:,} rows (real and fake in one forward) | {c['critic'] / 1e9:.2f} G |",
             f"| generator | G forward+backward on {c['param_samples']} rows + D forward + input-gradient backward "
             f"on N rows (4·Φ_D·N) | {c['generator'] / 1e9:.2f} G |",
             f"| epoch | both | {c['epoch'] / 1e9:.2f} G |",
             f"| critic_network | D forward+backward alone on 2N rows (`env.d_loss` + backward on a fixed batch: no "
             f"sampler, no data, no optimizer) | {c['critic_network'] / 1e9:.2f} G |", "",
             "The pipeline (sampler), the losses and the optimizer steps count zero FLOPs, but their time is in the "
             "steps. Code that also computes D's weight gradients in the generator step (the code before this "
             f"change) executes {c['generator_with_d_weight_grads'] / 1e9:.2f} GFLOPs there; the table counts only "
             "the work that is needed, for before and after alike, so the two are compared by time.", "",
             "## Results", ""]
    lines += _table(data["rows"])
    lines += ["", "![achieved FLOP/s](flops.png)", ""]
    if before:
        lines += ["### Before the changes (same benchmark, the code of the previous commit, same machine)", "",
                  "```bash", before["command"], "```", ""]
        lines += _table(before["rows"])
        bmap = {(r["amp"], r["threads"]): r for r in before["rows"]}
        lines += ["", "The two runs are separate processes at different background load, so raw seconds are not "
                  "comparable; each run's epoch time is therefore also compared through its own same-run peak "
                  "(speed-up = ratio of the % of peak).", "",
                  "| dtype | threads | epoch s before | epoch s after | raw ratio | epoch % of peak before | after | "
                  "speed-up at equal peak |", "|---|---|---|---|---|---|---|---|"]
        for r in data["rows"]:
            b = bmap.get((r["amp"], r["threads"]))
            if b:
                lines.append(f"| {'fp32' if r['amp'] == 'none' else r['amp']} | {r['threads']} | "
                             f"{b['epoch_s_best']:.3f} | {r['epoch_s_best']:.3f} | "
                             f"{b['epoch_s_best'] / r['epoch_s_best']:.2f}× | {b['epoch_pct_peak']:.0f}% | "
                             f"{r['epoch_pct_peak']:.0f}% | {r['epoch_pct_peak'] / b['epoch_pct_peak']:.2f}× |")
        lines.append("")
    lines += ["## Where the time goes (torch.profiler, self CPU time)", ""]
    for tag, src in (("after", data), ("before", before)):
        for key, prof in (src or {}).get("profiles", {}).items():
            lines += [f"### {tag}: {key.replace('none', 'fp32').replace('-t', ', threads=')}", ""]
            lines += _profile_lines(prof) + [""]
    lines += [notes.strip(), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out) if args.out else (REPO / "runs" / "flops-quick" if args.quick else DOCS)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        return write_outputs(json.loads((out / "flops.json").read_text()), out)
    data = measure(args)
    for r in data["rows"]:
        print(f"{r['amp']:>5} threads={r['threads']}: epoch {r['epoch_s_best']:.3f} s, "
              f"critic {r['critic_gflops']:.1f} GFLOP/s ({r['critic_pct_peak']:.0f}% of peak), "
              f"generator {r['generator_gflops']:.1f} ({r['generator_pct_peak']:.0f}%), "
              f"epoch {r['epoch_gflops']:.1f} ({r['epoch_pct_peak']:.0f}%), critic network alone "
              f"{r['critic_network_gflops']:.1f} ({r['critic_network_pct_peak']:.0f}%); peak {r['peak_gflops']:.1f}, "
              f"shape-matched {r['shape_peak_gflops']:.1f}")
    if args.tag:
        (out / f"flops_{args.tag}.json").write_text(json.dumps(data, indent=1))
        return 0
    (out / "flops.json").write_text(json.dumps(data, indent=1))
    return write_outputs(data, out)


def write_outputs(data: dict, out: Path) -> int:
    before_path = out / "flops_before.json"
    before = json.loads(before_path.read_text()) if before_path.exists() else None
    figure(data, before, out / "flops.png")
    md = out / "flops.md"  # the hand-written analysis below NOTES_MARKER survives a re-run
    old = md.read_text() if md.exists() else ""
    notes = old[old.index(NOTES_MARKER):] if NOTES_MARKER in old else NOTES_MARKER + "\n\n## Discussion\n"
    md.write_text(markdown(data, before, notes))
    print(f"wrote {out}/flops.json, flops.png, flops.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
