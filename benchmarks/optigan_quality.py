"""optiGAN quality benchmark: train the quick preset in-process on one CPU thread, then report the GAN-vs-MC JS
similarity on every held-out emission point beside the MC-vs-MC ceiling (same sample sizes and bins), and the time.

    python benchmarks/optigan_quality.py                                   # configs/optigan-quick.yaml
    python benchmarks/optigan_quality.py --set train.epochs=300 --out /tmp/bench   # a shorter run elsewhere

Writes OUT/optigan.json and OUT/optigan.png (default OUT: docs/benchmarks; docs/benchmarks/optigan.md discusses
them). Reports wall and CPU seconds: on a shared machine the CPU seconds are the comparable figure. Never part of
make test.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_config(path: str, sets: list[str]):
    """The preset through the registry (as sagips.run does)."""
    from sagips.config import load

    return load(path, sets)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "optigan-quick.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cpu", help="cpu (the reported figure) or cuda")
    p.add_argument("--grid-points", type=int, default=50, metavar="N",
                   help="also score N training-grid points with fresh MC photons (interpolation vs fit; 0 = skip)")
    p.add_argument("--save-generator", action="store_true", help="write OUT/generator.pt (the evaluated generator)")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import torch

    from sagips.environment import get_environment
    from sagips.trainer import Trainer

    torch.set_num_threads(1)
    cfg = load_config(args.config, args.set + [f"seed={args.seed}"])
    cfg.train.progress = False
    env_cls = get_environment(cfg.environment.name)
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    arrays, attrs = env_cls.generate_reference(cfg.environment, cfg.seed)
    t_data = time.perf_counter() - t0
    env = env_cls(cfg.environment, args.device, seed=args.seed)
    env.attach_data(arrays, attrs, np.random.default_rng(args.seed))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, env, 0, 1, tmp)
        t1, c1 = time.perf_counter(), time.process_time()
        state = trainer.fit(progress=False)
        t_train, c_train = time.perf_counter() - t1, time.process_time() - c1
        from sagips.io.metrics import read_metrics

        curve = [{"epoch": r["epoch"], "time_s": r["time_s"], "js": r["js"], "js_ceiling": r["js_ceiling"]}
                 for r in read_metrics(Path(tmp) / "metrics.jsonl")]

    # final figure: every held-out point (not only the logged subset)
    cfg.environment.quality_points = 0
    final_env = env_cls(cfg.environment, args.device, seed=args.seed)
    t2 = time.perf_counter()
    final_env.attach_data(arrays, attrs, np.random.default_rng(args.seed))
    q = final_env.quality(trainer.G_eval)
    t_eval = time.perf_counter() - t2
    grid = _grid_check(env_cls, cfg, arrays, attrs, trainer.G_eval, args) if args.grid_points > 0 else None

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "config": args.config, "sets": args.set, "seed": args.seed, "epochs": state.epoch,
        "batch_size": cfg.environment.batch_size, "lr_g": cfg.train.lr_g, "lr_d": cfg.train.lr_d,
        "photons_per_point": cfg.environment.photons_per_point, "train_rows": len(arrays["photons"]),
        "heldout_points": q["quality_points"], "photons_per_half": cfg.environment.quality_photons,
        "bins": cfg.environment.js_bins, "js_gan_vs_mc": q["js"], "js_mc_vs_mc": q["js_ceiling"],
        "gap_points": q["js_gap"], "features_gan": q["js_features"], "features_mc": q["js_ceiling_features"],
        "data_seconds": t_data, "train_seconds": t_train, "train_cpu_seconds": c_train, "eval_seconds": t_eval,
        "seconds_per_epoch": t_train / max(1, state.epoch), "cpu_seconds_per_epoch": c_train / max(1, state.epoch),
        "threads": 1, "load_average_at_end": os.getloadavg(), "curve": curve,
        "ema": cfg.train.ema, "lr_final": cfg.train.lr_final, "output_bounds": cfg.environment.output_bounds,
        "energy_bounds": cfg.environment.energy_bounds,
        "unit_direction": cfg.environment.unit_direction, "grid_check": grid,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "python": platform.python_version(),
    }
    (out / "optigan.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.save_generator:
        torch.save(trainer.G_eval.state_dict(), out / "generator.pt")
    _figure(out / "optigan.png", result, final_env, trainer.G_eval)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=2))
    return 0


def _grid_check(env_cls, cfg, arrays, attrs, G, args) -> dict:
    """The same JS protocol on N points of the TRAINING grid, with fresh MC photons (an independent stream): if the
    generator scores much higher there than on the held-out points, the gap is interpolation; if not, it is fit."""
    import numpy as np

    from sagips_environments.optigan.mc import simulate_points

    c = cfg.environment
    grid = np.asarray(attrs["points"])
    pick = np.unique(np.linspace(0, len(grid) - 1, min(args.grid_points, len(grid))).round().astype(int))
    ph, co, _ = simulate_points(env_cls.crystal(c), grid[pick], c.heldout_photons, [args.seed, 3])
    c.quality_points = 0
    env = env_cls(c, args.device, seed=args.seed)
    env.attach_data({**arrays, "heldout_photons": ph, "heldout_conditions": co}, attrs, np.random.default_rng(0))
    q = env.quality(G)
    return {"points": int(q["quality_points"]), "js_gan_vs_mc": q["js"], "js_mc_vs_mc": q["js_ceiling"],
            "gap_points": q["js_gap"], "features_gan": q["js_features"]}


def _figure(path: Path, result: dict, env, G) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from sagips_environments.optigan.js import FEATURES

    qs = env._quality_set
    i = int(np.argmin([np.hypot(p[0], p[1]) + abs(p[2] - 1.5) for p in qs["points"]]))  # a central point
    mc = qs["a"][i]
    gen = env.sample(G, qs["points"][i:i + 1], len(mc))[0]
    fig, axes = plt.subplots(1, 7, figsize=(19, 2.9))
    c = result["curve"]
    ax = axes[0]
    ax.plot([r["epoch"] for r in c], [r["js"] for r in c], label="GAN vs MC")
    ax.axhline(result["js_mc_vs_mc"], color="k", ls="--", lw=1, label="MC vs MC")
    ax.set_xlabel("epoch (generator steps)")
    ax.set_ylabel("JS similarity (%)")
    ax.set_ylim(max(0, min(r["js"] for r in c) - 5), 100)
    ax.legend(fontsize=7)
    for j, f in enumerate(FEATURES):
        ax = axes[j + 1]
        lo, hi = np.min(mc[:, j]), np.max(mc[:, j])
        bins = np.linspace(lo, hi, 51)
        ax.hist(mc[:, j], bins, histtype="step", density=True, label="MC")
        ax.hist(np.clip(gen[:, j], lo, hi), bins, histtype="step", density=True, label="GAN")
        ax.set_xlabel(f)
        ax.set_yticks([])
    axes[1].legend(fontsize=7)
    p = qs["points"][i]
    fig.suptitle(f"optiGAN quick preset: JS {result['js_gan_vs_mc']:.1f}% vs MC ceiling {result['js_mc_vs_mc']:.1f}% "
                 f"on {result['heldout_points']} held-out points; histograms at held-out point "
                 f"({p[0]:.2f}, {p[1]:.2f}, {p[2]:.2f}) mm", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
