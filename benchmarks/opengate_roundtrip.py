"""The optiGAN round trip through opengate itself: ROOT file in, opengate's OptiGAN, CSVs out, scored against MC.

    make opengate-check                                                  # the venv .venv-opengate, then this
    GATEONRTD=1 .venv-opengate/bin/python benchmarks/opengate_roundtrip.py --checkpoint runs/x/checkpoints/rank0000/epoch0010000.pt
    GATEONRTD=1 .venv-opengate/bin/python benchmarks/opengate_roundtrip.py --points 5     # model_3341.pt only, quick

What it does, with opengate as the client (never a re-implementation of it):
1. the held-out emission points of the run (its run.json; or of configs/optigan-quick.yaml at seed 1234 without
   --checkpoint) and their MC photons (two halves: reference and ceiling);
2. a ROOT file (uproot) with tree `Phase`, as GATE's phase-space actor writes it: per point a `gamma` row at the
   emission point, an `e-` row (opengate keeps an event only if the gamma is followed by an electron or photons, and
   the last one only with an electron), and one `opticalphoton` row per photon to generate, TrackIDs unique over
   the file (opengate drops repeated photon TrackIDs);
3. for each model (the run's checkpoint exported by `sagips.export`, distilled; and the published model_3341.pt):
   `opengate.contrib.optical.optigan.OptiGAN(root_file_path=..., path_to_optigan_model=...).run_optigan(False)`;
4. reads its CSVs (one per gamma event, in event order) and scores them: JS against the MC reference half beside
   the MC-vs-MC ceiling, per feature, and the fraction of photons outside the crystal's bounds.

Frame: the conditions written are in the SAGIPS frame (mm; crystal axis at x = y = 0, back face z = 0, exit face
z = L), so the export is written without --origin. Writes docs/benchmarks/opengate_roundtrip.json (--out).
GATEONRTD=1 keeps opengate's import from downloading Geant4 data; the stand-alone OptiGAN runs no Geant4.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_3341 = ROOT.parent / "shared" / "opengate" / "model_3341.pt"


def write_phase_file(path: str | Path, points, counts) -> None:
    """A GATE-like phase-space ROOT file: gamma, e-, then counts[i] optical photons at points[i], per event."""
    import awkward as ak
    import numpy as np
    import uproot

    names, xyz, track = [], [], []
    next_id = 1
    for p, n in zip(points, counts):
        rows = ["gamma", "e-"] + ["opticalphoton"] * int(n)
        names += rows
        xyz.append(np.repeat(np.asarray(p, dtype=np.float64)[None, :], len(rows), axis=0))
        track.append(np.arange(next_id, next_id + len(rows), dtype=np.int32))
        next_id += len(rows)
    xyz = np.concatenate(xyz)
    with uproot.recreate(str(path)) as f:
        f["Phase"] = {"Position_X": xyz[:, 0], "Position_Y": xyz[:, 1], "Position_Z": xyz[:, 2],
                      "ParticleName": ak.Array(names), "TrackID": np.concatenate(track)}


def run_opengate(root_file: Path, model: Path, workdir: Path) -> list:
    """opengate's OptiGAN on root_file with model; the generated photons per event (list of (n, 6) arrays)."""
    import numpy as np
    import pandas as pd
    from opengate.contrib.optical.optigan import OptiGAN

    og = OptiGAN(root_file_path=str(root_file), path_to_optigan_model=str(model), output_folder=str(workdir),
                 torch_device="cpu")
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a few lines per event
        og.run_optigan(False)
    csv_dir = workdir / "optigan_outputs" / "csv_files"
    files = sorted(csv_dir.glob("optigan_output_*.csv"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    cols = ["X", "Y", "dX", "dY", "dZ", "Ekine"]
    return [pd.read_csv(f)[cols].to_numpy(dtype=np.float32) for f in files]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a SAGIPS optigan checkpoint (in its run directory) to export and run")
    p.add_argument("--model", nargs="*", default=[str(MODEL_3341)] if MODEL_3341.exists() else [],
                   help="opengate files to run as they are (default: the published model_3341.pt)")
    p.add_argument("--points", type=int, default=0, help="held-out points to use (0 = all)")
    p.add_argument("--distill-steps", type=int, default=None, help="passed to sagips.export")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "opengate_roundtrip.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GATEONRTD", "1")
    import torch

    from sagips_environments.optigan.exported import environment_for_config, score_samples

    torch.set_num_threads(1)
    if args.checkpoint:
        run_dir = Path(args.checkpoint).resolve().parent.parent.parent
        config = json.loads((run_dir / "run.json").read_text())["config"]
    else:
        from sagips.config import config_to_dict, load

        config = config_to_dict(load(str(ROOT / "configs" / "optigan-quick.yaml"), ["seed=1234"]))
    env, cfg = environment_for_config(config)
    qs = env.heldout_set(args.points)
    lo, hi = env.bounds()
    counts = [len(b) for b in qs["b"]]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root_file = tmp / "phase.root"
        write_phase_file(root_file, qs["points"], counts)
        models = []
        if args.checkpoint:
            from sagips_environments.optigan.export import export_opengate

            exported = tmp / "exported.pt"
            export_opengate(args.checkpoint, exported, distill_steps=args.distill_steps, check=False)
            models.append((f"sagips.export of {Path(args.checkpoint).name}", exported))
        models += [(Path(m).name, Path(m)) for m in args.model]
        for name, model in models:
            t0 = time.perf_counter()
            gen = run_opengate(root_file, model, tmp / f"og_{len(rows)}")
            if len(gen) != len(qs["points"]) or [len(g) for g in gen] != counts:
                raise SystemExit(f"opengate wrote {len(gen)} events ({[len(g) for g in gen][:5]}...), expected "
                                 f"{len(counts)} of {counts[0]} photons: the ROOT layout no longer matches opengate")
            r = score_samples(gen, qs["a"], qs["b"], cfg.environment.js_bins, lo, hi)
            r.update({"name": name, "opengate_s": time.perf_counter() - t0})
            rows.append(r)
            print(f"{name:40s} JS {r['js']:6.2f}  ceiling {r['js_ceiling']:6.2f}  gap {r['js_gap']:5.2f}  "
                  f"outside {100 * r['outside']:5.1f}%  ({r['opengate_s']:.0f} s in opengate)", flush=True)
    try:
        from importlib.metadata import version

        og_version = version("opengate")
    except Exception:  # noqa: BLE001 (only a label)
        og_version = "unknown"
    result = {"opengate": og_version, "checkpoint": args.checkpoint, "points": len(qs["points"]),
              "photons_per_point": counts[0], "frame": "SAGIPS (crystal axis x = y = 0, back face z = 0)",
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
