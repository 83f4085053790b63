"""Every exchange mode with train.cuda_graph off and on, under mpiexec on one GPU: do they end the same?

    python benchmarks/graph_modes.py --out DIR                 # on a CUDA machine (benchmarks/device_check.sh)

For each mode of sagips.config.MODES, two runs of `make run`'s preset on 4 ranks (comm.inner_size 2) from the same
seed, --epochs 200 and 1M reference events, one eager (off) and one recorded (on). A mode whose ranks exchange in
step (all but rma-arar-arar, whose one-sided windows combine what has arrived, and so differ from run to run by
design) must end with the same generators: every rank's last checkpoint is compared, weight by weight, and the final
residuals. Then `make run`'s whole job (4,000 epochs, 16M events) with train.cuda_graph auto and off: its max|r|,
training seconds and what run.json says was used. Runs go `--parallel` at a time (4 ranks each).

Writes DIR/graph_modes.json and prints a line per mode. Exit status 1 if a deterministic mode's graph run differs from
its eager run by more than the tolerance, or a run failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sagips.config import MODES  # noqa: E402
from sagips.io.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402

ASYNC = {"rma-arar-arar"}  #: modes whose runs differ from one another by design
RTOL, ATOL = 1e-3, 1e-4  #: as tests/test_step.py's graph-against-eager test (the gather's atomics on a GPU)


def launch(work: Path, name: str, args: list[str], timeout_s: int,
           entry: tuple[str, ...] = ("-m", "sagips.run")) -> dict:
    """`make run`'s preset on 4 ranks with `args` (entry: what python runs, sagips.run or a script wrapping it)."""
    run = work / name
    cmd = [os.environ.get("MPIEXEC", "mpiexec"), "-n", "4", sys.executable, *entry,
           "--config", "configs/proxy1d-quick.yaml",
           "--set", "comm.inner_size=2", "--set", "train.progress=false", "--output-dir", str(run), "--overwrite",
           *args]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    (work / f"{name}.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        print(f"--- {name} failed; the end of its log:\n" + (res.stdout + res.stderr)[-2000:], flush=True)
        raise RuntimeError(f"{name}: rc {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1][:300]}")
    info = json.loads((run / "run.json").read_text())
    return {"wall_s": round(time.perf_counter() - t0, 1), "train_seconds": info["train_seconds"],
            "final_quality": info["final_quality"], "cuda_graph": info.get("cuda_graph"), "dir": str(run)}


def last_generators(run_dir: str) -> dict[int, dict[str, torch.Tensor]]:
    return {rank: load_checkpoint(eps[max(eps)])["generator"] for rank, eps in list_checkpoints(run_dir).items()}


def compare(off: dict, on: dict) -> dict:
    a, b = last_generators(off["dir"]), last_generators(on["dir"])
    per_rank = []
    for rank in sorted(a):
        per_rank.append(max(float(((b[rank][k] - v).abs() / (ATOL + RTOL * v.abs())).max())
                            for k, v in a[rank].items()))
    ra, rb = off["final_quality"]["residuals"], on["final_quality"]["residuals"]
    return {"ranks": len(a), "worst_weight_diff_in_tolerances": max(per_rank),
            "per_rank_weight_diff_in_tolerances": per_rank,
            "max_residual_diff": max(abs(x - y) for x, y in zip(ra, rb))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the short runs, e.g. train.log_every=1 (a host read every epoch)")
    ap.add_argument("--no-full", action="store_true", help="skip make run's whole job")
    ap.add_argument("--control", action="store_true",
                    help="a second eager run of each deterministic mode: the GPU's own run-to-run difference (its "
                         "atomics), against which the graph's difference is judged")
    ap.add_argument("--cpu-check", action="store_true",
                    help="the script's own check on a CPU: both runs eager on the CPU (they must agree exactly)")
    a = ap.parse_args(argv)
    if not a.cpu_check and not torch.cuda.is_available():
        ap.error("needs CUDA: train.cuda_graph records GPU work only (--cpu-check checks the script on a CPU)")
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="graph_modes-"))  # run folders and logs (the device returns 8 files)
    # precision pinned: train.amp=auto decides by timing, and two runs could decide differently
    short = ["--epochs", str(a.epochs), "--set", "environment.reference_events=1000000", "--set", "train.amp=bf16"]
    short += [x for kv in a.set for x in ("--set", kv)]
    graphs = ("off", "on") if not a.cpu_check else ("off", "off")
    jobs = {}
    if not a.no_full:  # the long ones first, so that the short ones fill the other slots
        for g in ("off", "auto"):
            jobs[("make-run", g)] = ("make-run-" + g, ["--mode", "rma-arar-arar", "--set", f"train.cuda_graph={g}"])
    for mode in a.modes.split(","):  # "mode#2": the same mode again (a repeat, to see how the differences spread)
        name, base = mode.replace("#", "-r"), mode.split("#")[0]
        for key, g in zip(("off", "on"), graphs):
            jobs[(mode, key)] = (f"{name}-{key}", ["--mode", base, "--set", f"train.cuda_graph={g}", *short])
        if a.control and base not in ASYNC:
            jobs[(mode, "off2")] = (f"{name}-off2", ["--mode", base, "--set", "train.cuda_graph=off", *short])
    results, errors = {}, []
    with ThreadPoolExecutor(a.parallel) as pool:
        futures = {key: pool.submit(launch, work, name, args, 900) for key, (name, args) in jobs.items()}
        for key, fut in futures.items():
            try:
                results[key] = fut.result()
            except Exception as err:  # noqa: BLE001 - recorded, and the exit status says so
                errors.append(f"{key}: {type(err).__name__}: {err}")
                print(errors[-1], flush=True)
    data = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__,
            "epochs": a.epochs, "command": "python benchmarks/graph_modes.py " + " ".join(sys.argv[1:]),
            "tolerance": {"rtol": RTOL, "atol": ATOL}, "modes": {}, "errors": errors}
    failed = bool(errors)
    for mode in a.modes.split(","):
        off, on = results.get((mode, "off")), results.get((mode, "on"))
        if not (off and on):
            continue
        base = mode.split("#")[0]
        row = {"deterministic": base not in ASYNC, "graph": on["cuda_graph"],
               "max_abs_residual": {"off": off["final_quality"]["max_abs_residual"],
                                    "on": on["final_quality"]["max_abs_residual"]},
               "train_s": {"off": max(off["train_seconds"]), "on": max(on["train_seconds"])}, **compare(off, on)}
        again = results.get((mode, "off2"))
        if again:  # two eager runs: what the GPU's nondeterministic atomics alone make of the same seed
            row["eager_vs_eager"] = compare(off, again)
        # the graph must add nothing beyond that: within the tolerance, or within twice the eager runs' own difference
        floor = row["eager_vs_eager"]["worst_weight_diff_in_tolerances"] if again else 0.0
        agree = row["worst_weight_diff_in_tolerances"] <= max(1.0, 2.0 * floor)
        row["agree"] = agree
        if base not in ASYNC and (not agree or not (on["cuda_graph"]["used"] or a.cpu_check)):
            failed = True
        data["modes"][mode] = row
        print(f"{mode:14s} graph {'used' if on['cuda_graph']['used'] else 'NOT used'}: weights differ by "
              f"{row['worst_weight_diff_in_tolerances']:.3g} tolerances ({'agree' if agree else 'DIFFER'}"
              f"{'' if base not in ASYNC else ', asynchronous by design'}"
              f"{f'; two eager runs: {floor:.3g}' if again else ''}); max|r| off "
              f"{row['max_abs_residual']['off']:.4f} on {row['max_abs_residual']['on']:.4f}", flush=True)
    full = {g: results.get(("make-run", g)) for g in ("off", "auto")}
    if all(full.values()):
        data["make_run"] = {g: {k: r[k] for k in ("train_seconds", "cuda_graph", "wall_s")}
                            | {"max_abs_residual": r["final_quality"]["max_abs_residual"]} for g, r in full.items()}
        for g, r in data["make_run"].items():
            print(f"make run, train.cuda_graph={g}: max|r| {r['max_abs_residual']:.4f}, "
                  f"{max(r['train_seconds']):.1f} s training (4 such jobs shared the GPU), graph: "
                  f"{r['cuda_graph']['why']}", flush=True)
    (a.out / "graph_modes.json").write_text(json.dumps(data, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
