"""Import a script of benchmarks/ as a module (the folder is not a package)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses (and the scripts' own `import sim`) look their module up there
    spec.loader.exec_module(mod)
    return mod
