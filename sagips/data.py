"""Write reference data for an environment (HDF5).

    python -m sagips.data proxy1d --events 1e9 --out data/proxy1d.h5 \
        [--true-params 2.1875 -0.5 3 1.09375 -0.5 4] [--seed S] [--no-progress]
    mpiexec -n 8 python -m sagips.data proxy1d --events 1e10 --out /scratch/proxy1d.h5    # 8 parts + 1 joining them

    python -m sagips.data optigan --out data/optigan.h5 ...     (see python -m sagips.data optigan --help)

    python -m sagips.data ENV --out data/env.h5 [--events N] [--seed S] [--set true_params.a=1.5]...
                                                                # any other registered environment

proxy1d writes dataset `events` (N x 2, float32) with attributes `true_params` and `norms`; optigan writes
`photons` (N x 6) and `conditions` (N x 3), plus a held-out file beside it (docs/optigan.md). Any other environment
writes what its `generate_reference` returns (a ParametricEnvironment: `events`, N x event width, with attributes
`true_params` and `parameter_names`), configured by `--set` on its `environment:` keys.

proxy1d and every environment whose config has `reference_events` (every ParametricEnvironment) are written in
blocks of 65,536 events (sagips/io/writer.py): memory stays bounded whatever --events, a progress bar goes to stderr
on a terminal, and the file is a pure function of (seed, events, truth), the same from 1 or N writer ranks. Under
`mpiexec -n N`, rank r writes `FILE.partRRRR-of-NNNN.h5` and rank 0 writes FILE as an HDF5 virtual dataset that
joins them (keep the files together). The HDF5 chunk, the block that training reads, is stored as the attribute
`chunk_rows`. A file is written atomically (a temporary file, then a rename). optigan, and an environment without
`reference_events`, build the whole array in memory, on one rank.
"""
from __future__ import annotations

import argparse
import sys

from sagips.config import ConfigError, build_config, merge, parse_set


def count(text: str) -> int:
    """An event count: 1000000, 1_000_000 or 1e9."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of events (e.g. 1000000 or 1e9)")
    return int(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sagips.data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="env", required=True, metavar="ENV")
    px = sub.add_parser("proxy1d", help="events (x ~ sigma1, x ~ sigma2) at the given true parameters")
    px.add_argument("--events", type=count, default=1_000_000, help="number of events, e.g. 1e9 (default 1e6)")
    px.add_argument("--out", required=True, metavar="FILE.h5", help="output HDF5 file (written atomically)")
    px.add_argument("--true-params", type=float, nargs=6, metavar="P", help="p0..p5 (default: the paper's truth)")
    px.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
    px.add_argument("--no-progress", action="store_true", help="no progress bar (none either when stderr is no TTY)")
    from sagips_environments.optigan.data import add_cli as add_optigan_cli

    add_optigan_cli(sub)  # `optigan`: its own options and handler (args.run)
    from sagips.environment import available

    for name in sorted(set(available()) - {"proxy1d", "optigan"}):  # every other environment, loaded only if chosen
        g = sub.add_parser(name, help=f"reference data of environment {name} at its configured truth")
        g.add_argument("--events", type=count, default=None, help="number of events, e.g. 1e9 (default: the "
                       "environment's reference_events); written in blocks if its config has reference_events, "
                       "else whole in memory")
        g.add_argument("--out", required=True, metavar="FILE.h5", help="output HDF5 file (written atomically)")
        g.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
        g.add_argument("--no-progress", action="store_true", help="no progress bar")
        g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an environment key, e.g. "
                       "--set true_params.a=1.5 (VALUE parsed as YAML); repeatable")
    args = p.parse_args(argv)
    if hasattr(args, "run"):
        return args.run(args)
    try:
        if args.events is not None and args.events < 1:
            raise ConfigError("--events: must be >= 1")
        if args.seed < 0:
            raise ConfigError("--seed: must be >= 0")
        env_raw = {"name": args.env}
        if getattr(args, "true_params", None):
            env_raw["true_params"] = list(args.true_params)
        if args.events is not None:  # through the config, so that the protocol's generate_reference(cfg, seed) suffices
            env_raw["reference_events"] = args.events
        raw = {"environment": env_raw}
        for item in getattr(args, "set", []):
            path, value = parse_set(item)
            merge(env_raw, path, value)
        if env_raw.get("name") != args.env:
            raise ConfigError(f"--set name: the environment is chosen by the command ({args.env})")
        if args.events is not None and env_raw.get("reference_events") != args.events:
            raise ConfigError(f"--events {args.events} and --set reference_events={env_raw['reference_events']}: "
                              f"give the number of events once")
        cfg = build_config(raw)
    except ConfigError as e:
        print(f"sagips.data: error: {e}", file=sys.stderr)
        return 2
    from sagips.environment import get_environment
    from sagips.io.refdata import DataError, write_reference
    from sagips.io.writer import STREAM_BLOCK_ROWS, can_stream, write_stream

    env_cls = get_environment(args.env)
    try:  # (ConfigError: the environment's own checks, e.g. a density negative inside its bounds)
        if not can_stream(cfg.environment):
            arrays, attrs = env_cls.generate_reference(cfg.environment, args.seed)
            write_reference(args.out, arrays, attrs)
            print(f"wrote {args.out}: " + ", ".join(f"{k} {v.shape}" for k, v in arrays.items()))
            return 0
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        n = cfg.environment.reference_events
        write_stream(args.out, env_cls, cfg.environment, args.seed, n, comm=comm if comm.size > 1 else None,
                     progress=not args.no_progress and sys.stderr.isatty() and comm.rank == 0)
    except (ConfigError, DataError, OSError) as e:
        print(f"sagips.data: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if comm.rank == 0:
        n_parts = min(comm.size, -(-n // STREAM_BLOCK_ROWS))  # ranks beyond the blocks write no part
        parts = f" (a virtual dataset joining {n_parts} part files beside it)" if comm.size > 1 else ""
        print(f"wrote {args.out}: {n} events{parts}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
