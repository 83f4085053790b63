"""Scaling model of SAGIPS: calibrate on this machine, validate on tiny runs, project to Polaris (paper Figs. 11-12).

    .venv/bin/python benchmarks/scaling_model.py measure         # small mpiexec timings (N = 2, 4) + local timings
    .venv/bin/python benchmarks/scaling_model.py validate --schedule  # the real exchanges between sleeping
                                                                      # pipelines at N = 1, 2, 4 (the validation)
    .venv/bin/python benchmarks/scaling_model.py validate --paired  # tiny sagips.run runs at N = 1, 2, 4, each
                                                                    # after its own single-rank reference
    .venv/bin/python benchmarks/scaling_model.py project          # Polaris projection: figures, JSON, Markdown
    .venv/bin/python benchmarks/scaling_model.py report           # the page and figures again from the JSON only
    .venv/bin/python benchmarks/scaling_model.py all              # measure, validate, project in order

The model itself is benchmarks/sim.py (a discrete-event simulation of every mode's schedule; read its docstring).
This script only dispatches; each command lives in benchmarks/scaling/ (read their docstrings):
    common.py     paths, sizes, validation settings, helpers shared by every command
    measure.py    measure  -> docs/benchmarks/scaling_measurements.json (mpiexec workers, local costs, epoch timing)
    calibrate.py  the fit of the model's inputs on those measurements, the local profile, the wait-loop fit
    validate.py   validate -> the schedule replay and the tiny runs, stored in scaling_measurements.json
    project.py    project  -> docs/benchmarks/scaling_model.json (Polaris profile, projection, scenarios)
    report.py     report   -> docs/benchmarks/scaling_model.md and the figures, whole, from scaling_model.json
Hand-written notes on the page live in docs/benchmarks/scaling_model_notes.md, which no command writes.
The names below are re-exported so that `load_benchmark("scaling_model")` (tests/_bench.py) sees them all.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the scaling package and sim.py

from scaling.calibrate import (
    FIT_CASE,
    _allreduce_rounds,
    _ring_parts,
    calibrate,
    calibrate_all,
    exchange_records,
    fit_polling,
    local_profile,
)
from scaling.common import (
    DOCS,
    EXCHANGE_JSON,
    FIG_RATE,
    FIG_TIME,
    MEASUREMENTS,
    N_WEIGHTS,
    NOTES_MD,
    OUT_JSON,
    OUT_MD,
    REPO,
    VALIDATION_EPOCHS,
    VALIDATION_INNER,
    VALIDATION_SETS,
    load_json,
)
from scaling.measure import cmd_measure, measure_epoch, measure_local, measure_mpi, mpi_worker
from scaling.project import (
    A100_EPOCH_S,
    CURVES,
    EPOCHS,
    POLARIS_SOURCES,
    RANKS,
    H,
    cmd_project,
    hop_scenarios,
    paper_like_hop,
    polaris_profile,
    profile_dict,
    projection,
    saturation_limit,
    scenarios,
    whole_ring_limit,
)
from scaling.report import cmd_report, figures, report
from scaling.validate import (
    cmd_validate,
    predict_run,
    run_summary,
    sched_worker,
    validate,
    validate_pairs,
    validate_schedule,
)

__all__ = [  # what `load_benchmark("scaling_model")` offers: the commands' main functions, as before the split
    "A100_EPOCH_S", "CURVES", "DOCS", "EPOCHS", "EXCHANGE_JSON", "FIG_RATE", "FIG_TIME", "FIT_CASE", "H",
    "MEASUREMENTS", "NOTES_MD", "N_WEIGHTS", "OUT_JSON", "OUT_MD", "POLARIS_SOURCES", "RANKS", "REPO",
    "VALIDATION_EPOCHS", "VALIDATION_INNER", "VALIDATION_SETS", "_allreduce_rounds", "_ring_parts", "calibrate", "calibrate_all",
    "cmd_measure", "cmd_project", "cmd_report", "cmd_validate", "exchange_records", "figures", "fit_polling",
    "hop_scenarios", "load_json", "local_profile", "main", "measure_epoch", "measure_local", "measure_mpi",
    "mpi_worker", "paper_like_hop", "polaris_profile", "predict_run", "profile_dict", "projection", "report",
    "run_summary", "saturation_limit", "scenarios", "sched_worker", "validate", "validate_pairs",
    "validate_schedule", "whole_ring_limit",
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="mpiexec timings at N=2,4 + local timings + single-rank epoch timing")
    m.add_argument("--reps", type=int, default=60)
    m.add_argument("--work", default="/tmp/sagips-scaling-model")
    v = sub.add_parser("validate", help="predicted vs measured training time of tiny runs")
    v.add_argument("--run", action="store_true", help="run the tiny runs first (N=1,2,4; ~5 min on 2 cores)")
    v.add_argument("--recalibrate-epoch", action="store_true", help="repeat the single-rank epoch timing first")
    v.add_argument("--epochs", type=int, default=VALIDATION_EPOCHS)
    v.add_argument("--repeats", type=int, default=3)
    v.add_argument("--append", action="store_true", help="add the new runs to the stored ones (more repeats)")
    v.add_argument("--schedule", action="store_true", help="schedule replay: the real exchanges between sleeping "
                   "pipelines at N = 1, 2, 4 (~2 min, little CPU)")
    v.add_argument("--paired", action="store_true", help="paired runs: each configuration right after its own "
                   "single-rank reference run (--repeats rounds)")
    v.add_argument("--note", default="", help="a remark stored with the runs and printed in the report")
    v.add_argument("--work", default="/tmp/sagips-scaling-model")
    sub.add_parser("project", help="the Polaris projection: figures, JSON, Markdown")
    sub.add_parser("report", help="only the page and figures, again, from the stored JSON (no simulation)")
    a = sub.add_parser("all", help="measure, validate --paired, project")
    a.add_argument("--reps", type=int, default=60)
    a.add_argument("--work", default="/tmp/sagips-scaling-model")
    a.add_argument("--epochs", type=int, default=VALIDATION_EPOCHS)
    a.add_argument("--repeats", type=int, default=3)
    sw = sub.add_parser("_sched-worker")
    sw.add_argument("--case", required=True)
    sw.add_argument("--out", required=True)
    w = sub.add_parser("_mpi-worker")
    w.add_argument("--reps", type=int, required=True)
    w.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "_mpi-worker":
        mpi_worker(args.reps, args.out)
    elif args.cmd == "_sched-worker":
        sched_worker(args.case, args.out)
    elif args.cmd == "measure":
        cmd_measure(args)
    elif args.cmd == "validate":
        cmd_validate(args)
    elif args.cmd == "project":
        cmd_project(args)
    elif args.cmd == "report":
        cmd_report(args)
    else:
        cmd_measure(args)
        args.run, args.recalibrate_epoch, args.append, args.note, args.paired = False, False, False, "", True
        args.schedule = True
        cmd_validate(args)
        cmd_project(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
