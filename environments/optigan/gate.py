"""Read GATE phase-space ROOT files (optical photons at the photodetector face) into optiGAN's arrays.

    from sagips_environments.optigan.gate import read_phase_space
    photons, conditions = read_phase_space("phsp.root", condition=(0.25, 0.0, 0.5))

Needs `uproot` (the `root` extra: pip install -e .[root]).

GATE 10 writes a phase-space actor's output as a ROOT tree, by default named "Phase", one row per particle that
crosses the actor's volume, with one branch per attribute (vectors split into _X, _Y, _Z). Column mapping:

    optiGAN column   GATE branch                     unit conversion
    X                Position_X                      mm (Geant4's unit), minus origin[0]
    Y                Position_Y                      mm, minus origin[1]
    dX, dY, dZ       Direction_X, _Y, _Z             unit vector, none
    EKine            KineticEnergy                   MeV (Geant4's unit) x 1e6 -> eV (energy_scale)

Rows kept: ParticleName == "opticalphoton" when that branch exists (GATE also records the gamma and electrons),
and Direction_Z > 0 (photons going into the detector), as optiGAN's data does.

Conditions (the emission point x, y, z in mm, in this project's frame: crystal axis at x = y = 0, back face at
z = 0, exit face at z = L), in this order of preference:
1. `condition=(x, y, z)` given by the caller, already in this project's frame (`origin` is not subtracted): one
   emission point per file (how the optiGAN training set was made: one GATE run per point);
2. the branches TrackVertexPosition_X/_Y/_Z (the photon's creation point; add the "TrackVertexPosition"
   attribute to the phase-space actor), minus `origin`.
Otherwise the file cannot be used for training and a ValueError says so. (opengate's inference code instead takes
the position of the gamma that opens each event as the condition; that is an inference-time approximation.)
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BRANCHES = {"X": "Position_X", "Y": "Position_Y", "dX": "Direction_X", "dY": "Direction_Y", "dZ": "Direction_Z",
            "EKine": "KineticEnergy"}
VERTEX = ("TrackVertexPosition_X", "TrackVertexPosition_Y", "TrackVertexPosition_Z")
MEV_TO_EV = 1.0e6


def _uproot():
    try:
        import uproot
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reading GATE ROOT files needs uproot: pip install -e .[root]  (or pip install uproot)") \
            from e
    return uproot


def read_phase_space(path: str, condition: Sequence[float] | None = None, tree: str = "Phase",
                     origin: Sequence[float] = (0.0, 0.0, 0.0), energy_scale: float = MEV_TO_EV
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(photons (N, 6), conditions (N, 3)), float32, from one GATE phase-space file (see the module docstring)."""
    uproot = _uproot()
    origin = np.asarray(origin, dtype=np.float64)
    with uproot.open(path) as f:
        if tree not in f:
            raise ValueError(f"{path}: no tree '{tree}' (it holds: {', '.join(f.keys()) or 'nothing'})")
        t = f[tree]
        names = set(t.keys())
        missing = [b for b in BRANCHES.values() if b not in names]
        if missing:
            raise ValueError(f"{path}: tree '{tree}' lacks branches {missing} (add them to the phase-space actor's "
                             f"attributes)")
        cols = {k: np.asarray(t[b].array(library="np"), dtype=np.float64) for k, b in BRANCHES.items()}
        keep = cols["dZ"] > 0
        if "ParticleName" in names:
            pname = t["ParticleName"].array(library="np")
            keep &= np.asarray([str(p) == "opticalphoton" for p in pname])
        vertex = None
        if condition is None:
            if not all(v in names for v in VERTEX):
                raise ValueError(f"{path}: no condition given and no TrackVertexPosition_X/Y/Z branches; pass "
                                 f"FILE.root:x,y,z (the emission point of the run)")
            vertex = np.column_stack([np.asarray(t[v].array(library="np"), dtype=np.float64) for v in VERTEX])
    photons = np.column_stack([cols["X"] - origin[0], cols["Y"] - origin[1], cols["dX"], cols["dY"], cols["dZ"],
                               cols["EKine"] * energy_scale])[keep]
    if vertex is not None:
        conds = (vertex - origin)[keep]
    else:
        conds = np.broadcast_to(np.asarray(condition, dtype=np.float64), (len(photons), 3))
    return photons.astype(np.float32), np.ascontiguousarray(conds, dtype=np.float32)


def parse_spec(spec: str) -> tuple[str, tuple[float, float, float] | None]:
    """'run0.root:0.25,0,0.5' -> ('run0.root', (0.25, 0.0, 0.5)); 'run0.root' -> ('run0.root', None)."""
    path, sep, cond = spec.rpartition(":")
    if not sep or not path or "," not in cond:
        return spec, None
    vals = tuple(float(v) for v in cond.split(","))
    if len(vals) != 3:
        raise ValueError(f"{spec}: the condition after ':' must be x,y,z")
    return path, vals


def read_many(specs: Sequence[str], origin: Sequence[float] = (0.0, 0.0, 0.0)) -> dict[str, np.ndarray]:
    """Concatenate several `FILE.root[:x,y,z]` files into {'photons', 'conditions'}."""
    ph, co = [], []
    for spec in specs:
        path, cond = parse_spec(spec)
        p, c = read_phase_space(path, cond, origin=origin)
        ph.append(p)
        co.append(c)
    return {"photons": np.concatenate(ph), "conditions": np.concatenate(co)}
