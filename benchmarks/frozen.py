"""Long studies run a frozen copy of the committed code: others edit the working tree while a study runs for hours,
and every run of one study must run the same code (a study that imported a newer sagips halfway once refused the
config keys its own runs had written).

    code, sha = export(RUNS / "code", PARTS)   # HEAD's folders, exported once (git archive); reused afterwards

The export holds a `sagips_environments` link to its environments/, so that with PYTHONPATH=code first the
environments' entry points (sagips_environments.*) load from it too. Used by benchmarks/paper_table4_converge.py
(one snapshot for the whole study, kept across resumes) and benchmarks/coverage.py --frozen-code (one per commit).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("sagips", "environments", "configs")  #: what a training run needs


def head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def export(code: Path, parts: Sequence[str] = PARTS, sha: str | None = None) -> tuple[Path, str]:
    """`parts` of commit `sha` (default HEAD) exported into `code`, unless an export is there already; (code, the
    export's commit). The export is made in a folder of this process's own and renamed into place whole, so that a
    killed export is redone and two studies started together do not mix their files (the second rename loses)."""
    if not (code / "COMMIT").exists():
        sha = sha or head()
        tmp = code.with_name(f"{code.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", sha, *parts], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
        (tmp / "sagips_environments").symlink_to("environments")
        (tmp / "COMMIT").write_text(sha + "\n")
        try:
            tmp.rename(code)
        except OSError:
            if not (code / "COMMIT").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another study exported the same commit first
    return code, (code / "COMMIT").read_text().strip()
