"""optiGAN export benchmark: is the file that opengate runs as good as the model the run scores?

    python benchmarks/optigan_export.py runs/x/checkpoints/rank0000/epoch0010000.pt --distill-steps 0 1000 3000
    python benchmarks/optigan_export.py CKPT --opengate model_3341.pt --out /tmp/x.json

For one SAGIPS checkpoint of an optigan run (its run.json gives the config; the reference data is made again from
the run's seed), on every held-out emission point of the run (two MC halves of `heldout_photons / 2` each), it
samples, exactly as opengate samples an exported file (noise N(0, 1) of dimension 10, the raw emission point as
the condition, the raw output; `exported.sample_like_opengate`):
  - `folded`: the run's generator with its folds (what the run's own figure measures),
  - `export, no distillation`: the plain network, as `sagips.export` wrote it before issue 24,
  - `export, distilled N steps`: the plain network fitted to the folded generator (`exported.distill`),
  - for a run with `environment.fold_layer`: `export, folds written exactly`, the file that `sagips.export` writes
    (the folds as ReLU hinges in opengate's third layer; use --distill-steps 0),
  - any `--opengate FILE` given (e.g. the published model_3341.pt, a reference trained on another crystal),
and reports the JS similarity beside the MC-vs-MC ceiling, per feature, and the fraction of raw samples outside the
crystal's bounds. Writes JSON (default docs/benchmarks/optigan_export.json); never part of make test.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="checkpoints/rank{R}/epoch{E}.pt of an optigan run")
    p.add_argument("--distill-steps", type=int, nargs="*", default=[0, 3000], metavar="N",
                   help="distillation lengths to score (0 = the plain network as it is)")
    p.add_argument("--batch", type=int, default=2048, help="distillation batch (rows)")
    p.add_argument("--lr", type=float, default=1e-4, help="distillation learning rate")
    p.add_argument("--opengate", nargs="*", default=[], metavar="FILE.pt", help="opengate files to score as well")
    p.add_argument("--seed", type=int, default=7, help="seed of the sampling noise")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "optigan_export.json"))
    p.add_argument("--label", default="", help="a label for this row set in the JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from sagips_environments.optigan.exported import (
        distill,
        environment_for_config,
        folded_generator,
        load_plain,
        sample_like_opengate,
        score_samples,
    )
    from sagips_environments.optigan.opengate import PlainGenerator

    torch.set_num_threads(1)
    ck_path = Path(args.checkpoint).resolve()
    run_dir = ck_path.parent.parent.parent
    run = json.loads((run_dir / "run.json").read_text())
    ck = torch.load(ck_path, map_location="cpu", weights_only=True)
    t0 = time.perf_counter()
    env, cfg = environment_for_config(run["config"])
    print(f"reference data made again in {time.perf_counter() - t0:.0f} s", flush=True)
    qs = env.heldout_set(0)
    lo, hi = env.bounds()
    counts = [len(b) for b in qs["b"]]

    def score(module, name, extra=None):
        gen = sample_like_opengate(module, qs["points"], counts, seed=args.seed)
        r = score_samples(gen, qs["a"], qs["b"], cfg.environment.js_bins, lo, hi)
        r["name"] = name
        r.update(extra or {})
        print(f"{name:40s} JS {r['js']:6.2f}  ceiling {r['js_ceiling']:6.2f}  gap {r['js_gap']:5.2f}  "
              f"outside {100 * r['outside']:5.1f}%", flush=True)
        return r

    G = folded_generator(env, ck["generator"])
    rows = [score(G, "folded (the run's generator)")]
    box_lo, box_hi, points = env.condition_box()
    for steps in args.distill_steps:
        if steps == 0:
            student, extra, name = G, {"distill_steps": 0}, "export, no distillation"
            if G.fold_layer:  # the file holds the folds exactly (environment.fold_layer)
                name = "export, folds written exactly (fold_layer)"
        elif G.fold_layer:
            p.error("a fold_layer generator is exported exactly: pass --distill-steps 0")
        else:
            d = distill(G, box_lo, box_hi, points, steps=steps, batch=args.batch, lr=args.lr, seed=0,
                        log=lambda m: print(m, flush=True))
            student, name = d["student"], f"export, distilled {steps} steps"
            extra = {"distill_steps": steps, "distill_batch": args.batch, "distill_lr": args.lr,
                     "distill_mse": d["mse"], "distill_mse_start": d["mse_start"],
                     "distill_cpu_s": d["seconds"]}
        plain = PlainGenerator(G.noise_dim, G.model[0].out_features)
        plain.load_state_dict(student.fold())
        rows.append(score(load_plain({"generator_state_dict": plain.state_dict()}), name, extra))
    for f in args.opengate:
        rows.append(score(load_plain(f), f"opengate file {Path(f).name}"))
    result = {"checkpoint": str(ck_path.relative_to(ROOT)) if ck_path.is_relative_to(ROOT) else str(ck_path),
              "epoch": int(ck.get("epoch", 0)), "epochs": cfg.train.epochs, "label": args.label,
              "points": len(qs["points"]), "photons_per_half": counts[0], "bins": cfg.environment.js_bins,
              "noise_seed": args.seed, "cpu": cpu_name(), "torch_threads": 1, "torch": torch.__version__,
              "rows": rows}
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {"runs": []}
    data["runs"] = [r for r in data["runs"] if (r["checkpoint"], r["label"]) != (result["checkpoint"], args.label)]
    data["runs"].append(result)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
