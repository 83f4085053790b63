"""Write reference data for an environment (HDF5).

    python -m sagips.data proxy1d --events 1000000 --out data/proxy1d.h5 \
        [--true-params 2.1875 -0.5 3 1.09375 -0.5 4] [--seed S]

    python -m sagips.data optigan --out data/optigan.h5 ...     (see python -m sagips.data optigan --help)

    python -m sagips.data ENV --out data/env.h5 [--events N] [--seed S] [--set true_params.a=1.5]...
                                                                # any other registered environment

proxy1d writes dataset `events` (N x 2, float32) with attributes `true_params` and `norms`; optigan writes
`photons` (N x 6) and `conditions` (N x 3), plus a held-out file beside it (docs/optigan.md). Any other environment
writes what its `generate_reference` returns (a ParametricEnvironment: `events`, N x event width, with attributes
`true_params` and `parameter_names`), configured by `--set` on its `environment:` keys.
"""
from __future__ import annotations

import argparse
import sys

from sagips.config import ConfigError, build_config, merge, parse_set


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sagips.data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="env", required=True, metavar="ENV")
    px = sub.add_parser("proxy1d", help="events (x ~ sigma1, x ~ sigma2) at the given true parameters")
    px.add_argument("--events", type=int, default=1_000_000, help="number of events (default 1,000,000)")
    px.add_argument("--out", required=True, metavar="FILE.h5", help="output HDF5 file (written atomically)")
    px.add_argument("--true-params", type=float, nargs=6, metavar="P", help="p0..p5 (default: the paper's truth)")
    px.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
    from sagips_environments.optigan.data import add_cli as add_optigan_cli

    add_optigan_cli(sub)  # `optigan`: its own options and handler (args.run)
    from sagips.environment import available

    for name in sorted(set(available()) - {"proxy1d", "optigan"}):  # every other environment, loaded only if chosen
        g = sub.add_parser(name, help=f"reference data of environment {name} at its configured truth")
        g.add_argument("--events", type=int, default=None, help="number of events (default: the environment's "
                       "reference_events)")
        g.add_argument("--out", required=True, metavar="FILE.h5", help="output HDF5 file (written atomically)")
        g.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
        g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an environment key, e.g. "
                       "--set true_params.a=1.5 (VALUE parsed as YAML); repeatable")
    args = p.parse_args(argv)
    if hasattr(args, "run"):
        return args.run(args)
    try:
        if args.events is not None and args.events < 1:
            raise ConfigError("--events: must be >= 1")
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
        cfg = build_config(raw)
    except ConfigError as e:
        print(f"sagips.data: error: {e}", file=sys.stderr)
        return 2
    from sagips.environment import get_environment
    from sagips.io.refdata import write_reference

    env_cls = get_environment(args.env)
    arrays, attrs = env_cls.generate_reference(cfg.environment, args.seed)
    write_reference(args.out, arrays, attrs)
    shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
    print(f"wrote {args.out}: {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
