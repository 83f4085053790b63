"""Where proxy1d's ensemble ends along its valleys: the members' mean against the ML fit on one data set, per
checkpoint (coverage.notes.md, twentieth session: the preset's offset of +1.5 sigma_ML in r_0-r_2).

    python benchmarks/proxy1d_valley.py NAME [--at-ml | --shift r_0:+3] [--seed 1000] [--members 4]
                                        [--set KEY=VALUE ...]

Generates the data set of --seed (the coverage study's replica seed - 1000, 16M events) once under runs/valley/,
fits it by maximum likelihood once (benchmarks/coverage.ml_reference), trains M members of the preset
(`--mode ensemble --ensemble-size M`, torch at 1 thread) into runs/valley/NAME, and prints (p^ - p_ML)/sigma_ML of
the members' mean and their scatter every 500 epochs. --at-ml starts every member at the ML fit (the generator's
output layer: weights 0, bias at the fit's logit), which tells an offset of the GAN's equilibrium (the mean drifts
away) from one of its approach (it stays). --shift NAME:S starts them S sigma_ML from the fit along the valley of
parameter NAME instead (p_ML + S C[:, i] / sqrt(C[i, i]), C the fit's covariance: the other parameters follow their
regression on it, so the start stays as close to the fit as a shift of S sigma in NAME allows, a log-likelihood of
S^2 / 2 below it). Starts on both sides tell where the GAN's equilibrium lies along the valley, if the members relax
towards it within the run. A 4-member mean is uncertain by about half the scatter.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "configs" / "proxy1d-quick.yaml"


def child(start_file: str, argv: list[str]) -> None:
    """One rank of the training, its generator started at the point of `start_file` (the ML fit, or a shift)."""
    import torch
    from sagips_environments.proxy1d import Proxy1D

    p_ml = torch.tensor(json.loads(Path(start_file).read_text())["p"])
    build = Proxy1D.build_generator

    def at_ml(self):
        G = build(self)
        with torch.no_grad():
            G[-2].weight.zero_()  # every noise vector at the point
            G[-2].bias.copy_(torch.logit((p_ml - self.pmin.cpu()) / (self.pmax - self.pmin).cpu()))
        return G

    Proxy1D.build_generator = at_ml
    sys.argv = ["sagips.run"] + argv
    runpy.run_module("sagips.run", run_name="__main__")


def shifted(ml: dict, data: Path, ecfg, shift: str) -> np.ndarray:
    """p_ML + S C[:, i] / sqrt(C[i, i]) for shift 'r_i:S' (C: the ML fit's covariance on the data's events)."""
    from benchmarks.loop_closure import ml_covariance
    from sagips.io.refdata import read_reference

    name, _, s = shift.partition(":")
    i = int(name.removeprefix("r_"))
    arrays, _ = read_reference(data, {"events": 2})
    p = np.asarray(ml["p"])
    c = ml_covariance(arrays["events"].astype(np.float64), ecfg, p)
    start = p + float(s) * c[:, i] / np.sqrt(c[i, i])
    print(f"start: {np.round((start - p) / np.sqrt(np.diag(c)), 2)} sigma_ML from the ML fit", flush=True)
    return start


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name")
    ap.add_argument("--at-ml", action="store_true", help="start every member at the data's ML fit")
    ap.add_argument("--shift", metavar="NAME:S",
                    help="start every member S sigma_ML from the ML fit along NAME's valley")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a sagips.run --set")
    ap.add_argument("--timeout", type=int, default=7200, help="seconds of the training job")
    args = ap.parse_args()
    from benchmarks.coverage import env_config, ml_reference
    from sagips.analysis.ensemble import expand_run_dirs, load_run, members_at, predict_group
    from sagips.data import main as data_main
    from tests._mpirun import mpiexec

    work = ROOT / "runs" / "valley"
    work.mkdir(parents=True, exist_ok=True)
    env_sets = sorted(s for s in args.set if s.startswith("environment."))  # the data and the ML fit follow them
    key = f"proxy1d-{args.seed}" + (f"-{hashlib.sha1(' '.join(env_sets).encode()).hexdigest()[:8]}" if env_sets else "")
    data, ml_file = work / f"{key}.h5", work / f"{key}-ml.json"
    ecfg = env_config("proxy1d", args.set)
    truth = [x for s in env_sets if s.startswith("environment.true_params") for x in ("--set", s[len("environment."):])]
    if not data.exists() and data_main(["proxy1d", "--out", str(data), "--events", str(ecfg.reference_events),
                                        "--seed", str(args.seed), "--no-progress"] + truth) != 0:
        return 1
    if not ml_file.exists():
        ml_file.write_text(json.dumps(ml_reference("proxy1d", data, np.asarray(ecfg.true_params), ecfg)))
    ml = json.loads(ml_file.read_text())
    run = work / args.name
    train = ["--config", str(CONFIG), "--mode", "ensemble", "--ensemble-size", str(args.members), "--seed",
             str(args.seed), "--no-progress", "--output-dir", str(run), "--overwrite", "--set",
             f"environment.data_file={data}", "--set", "train.threads=1"] + [x for s in args.set for x in ("--set", s)]
    start = ml_file
    if args.shift:
        start = work / f"{args.name}-start.json"
        start.write_text(json.dumps({"p": shifted(ml, data, ecfg, args.shift).tolist()}))
    script = [sys.executable, str(Path(__file__).resolve()), "--child", str(start)] if args.at_ml or args.shift else [
        sys.executable, "-m", "sagips.run"]
    r = subprocess.run(["timeout", "--kill-after=10", str(args.timeout), mpiexec(), "-n", str(args.members)]
                       + script + train, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True)
    if r.returncode != 0:
        print(f"proxy1d_valley: training failed (exit {r.returncode}): {r.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    g = predict_group(args.name, [load_run(d) for d in expand_run_dirs([run])], 1024, 0)
    p_ml, s_ml = np.array(ml["p"]), np.array(ml["sigma"])
    np.set_printoptions(precision=2, suppress=True, linewidth=150)
    print(f"{args.name}: members' mean - ML fit, and their scatter, in sigma_ML (data seed {args.seed})")
    for t, epoch in enumerate(g.epochs):
        if epoch % 500 == 0 or t == len(g.epochs) - 1:
            v, _ = members_at(g, t)
            print(f"  epoch {int(epoch):5d}  mean - ML {(v.mean(0) - p_ml) / s_ml}  scatter {v.std(0, ddof=1) / s_ml}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
