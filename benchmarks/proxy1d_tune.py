"""Single-rank, in-process tuning run of the proxy 1D quick preset (the variants in docs/benchmarks/loop_closure.md).

    python benchmarks/proxy1d_tune.py NAME SECONDS [key=value ...] [--log-every N] [--rank R]

Builds one Trainer without an exchange (one rank of an `ensemble` run, with that rank's seeds), torch at 1 thread,
and prints the residuals r_i of the mean prediction, the generator's spread over noise (std of its [0, 1] outputs)
and the losses every N epochs, until train.epochs or SECONDS of accumulated training time. One rank at 1 thread
for T seconds is about the per-rank budget of a 4-rank run on 2 cores for 2T seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sagips.config import load
from sagips.trainer import Trainer, rank_seeds
from sagips_environments.proxy1d import Proxy1D


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name")
    ap.add_argument("seconds", type=float)
    ap.add_argument("sets", nargs="*", help="config overrides on top of configs/proxy1d-quick.yaml")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "runs" / "tune"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load(str(ROOT / "configs" / "proxy1d-quick.yaml"), a.sets + ["train.threads=1", "train.progress=false"])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / f"reference_{cfg.seed}_{cfg.environment.reference_events}.npz"  # 4M events take a while
    if cache.exists():
        z = np.load(cache)
        arrays, attrs = {"events": z["events"]}, {"norms": z["norms"]}
    else:
        arrays, attrs = Proxy1D.generate_reference(cfg.environment, cfg.seed)
        np.savez(cache, events=arrays["events"], norms=attrs["norms"])
    torch_seed, np_seed = rank_seeds(cfg.seed, 0, a.rank)
    torch.manual_seed(torch_seed)
    env = Proxy1D(cfg.environment, "cpu", seed=torch_seed)
    env.attach_data(arrays, attrs, np.random.default_rng(np_seed))
    tr = Trainer(cfg, env, 0, 1, str(out / a.name), exchange=None, is_root=False)
    z = torch.randn((1024, cfg.environment.noise_dim), generator=torch.Generator().manual_seed(20240601))
    z = z * cfg.environment.noise_scale
    t, recs = 0.0, []
    for epoch in range(1, cfg.train.epochs + 1):
        if cfg.train.lr_final != 1.0:
            tr._set_lr(epoch)
        t0 = time.perf_counter()
        res = tr.step(epoch)
        t += time.perf_counter() - t0
        last = epoch == cfg.train.epochs or t > a.seconds
        if epoch % a.log_every == 0 or last:
            with torch.no_grad():
                sd = tr.G(z).std(0).tolist()
            q = env.quality(tr.G, 1024)
            recs.append({"epoch": epoch, "time_s": t, "max_abs_residual": q["max_abs_residual"],
                         "residuals": q["residuals"], "spread": sd, "loss_d": float(res["loss_d"].detach())})
            print(f"{a.name} epoch {epoch:5d} t {t:6.0f}s max|r| {q['max_abs_residual']:.4f} r "
                  + " ".join(f"{v:+.3f}" for v in q["residuals"]) + " | spread " + " ".join(f"{v:.3f}" for v in sd)
                  + f" | loss_d {float(res['loss_d'].detach()):.4f}", flush=True)
        if last:
            break
    (out / f"{a.name}.json").write_text(json.dumps({"name": a.name, "sets": a.sets, "rank": a.rank, "log": recs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
