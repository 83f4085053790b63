"""Run several variants of the optiGAN quality benchmark side by side and tabulate them (a hyper-parameter scan).

    python benchmarks/optigan_scan.py --out /tmp/scan \\
        --variant "base:" --variant "ema:train.ema=0.999" --variant "decay:train.lr_final=0.1 train.ema=0.999"
    python benchmarks/optigan_scan.py --device cuda --parallel 12 --out /tmp/scan --variant ...   # on a GPU

Each variant is `NAME:KEY=VALUE KEY=VALUE ...` (the `--set`s of benchmarks/optigan_quality.py, applied to
configs/optigan-quick.yaml). Variants run as separate processes, `--parallel` at a time (one CPU thread each), and
write OUT/NAME/optigan.{json,png}; OUT/scan.json and OUT/scan.md gather the figures (GAN-vs-MC JS on every held-out
point, the MC-vs-MC ceiling, per-feature scores, time). Never part of make test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FEATURES = ("X", "Y", "dX", "dY", "dZ", "EKine")


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition(":")
    name = name.strip()
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise SystemExit(f"--variant {text!r}: start with a name of letters, digits, '-', '_' or '.', then ':'")
    sets = sets.split()
    for s in sets:
        if "=" not in s:
            raise SystemExit(f"--variant {text!r}: {s!r} is not KEY=VALUE")
    return name, sets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True, metavar="NAME:KEY=VALUE ...")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--config", default=str(ROOT / "configs" / "optigan-quick.yaml"))
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    if len({n for n, _ in variants}) != len(variants):
        raise SystemExit("--variant: names must be unique")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    pending, running, done = list(variants), {}, {}
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < max(1, args.parallel):
            name, sets = pending.pop(0)
            cmd = [sys.executable, str(ROOT / "benchmarks" / "optigan_quality.py"), "--config", args.config,
                   "--out", str(out / name), "--device", args.device, "--seed", str(args.seed)]
            for s in sets:
                cmd += ["--set", s]
            (out / name).mkdir(exist_ok=True)
            log = open(out / name / "log.txt", "w")
            running[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), sets, log)
        time.sleep(1.0)
        for name in list(running):
            proc, sets, log = running[name]
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            res_path = out / name / "optigan.json"
            if proc.returncode == 0 and res_path.exists():
                r = json.loads(res_path.read_text())
                r.pop("curve", None)
                done[name] = {"sets": sets, **r}
                print(f"[{time.perf_counter() - t0:7.1f} s] {name}: JS {r['js_gan_vs_mc']:.2f} "
                      f"(ceiling {r['js_mc_vs_mc']:.2f}) in {r['train_seconds']:.0f} s", flush=True)
            else:
                done[name] = {"sets": sets, "error": f"exit {proc.returncode}; see {out / name / 'log.txt'}"}
                print(f"{name}: FAILED (exit {proc.returncode}), log in {out / name / 'log.txt'}", flush=True)
    (out / "scan.json").write_text(json.dumps(done, indent=2) + "\n")
    lines = ["| variant | sets | epochs | JS GAN vs MC | ceiling | gap | " + " | ".join(FEATURES) + " | train s |",
             "|---|---|---|---|---|---|" + "---|" * len(FEATURES) + "---|"]
    for name, _ in variants:
        r = done[name]
        if "error" in r:
            lines.append(f"| {name} | `{' '.join(r['sets'])}` | failed: {r['error']} |")
            continue
        feats = " | ".join(f"{r['features_gan'][f]:.1f}" for f in FEATURES)
        lines.append(f"| {name} | `{' '.join(r['sets'])}` | {r['epochs']} | {r['js_gan_vs_mc']:.2f} | "
                     f"{r['js_mc_vs_mc']:.2f} | {r['gap_points']:.2f} | {feats} | {r['train_seconds']:.0f} |")
    (out / "scan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all("error" not in r for r in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
