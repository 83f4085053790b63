"""Where does a recorded run part from the eager one? A fingerprint of every epoch, recorded on the device.

    python benchmarks/graph_trace.py --out DIR [--graph 12 --eager 8 --mode ensemble]   # on a CUDA machine
    python benchmarks/graph_trace.py --out DIR --cpu-check --graph 1 --epochs 12         # the script's own check

`--eager` runs with train.cuda_graph=off and `--graph` runs with on, of `make run`'s preset on 4 ranks (as
benchmarks/graph_modes.py: 200 epochs, 1M reference events, bf16 pinned, the same seed). Each rank writes, at the
end of every epoch, six numbers into a device buffer: the sums of the generator's weights and of their absolute
values, the sum of the critic's weights, the two losses, the sum of the averaged generator's weights. The write is
part of the step's last device segment, so it is recorded and replayed with it: no host read is added, the epoch's
timing and synchronisation stay as they were (the difference that this looks for depended on timing). Each
rank saves its buffer when the run ends (trace<rank>.npy).

Prints, per graph run and rank, the first epoch where the fingerprint parts from the first eager run by more than 1e-7,
1e-5, 1e-3 and 1e-2 (relative), and which number parted first; the other eager runs show the GPU's own run-to-run
difference (its atomics, amplified by training). That difference takes a few paths of its own: on one H100, rank 0 of
eager runs parted by 1e-5 at epoch 14 in 2 of 7 runs and at 31-49 in the others. So the eager runs must be many (8) for
a graph run's parting to be judged against the earliest of them. Writes DIR/graph_trace.json. Exit status 1 if a graph
run parted by 1e-3 before any eager run parted by 1e-5 (on that rank), or a run failed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLUMNS = ("sum_G", "sum_abs_G", "sum_D", "loss_d", "loss_g", "sum_G_eval")
THRESHOLDS = (1e-7, 1e-5, 1e-3, 1e-2)


def rank_main(argv: list[str]) -> int:
    """One rank: sagips.run with the fingerprint chained into the plan's last device segment."""
    import sagips.run
    import sagips.trainer as T
    from sagips.models import unwrap

    plan, fit = T.Trainer.plan, T.Trainer.fit

    def traced_plan(self):
        parts = plan(self)

        def fingerprint() -> None:
            n = self.cfg.train.epochs
            if not hasattr(self, "_trace"):  # a row per epoch of the run
                self._trace = torch.zeros(n, len(COLUMNS), dtype=torch.float64, device=self.epoch_t.device)
            G = unwrap(self.G)

            def total(ps, f=lambda t: t):
                return torch.stack([f(p.detach().double()).sum() for p in ps]).sum()

            row = torch.stack([total(G.parameters()), total(G.parameters(), torch.abs), total(self.D.parameters()),
                               self._out["loss_d"].detach().double().reshape(()),
                               self._out["loss_g"].detach().double().reshape(()), total(self.G_eval.parameters())])
            at = (self.epoch_t.long() - 1).clamp(0, n - 1).view(1)  # the device's own epoch counter
            self._trace.index_copy_(0, at, row.view(1, -1))

        kind, fn = parts[-1]
        parts[-1:] = [("device", T._chain(fn, fingerprint))] if kind == "device" else [parts[-1],
                                                                                       ("device", fingerprint)]
        return parts

    def traced_fit(self, *args, **kwargs):
        try:
            return fit(self, *args, **kwargs)
        finally:
            if hasattr(self, "_trace"):
                np.save(Path(self.out_dir) / f"trace{self.rank}.npy", self._trace[: self.state.epoch].cpu().numpy())

    T.Trainer.plan, T.Trainer.fit = traced_plan, traced_fit
    return sagips.run.main(argv)


