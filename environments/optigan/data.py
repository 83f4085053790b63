"""Reference data for optiGAN: the MC stand-in on the paper's grid (or real GATE phase-space files), as HDF5.

    python -m sagips.data optigan --out data/optigan.h5                  # paper grid: 140 points x 30,000 photons
    python -m sagips.data optigan --out data/small.h5 --photons-per-point 3000 --heldout-points 50
    python -m sagips.data optigan --out data/gate.h5 --gate run0.root:0,0,0.5 run1.root:0.25,0,0.5
    python -m sagips_environments.optigan.data --out ...                  # the same, without the sagips.data hook

Writes two files in the same format (datasets `photons` (N x 6: X, Y, dX, dY, dZ, EKine) and `conditions`
(N x 3: x, y, z in mm), float32, rows grouped by emission point and shuffled within it):

    FILE.h5           the training set: every grid point, `--photons-per-point` detected photons each
    FILE_heldout.h5   the held-out set: `--heldout-points` random emission points off the grid (inside its region,
                      >= 0.05 mm from every grid point), `--heldout-photons` photons each; it is what
                      `environment.heldout_file` points to for the JS quality (omitted with --heldout-points 0)

Attributes: `columns`, `condition_columns`, `crystal` (JSON of the MC settings), `points` (the emission points),
`photons_per_point`, `seed`, `detected_fraction`, `source`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from typing import Any

import numpy as np

from .mc import CONDITION_COLUMNS, PHOTON_COLUMNS, Crystal, paper_grid, random_points, simulate_points


def heldout_path(path: str) -> str:
    """data/optigan.h5 -> data/optigan_heldout.h5 (the held-out file's documented name)."""
    root, ext = os.path.splitext(path)
    return f"{root}_heldout{ext or '.h5'}"


def build_dataset(crystal: Crystal, photons_per_point: int, heldout_points: int, heldout_photons: int, seed: int,
                  grid_side: int = 7, depths: int = 5
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, dict[str, Any], dict[str, Any]]:
    """(training arrays, held-out arrays or None, training attrs, held-out attrs), from the MC.

    Independent random streams: SeedSequence([seed, 0]) for the grid's photons, [seed, 1] for the held-out
    photons, [seed, 2] for the held-out emission points.
    """
    grid = paper_grid(crystal, grid_side, depths)
    photons, conds, stats = simulate_points(crystal, grid, photons_per_point, [seed, 0])
    base = {"columns": ",".join(PHOTON_COLUMNS), "condition_columns": ",".join(CONDITION_COLUMNS),
            "crystal": json.dumps(_crystal_dict(crystal)), "seed": int(seed),
            "source": "sagips optigan optical MC (environments/optigan/mc.py)"}
    attrs = {**base, "points": grid, "photons_per_point": int(photons_per_point),
             "detected_fraction": float(stats.detected_fraction)}
    train = {"photons": photons, "conditions": conds}
    if heldout_points <= 0:
        return train, None, attrs, {}
    pts = random_points(grid, heldout_points, np.random.default_rng(np.random.SeedSequence([seed, 2])))
    h_ph, h_co, h_stats = simulate_points(crystal, pts, heldout_photons, [seed, 1])
    h_attrs = {**base, "points": pts, "photons_per_point": int(heldout_photons),
               "detected_fraction": float(h_stats.detected_fraction), "heldout": 1}
    return train, {"photons": h_ph, "conditions": h_co}, attrs, h_attrs


def _crystal_dict(c: Crystal) -> dict:
    d = asdict(c)
    d["n_crystal"] = c.n
    if not math.isfinite(d["absorption_length"]):
        d["absorption_length"] = "inf"
    return d


# ------------------------------------------------------------------------------------------------ the CLI
def add_cli(subparsers) -> argparse.ArgumentParser:
    """Add the `optigan` subcommand to `python -m sagips.data` (its handler is `args.run(args)`)."""
    p = subparsers.add_parser("optigan", help="optical photons at the photodetector face (MC stand-in or GATE "
                              "ROOT files) on the optiGAN paper's grid, plus a held-out file",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(run=run)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="FILE.h5", help="training file; the held-out set goes to "
                   "FILE_heldout.h5 beside it (both written atomically)")
    p.add_argument("--photons-per-point", type=int, default=30_000, metavar="N",
                   help="detected photons per grid point (default 30,000, the paper's minimum)")
    p.add_argument("--heldout-points", type=int, default=100, metavar="N",
                   help="random held-out emission points (default 100; the paper kept 1000; 0 = no held-out file)")
    p.add_argument("--heldout-photons", type=int, default=6000, metavar="N",
                   help="photons per held-out point (default 6000: two halves of 3000 for the JS ceiling)")
    p.add_argument("--grid-side", type=int, default=7, metavar="K", help="grid points along x (default 7: 28 points "
                   "in the 1/8 cross-section)")
    p.add_argument("--depths", type=int, default=5, metavar="K", help="grid depths (default 5)")
    p.add_argument("--length", type=float, default=3.0, metavar="MM", help="crystal length L (default 3)")
    p.add_argument("--width", type=float, default=3.0, metavar="MM", help="crystal cross-section side (default 3)")
    p.add_argument("--scintillator", choices=("BGO", "LYSO"), default="BGO", help="spectrum and refractive index")
    p.add_argument("--reflectivity", type=float, default=0.98, help="reflector R on lateral/back faces (0.98)")
    p.add_argument("--lambertian", type=float, default=0.0, help="diffuse fraction of reflector reflections (0)")
    p.add_argument("--absorption-length", type=float, default=100.0, metavar="MM",
                   help="bulk absorption length (default 100 mm; inf = none)")
    p.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
    p.add_argument("--gate", nargs="+", metavar="FILE.root[:x,y,z]", help="read GATE phase-space files instead of "
                   "running the MC (see environments/optigan/gate.py); the condition is given after ':' in this "
                   "project's frame (not shifted by --gate-origin) or read from the TrackVertexPosition_* branches "
                   "(GATE's world frame, shifted)")
    p.add_argument("--gate-heldout", nargs="+", metavar="FILE.root[:x,y,z]", help="GATE files for the held-out set")
    p.add_argument("--gate-origin", type=float, nargs=3, default=(0.0, 0.0, 0.0), metavar=("X", "Y", "Z"),
                   help="GATE world position (mm) of this project's origin: the crystal axis at its back face")


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
    except ValueError as e:
        print(f"sagips.data: error: {e}", file=sys.stderr)
        return 2
    from sagips.io.refdata import write_reference

    if args.gate:
        from .gate import read_many

        train = read_many(args.gate, origin=args.gate_origin)
        attrs = {"columns": ",".join(PHOTON_COLUMNS), "condition_columns": ",".join(CONDITION_COLUMNS),
                 "source": "GATE phase space: " + " ".join(args.gate)}
        held, h_attrs = None, {}
        if args.gate_heldout:
            held = read_many(args.gate_heldout, origin=args.gate_origin)
            h_attrs = {**attrs, "source": "GATE phase space: " + " ".join(args.gate_heldout), "heldout": 1}
    else:
        crystal = Crystal(width=args.width, length=args.length, scintillator=args.scintillator,
                          reflectivity=args.reflectivity, lambertian=args.lambertian,
                          absorption_length=args.absorption_length)
        train, held, attrs, h_attrs = build_dataset(crystal, args.photons_per_point, args.heldout_points,
                                                    args.heldout_photons, args.seed, args.grid_side, args.depths)
    write_reference(args.out, train, attrs)
    print(f"wrote {args.out}: photons {train['photons'].shape}, conditions {train['conditions'].shape}")
    if held is not None:
        hp = heldout_path(args.out)
        write_reference(hp, held, h_attrs)
        print(f"wrote {hp}: photons {held['photons'].shape}, conditions {held['conditions'].shape}")
    return 0


def _check(args: argparse.Namespace) -> None:
    for key in ("photons_per_point", "heldout_photons", "grid_side", "depths"):
        if getattr(args, key) < (2 if key == "grid_side" else 1):
            raise ValueError(f"--{key.replace('_', '-')}: too small ({getattr(args, key)})")
    if args.heldout_points < 0:
        raise ValueError("--heldout-points: must be >= 0")
    if not (0.0 <= args.reflectivity <= 1.0 and 0.0 <= args.lambertian <= 1.0):
        raise ValueError("--reflectivity and --lambertian must be in [0, 1]")
    if not (args.length > 0 and args.width > 0 and args.absorption_length > 0):
        raise ValueError("--length, --width and --absorption-length must be > 0")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sagips_environments.optigan.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
