"""Register an environment package through a real `sagips.environments` entry point, without pip or a network.

importlib.metadata finds distributions by their `NAME-VERSION.dist-info` folders on sys.path, as pip leaves them in
site-packages; a test writes such a folder (METADATA + entry_points.txt) into a temporary directory and puts that
directory, and the package's source, on sys.path (in-process) or PYTHONPATH (child runs).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOY_SRC = ROOT / "examples" / "toy1d"
SMEAR_SRC = ROOT / "examples" / "smear1d"


def write_dist(site: Path, dist: str, entries: dict[str, str]) -> Path:
    """A dist-info folder for distribution `dist` with entry points name -> "module:attr" in sagips.environments."""
    info = Path(site) / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = ["[sagips.environments]"] + [f"{k} = {v}" for k, v in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return info


def declared_entry_points(src: Path) -> dict[str, str]:
    """The `sagips.environments` entry points that an example's pyproject.toml declares (what pip would register),
    so that a typo there fails the tests that use the example."""
    lines = (Path(src) / "pyproject.toml").read_text().splitlines()
    start = lines.index('[project.entry-points."sagips.environments"]') + 1
    out = {}
    for line in lines[start:]:
        if line.startswith("["):
            break
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = (s.strip() for s in line.split("=", 1))
            out[k] = v.strip('"')
    return out


def toy_site(site: Path) -> list[str]:
    """Register the example package examples/toy1d (entry point toy1d); returns the paths to put on sys.path."""
    write_dist(site, "sagips-toy1d", declared_entry_points(TOY_SRC))
    return [str(site), str(TOY_SRC)]


def smear_site(site: Path) -> list[str]:
    """Register the simulator example examples/smear1d (entry point smear1d) the same way."""
    write_dist(site, "sagips-smear1d", declared_entry_points(SMEAR_SRC))
    return [str(site), str(SMEAR_SRC)]


def pythonpath(paths: list[str]) -> dict:
    """The child environment variables that put `paths` first on sys.path."""
    old = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(paths + ([old] if old else []))}


def add_to_sys_path(paths: list[str], monkeypatch) -> None:
    for p in reversed(paths):
        monkeypatch.syspath_prepend(p)
    sys.modules.pop("sagips_toy1d", None)
