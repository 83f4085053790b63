"""How far the maximum-likelihood fit scatters over proxy1d's reference data sets, in units of the Cramér-Rao bound:
the data that the calibration study (benchmarks/coverage.py) trains on, made the way a run makes them.

    python benchmarks/proxy1d_ml_scatter.py --seeds 3000:3200 [--events 16000000] [--set KEY=VALUE ...]
    python benchmarks/proxy1d_ml_scatter.py --case toy1d --seeds 2000:2100     # examples/toy1d's unbinned fit

For every seed: the data set of `configs/proxy1d-quick.yaml` at its truth, as `sagips.io.writer.generate_subset` makes
it (the blocks of a written file), fitted on the theory's grid with the norms held (`loop_closure.ml_fit`, the
loop closure's floor), and its pull (p_ML - p_true) / sigma_CR (sigma from `stats.cramer_rao` of proxy1d's
Fisher information at the truth). The pulls' standard deviation over the seeds should be 1
(tests/test_ml_covariance.py checks it on multinomial counts); this checks the written events themselves. One line
per seed in runs/proxy1d_ml_scatter/START-STOP.jsonl (resumable: finished seeds are skipped) and a summary at the
end. One torch thread; ~6 s a seed at 16M events on a 2-core AMD EPYC.

--case toy1d does the same for examples/toy1d (the coverage study's second case): its data sets as the writer makes
them, the unbinned fit benchmarks/toy1d.ml_fit from the truth, sigma from N times benchmarks/toy1d.fisher at the
truth (~7 s a seed at 1M events); lines in runs/toy1d_ml_scatter/.
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


def main(argv: list[str] | None = None) -> int:
    from sagips.io.writer import generate_subset

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=("proxy1d", "toy1d"), default="proxy1d")
    ap.add_argument("--seeds", default="3000:3200", help="START:STOP, the data sets' seeds (the study's: 1000+k)")
    ap.add_argument("--events", type=int, default=None, help="events per data set (default: the preset's)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for the environment (as sagips.run)")
    ap.add_argument("--out", default=None, help="the folder of the lines (default runs/CASE_ml_scatter)")
    a = ap.parse_args(argv)
    try:
        lo, hi = (int(v) for v in a.seeds.split(":"))
    except ValueError:
        ap.error(f"--seeds: expected START:STOP, got {a.seeds!r}")
    torch.set_num_threads(1)
    env_cls, cfg, truth, n, bound, fit = case(a)
    out = Path(a.out or ROOT / "runs" / f"{a.case}_ml_scatter")
    path = out / f"{lo}-{hi}{'' if a.events is None else f'-n{n}'}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {d["seed"]: d["pull"] for d in map(json.loads, path.read_text().splitlines())} if path.exists() else {}
    t0 = time.time()
    with path.open("a") as f:
        for seed in (s for s in range(lo, hi) if s not in done):
            pull = (fit(*generate_subset(env_cls, cfg, seed, n, np.array([[0, n]]))) - truth) / bound
            done[seed] = pull.tolist()
            f.write(json.dumps({"seed": seed, "pull": done[seed]}) + "\n")
            f.flush()  # a line per finished seed: an interrupted call resumes after it
            print(f"seed {seed}: pull {np.round(pull, 2).tolist()} ({time.time() - t0:.0f} s)", flush=True)
    p = np.array([done[s] for s in sorted(done)])
    print(f"{len(p)} data sets of {n} events (seeds {lo}-{hi - 1}), pull std per parameter "
          f"{np.round(p.std(0, ddof=1), 3).tolist()} (standard error ~{1 / np.sqrt(2 * (len(p) - 1)):.3f}), "
          f"mean {np.round(p.mean(0), 3).tolist()}")
    return 0


def case(a: argparse.Namespace):
    """(environment class, its config, truth, events per data set, the Cramér-Rao sigma, fit(arrays, attrs) -> p)
    of `a.case`."""
    from benchmarks import coverage

    if a.case == "toy1d":
        import atexit
        import shutil
        import tempfile

        from benchmarks import toy1d
        from sagips.environment import get_environment
        from tests._plugins import toy_site

        site = tempfile.mkdtemp(prefix="sagips-toy-site-")
        atexit.register(shutil.rmtree, site, True)
        for p in reversed(toy_site(Path(site))):  # its entry point, as `pip install -e examples/toy1d` would
            sys.path.insert(0, p)
        cfg = coverage.env_config("toy1d", a.set)
        env_cls = get_environment("toy1d")
        truth = np.array([cfg.true_params[k] for k in env_cls.parameters], dtype=np.float64)
        n = a.events or cfg.reference_events
        bounds = [tuple(cfg.bounds[k]) for k in env_cls.parameters]
        return (env_cls, cfg, truth, n, np.sqrt(np.diag(np.linalg.inv(n * toy1d.fisher(truth)))),
                lambda arrays, attrs: toy1d.ml_fit(arrays["events"][:, 0], bounds, truth))
    from benchmarks import loop_closure
    from sagips.analysis import stats
    from sagips_environments.proxy1d import Proxy1D

    cfg = coverage.env_config("proxy1d", a.set)
    n = a.events or cfg.reference_events
    truth = np.asarray(cfg.true_params, dtype=np.float64)
    return (Proxy1D, cfg, truth, n, stats.cramer_rao(Proxy1D(cfg, "cpu", 0).fisher(truth), n),
            lambda arrays, attrs: loop_closure.ml_fit(arrays["events"], attrs["norms"], cfg, truth * 1.01))


if __name__ == "__main__":
    sys.exit(main())
