"""Export a checkpoint to another tool's format.

    python -m sagips.export CHECKPOINT --format opengate --out model.pt    # GATE 10's optiGAN (docs/optigan.md)
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    from sagips_environments.optigan.export import main as export_opengate

    return export_opengate(argv)


if __name__ == "__main__":
    sys.exit(main())