def parting(trace: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per epoch, the largest relative difference of the fingerprint from `ref`, and which column it is in."""
    n = min(len(trace), len(ref))
    d = np.abs(trace[:n] - ref[:n]) / (1e-6 + np.abs(ref[:n]))
    d = np.where(np.isfinite(d), d, np.inf)  # a run that went to NaN has parted
    return d.max(axis=1), d.argmax(axis=1)


def first_over(worst: np.ndarray, th: float) -> int | None:
    """The first epoch (1-based) where `worst` exceeds `th`, or None."""
    over = np.flatnonzero(worst > th)
    return int(over[0]) + 1 if over.size else None


def judge(trace: np.ndarray, ref: np.ndarray, eager_first: int, graph: bool) -> dict:
    """One rank of one run against the reference: the first epochs over each threshold, the number that parted first,
    the final difference, and whether a graph run parted by 1e-3 before any eager run parted by 1e-5 (`eager_first`,
    the earliest such epoch of the eager runs on this rank): not the GPU's atomics."""
    worst, col = parting(trace, ref)
    if not len(worst):
        raise ValueError("an empty trace: the run recorded no epoch")
    firsts = {f"{th:g}": first_over(worst, th) for th in THRESHOLDS}
    e3, e5 = firsts["0.001"], firsts["1e-05"]
    return {"first_epoch_over": firsts, "parted_first_in": COLUMNS[col[e5 - 1]] if e5 else None,
            "final": float(worst[-1]), "parted_alone": graph and e3 is not None and e3 < eager_first}


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--as-rank"]:
        return rank_main(sys.argv[2:])
    from benchmarks.graph_modes import launch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--graph", type=int, default=12, help="runs with train.cuda_graph=on")
    ap.add_argument("--eager", type=int, default=8, help="runs with train.cuda_graph=off (the first is the reference)")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--mode", default="ensemble")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cpu-check", action="store_true", help="every run eager on the CPU (they must agree exactly)")
    a = ap.parse_args(argv)
    if a.eager < 1 or a.graph < 0:
        ap.error("--eager must be at least 1 (the reference) and --graph at least 0")
    if not a.cpu_check and not torch.cuda.is_available():
        ap.error("needs CUDA: train.cuda_graph records GPU work only (--cpu-check checks the script on a CPU)")
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="graph_trace-"))
    runs = [(f"eager{i}", "off") for i in range(a.eager)] + [(f"graph{i}", "on") for i in range(a.graph)]
    common = ["--mode", a.mode, "--epochs", str(a.epochs), "--set", "environment.reference_events=1000000",
              "--set", "train.amp=bf16", *[x for kv in a.set for x in ("--set", kv)]]
    if a.cpu_check:
        common += ["--set", "train.device=cpu"]
    entry = (str(Path(__file__).resolve()), "--as-rank")

    def one(name: str, graph: str):
        g = "off" if a.cpu_check else graph
        try:
            r = launch(work, name, [*common, "--set", f"train.cuda_graph={g}"], 900, entry=entry)
        except Exception as err:  # noqa: BLE001 - recorded, and the exit status says so
            return name, f"{type(err).__name__}: {err}"
        return name, [np.load(Path(r["dir"]) / f"trace{k}.npy") for k in range(4)]

    with ThreadPoolExecutor(a.parallel) as pool:
        results = dict(pool.map(lambda nr: one(*nr), runs))
    errors = {n: r for n, r in results.items() if isinstance(r, str)}
    ref = results.get("eager0")
    if errors or ref is None:
        print("failed:", errors, flush=True)
        (a.out / "graph_trace.json").write_text(json.dumps({"errors": errors}, indent=1) + "\n")
        return 1
    # per rank, the first epoch where an eager run parts from the reference by 1e-5 (the GPU's atomics, amplified)
    eager_first = [min([first_over(parting(results[n][k], ref[k])[0], 1e-5) or a.epochs + 1
                        for n, _ in runs[1:a.eager]] or [a.epochs + 1]) for k in range(4)]
    data = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__,
            "command": "python benchmarks/graph_trace.py " + " ".join(sys.argv[1:]), "columns": COLUMNS,
            "eager_first_epoch_over_1e-05": eager_first, "runs": {}}
    failed = False
    for name, _ in runs[1:]:
        rows = []
        for k in range(4):
            row = {"rank": k, **judge(results[name][k], ref[k], eager_first[k], name.startswith("graph"))}
            rows.append(row)
            failed |= row["parted_alone"]
            firsts = row["first_epoch_over"]
            print(f"{name:8s} rank {k}: first epoch over {'/'.join(f'{t:g}' for t in THRESHOLDS)}: "
                  f"{list(firsts.values())} ({row['parted_first_in']}); final {row['final']:.2e}"
                  f"{'  PARTED (the eager runs did not)' if row['parted_alone'] else ''}", flush=True)
        data["runs"][name] = rows
    parted = [n for n, rows in data["runs"].items() if any(r["parted_alone"] for r in rows)]
    data["graph_runs_parted"] = f"{len(parted)} of {a.graph}"
    print(f"graph runs that parted from eager where the eager runs did not: {len(parted)} of {a.graph}", flush=True)
    (a.out / "graph_trace.json").write_text(json.dumps(data, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
