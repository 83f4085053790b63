"""optiGAN batch-size sweep: time per epoch and achieved FLOP/s against batch size, beside the device's measured
matmul peak in the same dtype (the optiGAN GPU paper's figure 8 and the AI4NP poster's FLOP/s utilisation).

    python benchmarks/batch_sweep.py                  # 1024 ... 250,000 rows; fp32 + bf16 on CPU, fp32 + fp16 on CUDA
    python benchmarks/batch_sweep.py --quick          # 3 small batches, well under a minute on a 2-core CPU
    python benchmarks/batch_sweep.py --batches 4096,65536 --dtypes fp32 --device cpu --threads 2 --out /tmp/sweep

One epoch is what the trainer does per epoch (sagips.trainer.Trainer.step): `n_critic` (3) critic steps, each with the
WGAN-GP gradient penalty, then one generator step; the networks are the paper's (opengate's layout), the data stays
on the device. FLOPs are counted as in the AI4NP GPU poster (../shared/papers/ai4np-gpu-poster.txt): one training
step of a network with Φ parameters on `rows` rows costs 6·Φ·rows (sagips.perf.train_flops), so one epoch costs

    n_critic · 6·Φ_D·(2·batch)      the critic, trained on batch real + batch generated rows
    + 6·(Φ_G + Φ_D)·batch           the generator step: batch rows through G and D, forward and backward

The generator's no-grad forward in the critic steps and the gradient penalty's extra passes through D are not
counted, so the achieved FLOP/s is a lower bound (the poster's estimate is too; the trainer's generator step
freezes D's weights, so D runs 4·Φ_D·batch there, not 6, which the uncounted gradient penalty outweighs). The peak is
sagips.perf.matmul_peak(device, dtype), measured in this process just before that dtype's sweep. The dtypes map to
train.amp: fp32 = none, bf16 = bf16 autocast, fp16 = fp16 autocast with a GradScaler (CUDA only); the pipeline
and the gradient penalty stay fp32 under autocast, and the peak is that of the autocast dtype.

Writes OUT/batch_sweep.json and OUT/batch_sweep.png (default OUT: docs/benchmarks; docs/benchmarks/optigan.md shows
the table). Never part of make test.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL = [1024, 4096, 16384, 65536, 250_000]
QUICK = [256, 1024, 4096]
AMP = {"fp32": "none", "bf16": "bf16", "fp16": "fp16"}
DATA = ["environment.name=optigan", "environment.photons_per_point=200", "environment.heldout_points=0",
        "environment.quality_points=1", "environment.loader=device", "train.progress=false"]


def epoch_flops(phi_g: int, phi_d: int, batch: int, n_critic: int) -> float:
    from sagips.perf import train_flops

    return n_critic * train_flops(phi_d, 2 * batch) + train_flops(phi_g + phi_d, batch)


def measure(reference, device, batch: int, dtype: str, min_seconds: float, min_epochs: int, warmup: int,
            seed: int) -> dict:
    """Time `Trainer.step` at one batch size and dtype: the median of at least `min_epochs` timed epochs."""
    import numpy as np
    import torch

    from sagips.config import load
    from sagips.environment import get_environment
    from sagips.perf import n_params, sync
    from sagips.trainer import Trainer

    cfg = load(None, DATA + [f"environment.batch_size={batch}", f"train.amp={AMP[dtype]}"])
    env = get_environment("optigan")(cfg.environment, device, seed=seed)
    env.attach_data(*reference, np.random.default_rng(seed))
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, env, 0, 1, tmp, is_root=False)
        epoch = 0
        for _ in range(warmup):
            epoch += 1
            tr.step(epoch)
        sync(device)
        times: list[float] = []
        while len(times) < min_epochs or sum(times) < min_seconds:
            epoch += 1
            t0 = time.perf_counter()
            out = tr.step(epoch)
            sync(device)
            times.append(time.perf_counter() - t0)
        loss_ok = bool(torch.isfinite(out["loss_d"]).item() and torch.isfinite(out["loss_g"]).item())
        phi_g, phi_d = n_params(tr.G), n_params(tr.D)
    med = statistics.median(times)
    flops = epoch_flops(phi_g, phi_d, batch, env.n_critic)
    return {"batch": batch, "epochs_timed": len(times), "epoch_s": med, "epoch_s_min": min(times),
            "epoch_s_max": max(times), "flops_per_epoch": flops, "flops_s": flops / med,
            "rows_per_s": batch * (env.n_critic + 1) / med, "phi_g": phi_g, "phi_d": phi_d,
            "n_critic": env.n_critic, "finite_losses": loss_ok}


def sweep(args) -> dict:
    import torch

    from sagips.config import load
    from sagips.environment import get_environment
    from sagips.perf import matmul_peak
    from sagips.trainer import select_device

    torch.set_num_threads(args.threads)
    device = select_device(args.device, 0)
    dtypes = args.dtypes or (["fp32", "fp16"] if device.type == "cuda" else ["fp32", "bf16"])
    batches = args.batches or (QUICK if args.quick else FULL)
    cfg = load(None, DATA)
    t0 = time.perf_counter()
    reference = get_environment("optigan").generate_reference(cfg.environment, args.seed)
    print(f"reference data: {len(reference[0]['photons'])} rows in {time.perf_counter() - t0:.1f} s; "
          f"device {device}, {args.threads} thread(s)", file=sys.stderr)
    result = {"device": str(device), "device_name": device_name(device), "threads": args.threads,
              "torch": torch.__version__, "python": platform.python_version(), "quick": args.quick,
              "command": "python benchmarks/batch_sweep.py " + " ".join(args.argv),
              "reference_rows": int(len(reference[0]["photons"])),
              "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
              "flop_count": "per epoch: n_critic*6*phi_D*(2*batch) + 6*(phi_G+phi_D)*batch (AI4NP poster: "
                            "6*phi*rows per training step; gradient penalty and no-grad G forwards not counted)",
              "load_before": os.getloadavg(), "dtypes": {}}
    for dtype in dtypes:
        peak_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        peak = matmul_peak(device, peak_dtype, min_seconds=args.peak_seconds)
        print(f"{dtype}: matmul peak {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
        points = []
        for b in batches:
            try:
                p = measure(reference, device, b, dtype, args.min_seconds, args.min_epochs, args.warmup, args.seed)
            except torch.cuda.OutOfMemoryError:
                points.append({"batch": b, "oom": True})
                print(f"  batch {b:>7d}: out of memory", file=sys.stderr)
                torch.cuda.empty_cache()
                break
            p["utilization"] = p["flops_s"] / peak
            points.append(p)
            print(f"  batch {b:>7d}: {p['epoch_s'] * 1e3:9.1f} ms/epoch  {p['flops_s'] / 1e9:8.2f} GFLOP/s  "
                  f"{100 * p['utilization']:5.1f}% of peak  ({p['epochs_timed']} epochs)", file=sys.stderr)
        result["dtypes"][dtype] = {"matmul_peak_flops_s": peak, "points": points}
    result["load_after"] = os.getloadavg()
    return result


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from sagips.perf import cpu_name

    return cpu_name()


def table(result: dict) -> str:
    rows = ["| dtype | batch | ms / epoch | achieved GFLOP/s | matmul peak GFLOP/s | achieved / peak |",
            "|---|---:|---:|---:|---:|---:|"]
    for dtype, d in result["dtypes"].items():
        for p in d["points"]:
            if p.get("oom"):
                rows.append(f"| {dtype} | {p['batch']:,} | out of memory | | | |")
                continue
            rows.append(f"| {dtype} | {p['batch']:,} | {p['epoch_s'] * 1e3:,.1f} | {p['flops_s'] / 1e9:,.2f} | "
                        f"{d['matmul_peak_flops_s'] / 1e9:,.1f} | {100 * p['utilization']:.1f}% |")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (dtype, d) in enumerate(result["dtypes"].items()):
        pts = [p for p in d["points"] if not p.get("oom")]
        if not pts:
            continue
        color = f"C{i}"
        b = [p["batch"] for p in pts]
        ax1.plot(b, [p["epoch_s"] for p in pts], "o-", color=color, label=dtype)
        ax2.plot(b, [p["flops_s"] for p in pts], "o-", color=color, label=f"{dtype} achieved")
        ax2.axhline(d["matmul_peak_flops_s"], color=color, ls="--", lw=1, label=f"{dtype} matmul peak")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (real rows per step)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("seconds per epoch (3 critic + 1 generator step)")
    ax2.set_ylabel("FLOP/s (6·Φ·rows per network step)")
    fig.suptitle(f"optiGAN batch sweep on {result['device_name']} ({result['device']}, "
                 f"{result['threads']} thread(s))", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"batches {QUICK}, short timings (< 1 min on a CPU)")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                   help=f"comma-separated batch sizes (default {FULL})")
    p.add_argument("--dtypes", type=lambda s: s.split(","), help="comma-separated from fp32, bf16, fp16 "
                   "(default fp32,bf16 on CPU and fp32,fp16 on CUDA)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    p.add_argument("--threads", type=int, default=cores, help=f"torch intra-op threads (default: {cores}, the "
                   "cores this process may use)")
    p.add_argument("--min-seconds", type=float, help="time at least this long per point (default 3, quick 0.5)")
    p.add_argument("--min-epochs", type=int, default=3, help="and at least this many epochs (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs per point (default 1)")
    p.add_argument("--peak-seconds", type=float, help="time of the matmul peak measurement (default 1, quick 0.3)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    args = p.parse_args(argv)
    args.argv = argv
    for key, full, quick in (("min_seconds", 3.0, 0.5), ("peak_seconds", 1.0, 0.3)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.dtypes and not set(args.dtypes) <= set(AMP):
        p.error(f"--dtypes: choose from {sorted(AMP)}")
    t0 = time.perf_counter()
    result = sweep(args)
    result["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch_sweep.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "batch_sweep.png")
    print(table(result))
    print(f"wrote {out / 'batch_sweep.json'} and {out / 'batch_sweep.png'} ({result['wall_s']:.0f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
