"""Train a SAGIPS GAN on every MPI rank; generator gradients are exchanged according to --mode.

    python -m sagips.run                                   # the paper's proxy 1D settings, one rank
    mpiexec -n 4 python -m sagips.run --config configs/proxy1d-quick.yaml --mode rma-arar-arar \\
        --set comm.inner_size=2 --output-dir runs/quick     # 4 ranks posing as 2 nodes x 2 GPUs
    python -m sagips.run --help-config                      # every config key, its default and meaning
    python -m sagips.run --help-config --config toy1d:quick # every key as this preset resolves it

Flow: config (validated before any work) -> MPI topology -> reference data (each rank reads or generates its own
share, sagips/io/shard.py) -> environment + networks on the rank's device -> Trainer.fit() -> run.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import socket
import sys
import time
import traceback

import sagips.comm  # noqa: F401  (sets the MPI thread level before mpi4py.MPI is imported)
from sagips.config import MODES, ConfigError, config_to_dict, describe, load, parse_set
from sagips.io import status
from sagips.io.status import now as _now
from sagips.io.status import write_run_json
from sagips.supervise import is_supervised

EXIT_USAGE = 2
BACKGROUND_READ_BYTES = 64 << 20  #: a rank's data file read runs in a thread, beside the imports, from this size


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sagips.run",
        description="Train SAGIPS (a GAN inverse-problem solver) with one generator replica and one discriminator "
                    "per MPI rank. Run it under mpiexec for several ranks.",
        epilog="Outputs in --output-dir: run.json (resolved config, layout, versions, timings), metrics.jsonl "
               "(losses and quality every train.log_every epochs), checkpoints/rank{R:04d}/epoch{E:07d}.pt "
               "(generator weights with time stamps). Exit status 2 means bad input (nothing was trained).")
    p.add_argument("--config", metavar="FILE", help="preset YAML (e.g. configs/proxy1d-quick.yaml), or ENV:NAME, a "
                   "preset that environment ENV ships (e.g. toy1d:quick); it only overrides the defaults, which are "
                   "the paper's proxy 1D settings (or the chosen environment's own defaults)")
    p.add_argument("--mode", choices=MODES, help="gradient exchange: ensemble (none), allreduce (synchronous "
                   "MPI_Allreduce), arar (one ring over all ranks), arar-arar (ring per node + leaders' ring every "
                   "comm.outer_every epochs), rma-arar-arar (the inner ring through MPI one-sided windows), hvd "
                   "(the paper's Horovod baseline: one data-parallel GAN, generator and critic gradients averaged, "
                   "all data)")
    p.add_argument("--epochs", type=int, metavar="N", help="training epochs (train.epochs)")
    p.add_argument("--output-dir", metavar="DIR", help="where outputs go (output_dir)")
    p.add_argument("--seed", type=int, metavar="S", help="base random seed (seed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key; VALUE is parsed as YAML, e.g. --set train.lr_g=1e-4 "
                        "--set environment.true_params=[2,-0.5,3,1,-0.5,4]; repeatable")
    p.add_argument("--ensemble-size", type=int, metavar="M", help="split the ranks into M independent runs "
                   "(ensemble.members), each in output_dir/member{m:03d}/")
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last "
                   "complete state")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in --output-dir (without it, "
                   "an output directory that holds a run is refused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (train.progress=false)")
    p.add_argument("--profile", action="store_true", help="named profiler ranges around the epoch, critic step, "
                   "generator step, data and exchange (train.profile=true): NVTX on CUDA, e.g. under "
                   "`nsys profile -t cuda,nvtx`, and torch.profiler.record_function on every device")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and exit; "
                   "with --config, --set or flags, the value each key would have in that run")
    return p.parse_args(argv)


def print_config_help(args: argparse.Namespace | None = None) -> None:
    """Every config key with its library default and each environment's own keys and defaults; with --config, --set
    or a flag, every key as that command line resolves it (the environment's `config_defaults` and the preset
    included), so that a user sees what a run would use."""
    from sagips.config import Config
    from sagips.environment import available

    flags = cli_flags(args) if args is not None else {}
    if args is not None and (args.config or args.set or args.resume or any(v is not None for v in flags.values())):
        base = saved_config(args.output_dir) if (args.resume and not args.config) else None  # as the run would
        cfg = load(args.config, args.set, flags, base=base)
        print("Config keys as this command line resolves them (* differs from the library's default):\n")
        for prefix, cls, values in (("", Config, cfg), ("environment.", type(cfg.environment), cfg.environment)):
            for key, default, help_ in describe(cls, prefix):
                value = values
                for part in key[len(prefix):].split("."):
                    value = getattr(value, part)
                mark = "*" if value != default else " "
                print(f"  {key:28s} {json.dumps(value, default=str):>12s}{mark} {help_}")
        return
    print("Config keys (set them in a --config YAML or with --set KEY=VALUE; add --config or --set to see the values a "
          "run would use):\n")
    for key, default, help_ in describe(Config):
        print(f"  {key:28s} {json.dumps(default):>12s}  {help_}")
    from sagips.environment import load_entry_point

    for name, ep in sorted(available().items()):
        try:
            env_cls = load_entry_point(ep)
        except ConfigError as e:  # a broken third-party package must not hide the others' keys
            print(f"\nskipped: {e}")
            continue
        presets = ", ".join(f"--config {name}:{p}" for p in sorted(env_cls.presets))
        print(f"\nenvironment.* for environment.name={name}" + (f" (presets: {presets})" if presets else "") + ":\n")
        for key, default, help_ in describe(env_cls.Config, "environment."):
            print(f"  {key:28s} {json.dumps(default):>12s}  {help_}")
        own = [f"{section}.{k}={json.dumps(v)}" for section, d in (env_cls.config_defaults or {}).items()
               for k, v in d.items()]
        if own:
            print(f"  defaults of its own, beneath any preset: {' '.join(own)}")


def cli_flags(args: argparse.Namespace) -> dict:
    """The config keys that the command line's flags set (None: not given)."""
    flags = {"mode": args.mode, "train.epochs": args.epochs, "output_dir": args.output_dir, "seed": args.seed,
             "ensemble.members": args.ensemble_size}
    if args.no_progress:
        flags["train.progress"] = False
    if args.profile:
        flags["train.profile"] = True
    return flags


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the installed version, without importing h5py (that costs every rank ~0.2 s of start-up)
        h5py_version = version("h5py")
    except PackageNotFoundError:
        h5py_version = None
    import mpi4py
    import numpy
    import torch
    from mpi4py import MPI

    import sagips

    return {"sagips": sagips.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "mpi4py": mpi4py.__version__, "h5py": h5py_version,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(), "cuda": torch.version.cuda}


def schedule_change(saved: dict, cfg, epoch: int) -> str:
    """What a resume with another train.epochs does to the learning rates' decay (lr0 * final ** ((e - 1) /
    (epochs - 1)): a pure function of the epoch and train.epochs), said beside the resume's line: '' where nothing
    changes (a new user extended a run and found its rate raised 1.6x, without a word)."""
    old = (saved.get("train") or {}).get("epochs")
    t = cfg.train
    g, d = t.lr_final, t.lr_final if t.lr_d_final is None else t.lr_d_final
    if not isinstance(old, int) or old == t.epochs or g == d == 1.0:
        return ""
    x = (epoch - 1) / max(1, t.epochs - 1) - (epoch - 1) / max(1, old - 1)
    rise = f"{g ** x:.2f}x" if g == d else f"{g ** x:.2f}x (the generator's), {d ** x:.2f}x (the critic's)"
    return (f": the learning rates' decay (train.lr_final) now spans {t.epochs} epochs, not {old}, so from here they "
            f"are {rise} those of the saved schedule (as a {t.epochs}-epoch run's are here)")


def check_output_dir(out_dir: str, resume: bool, overwrite: bool) -> None:
    """Never overwrite another run silently; --resume needs a run to continue; one job at a time (sagips.io.claim:
    this process holds the directory's lock until it exits)."""
    up = os.path.abspath(out_dir)
    while not os.path.isdir(up):  # (the directory, or the first of its parents that exists, must be a directory)
        if os.path.lexists(up):
            raise ConfigError(f"--output-dir {out_dir}: {up} is a file, not a directory; choose another --output-dir")
        up = os.path.dirname(up)
    from sagips.io.claim import claim

    if os.path.isdir(out_dir):  # (before what it holds is judged: a job in it is named as such; a directory that
        claim(out_dir)  # does not exist yet is created by the claim below, once the options are checked)
    has_run = os.path.exists(os.path.join(out_dir, "run.json")) or os.path.isdir(os.path.join(out_dir, "checkpoints"))
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    if resume and not os.path.exists(os.path.join(out_dir, "run.json")):
        raise ConfigError(f"--resume: {out_dir} holds no run (no run.json); start it without --resume")
    if has_run and not (resume or overwrite):
        state = os.path.isdir(os.path.join(out_dir, "state"))
        raise ConfigError(f"output directory {out_dir} already holds a run; "
                          + ("pass --resume to continue it, " if state else "it saved no training state to resume, so ")
                          + "--overwrite to replace it, or choose another --output-dir")
    claim(out_dir)  # (this process's second claim of a directory is a no-op)


#: the environment's settings that name files (made absolute at the start: a resume may start elsewhere)
PATH_KEYS = ("data_file", "heldout_file", "init_generator")


def absolute_paths(info: dict) -> dict:
    """run.json `info` of a run from before its config kept the data file absolute: its config with run.json's
    absolute data_file (resolved where that run started), in place; `info` returned."""
    env = (info.get("config") or {}).get("environment")
    if isinstance(env, dict) and isinstance(env.get("data_file"), str) and not os.path.isabs(env["data_file"]) \
            and info.get("data_file"):
        env["data_file"] = info["data_file"]
    return info


def saved_config(output_dir: str | None) -> dict:
    """--resume without --config continues with the config saved in the run's run.json."""
    if not output_dir:
        raise ConfigError("--resume needs --output-dir (the directory of the run to continue)")
    for cand in (os.path.join(output_dir, "run.json"), os.path.join(output_dir, "member000", "run.json")):
        if os.path.exists(cand):
            try:
                with open(cand) as fh:
                    cfg = absolute_paths(json.load(fh))["config"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"--resume: cannot read the config in {cand} ({e})") from None
            cfg.pop("output_dir", None)
            return cfg
    raise ConfigError(f"--resume: {output_dir} holds no run (no run.json); start it without --resume")


def check_resume_epoch(out_dir: str, epoch: int | None, epochs: int) -> None:
    """--resume needs a saved training state, at an epoch no later than train.epochs."""
    if epoch is None:
        raise ConfigError(f"--resume: {out_dir} holds no complete training state (state/ is missing or "
                          f"incomplete); start it again with --overwrite")
    if epoch > epochs:
        raise ConfigError(f"--resume: the run in {out_dir} is at epoch {epoch} already, beyond train.epochs={epochs} "
                          f"(--epochs); give --epochs {epoch} or more to continue it (its earlier checkpoints are in "
                          f"{os.path.join(out_dir, 'checkpoints')})")


def check_resumable(out_dir: str, cfg, world_size: int, baseline: str | None = None) -> dict:
    """The previous run.json, after checking that this run can continue it. baseline: the mode of a baseline that
    replaces the exchange (sagips.ddp's "ddp", which run.json records as ddp-gloo or ddp-nccl), else None."""
    try:
        with open(os.path.join(out_dir, "run.json")) as fh:
            prev = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--resume: cannot read {out_dir}/run.json ({e})") from None
    if prev.get("environment") != cfg.environment.name:
        raise ConfigError(f"--resume: {out_dir} holds a run of environment {prev.get('environment')!r}, "
                          f"not {cfg.environment.name!r}")
    if prev.get("world_size") != world_size:
        raise ConfigError(f"--resume: the run in {out_dir} had {prev.get('world_size')} ranks; "
                          f"resume it with the same number (mpiexec -n {prev.get('world_size')})")
    saved = str(prev.get("mode"))
    if baseline is not None and not saved.startswith(f"{baseline}-"):
        raise ConfigError(f"--resume: the run in {out_dir} used mode {saved!r}; resume it with python -m sagips.run")
    if baseline is None and saved != cfg.mode:
        raise ConfigError(f"--resume: the run in {out_dir} used mode {saved!r}; "
                          + (f"pass --mode {saved}" if saved in MODES else "resume it with python -m sagips.ddp"))
    return prev


def _check_nonclosure(cfg, env) -> None:
    """analysis.nonclosure per parameter names this environment's parameters (checked on every rank before training,
    not at the analysis after it): else a ConfigError, one line."""
    nc = cfg.analysis.nonclosure
    if isinstance(nc, dict):
        from sagips.analysis.stats import nonclosure_factors

        n = len(env.truth())
        try:
            nonclosure_factors(nc, env.parameter_names() or [f"r_{i}" for i in range(n)], n)
        except ValueError as e:
            raise ConfigError(str(e)) from None


#: settings whose value may be a mapping of names, compared whole by --resume (not a section to recurse into)
VALUE_MAPPINGS = ("analysis.nonclosure",)


def changed_settings(old: dict, new: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for every setting of `new` whose value differs from `old`'s (nested sections flattened; the
    output directory, which --resume names anyway, left out)."""
    out = []
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict) and f"{prefix}{k}" not in VALUE_MAPPINGS:
            out += changed_settings(old[k], v, f"{prefix}{k}.")
        elif k in old and old[k] != v and f"{prefix}{k}" != "output_dir":
            out.append(f"{prefix}{k}: {old[k]!r} -> {v!r}")
    return out


def _replace_old_outputs(r: _Run) -> None:
    """--overwrite: the previous run's outputs; --overwrite and --resume: the last job's or run's analysis (it
    describes outputs replaced now). Removed once every input is checked (_load_data and the builds raise the
    one-line errors of bad input), just before the first write: bad input leaves an existing run untouched."""
    import shutil

    from sagips.analysis import job

    if r.comm.rank == 0:
        from sagips.io.claim import stamp

        stamp()  # (the directory's lock names this job from here on)
    if r.args.overwrite and r.comm.rank == 0:
        clear_run(r.out_dir)
    if (r.args.overwrite or r.args.resume) and r.world.rank == 0:
        old = os.path.join(r.cfg.output_dir, job.ANALYSIS_DIR)
        if os.path.isdir(old) and not os.path.islink(old):  # (a stat, not a listing: test_fsops counts them)
            shutil.rmtree(old, ignore_errors=True)
    r.world.Barrier()  # (no rank writes into a directory being cleared)


def clear_run(out_dir: str) -> None:
    """--overwrite: remove the previous run's outputs (only the files SAGIPS writes)."""
    import shutil

    shutil.rmtree(os.path.join(out_dir, "checkpoints"), ignore_errors=True)
    shutil.rmtree(os.path.join(out_dir, "state"), ignore_errors=True)
    for name in ("run.json", "metrics.jsonl"):
        try:
            os.unlink(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass


def main(argv=None, peer=None) -> int:
    """`python -m sagips.run`. peer: a baseline that replaces the SAGIPS exchange (sagips.ddp.DDPPeer: wrap(comm, G,
    device) -> the wrapped generator, .mode for run.json, close()); None for SAGIPS itself."""
    args = parse_args(argv)
    status.mark(None)  # (a run before this one, in this process)
    if args.help_config:
        try:
            print_config_help(args)
        except ConfigError as e:
            print(f"sagips: error: {e}", file=sys.stderr)
            return 2
        return 0
    if argv is None:  # a command line (not a call from Python): under a launcher, name this rank if it dies
        from sagips.supervise import supervise

        supervise()  # before numpy, torch and MPI are loaded
    from mpi4py import MPI

    from sagips.io.claim import release_all
    from sagips.io.refdata import DataError

    world = MPI.COMM_WORLD
    try:
        return _main(args, world, peer)
    except (ConfigError, DataError) as e:
        if world.rank == 0:
            print(f"sagips: error: {e}", file=sys.stderr, flush=True)
        status.failed(f"{e}", every_rank_raised=True, aborts_job=False)  # (after training began: a first-epoch check)
        return EXIT_USAGE
    except Exception:
        abort_job(world)
        return 1
    except KeyboardInterrupt:  # Ctrl-C outside training (training saves a state and stops: exit 143)
        if not any(isinstance(e, KeyboardInterrupt) for e in _reported):  # (not the second Ctrl-C's, said in _fit)
            status.failed("interrupted (KeyboardInterrupt)")
            print(f"sagips: rank {world.rank}: interrupted (SIGINT) outside training, during start-up or the run's "
                  f"end", file=sys.stderr, flush=True)
        if argv is None:  # the command line (not main(argv) called from Python, which gets the exception)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # die by the signal, as an uncaught interrupt does, without
            os.kill(os.getpid(), signal.SIGINT)  # its traceback (a launcher then ends the job as before)
        raise
    finally:
        release_all()


_reported: list = []  # the error this rank printed (abort_job; MPI_Abort may return before the job is torn down)


def failure_line(error: BaseException) -> str:
    """The error's one line for run.json, with the operating system's error that caused it where a library wrapped
    one (torch.save on a full disk: 'RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...',
    caused by 'OSError: [Errno 28] No space left on device')."""
    line = (traceback.format_exception_only(error)[0].strip().splitlines() or [type(error).__name__])[0]

    def below(e: BaseException) -> BaseException | None:  # (what the traceback would show as its cause)
        return e.__cause__ if e.__cause__ is not None else None if e.__suppress_context__ else e.__context__

    cause, seen = below(error), 0
    while cause is not None and seen < 8:
        if isinstance(cause, OSError) and cause is not error and cause.strerror:
            return f"{line} (caused by {type(cause).__name__}: {cause.strerror})"
        cause, seen = below(cause), seen + 1
    return line


def abort_job(world) -> None:
    """One rank failed: print its traceback, naming the rank, and abort the whole job (never leave the others
    hanging in a collective). Call it from inside the `except` block that caught the error; a second call (the
    error raised on to main while MPI_Abort tears the job down) prints nothing again."""
    from sagips.trainer import NonFiniteError

    error = sys.exc_info()[1]
    if not any(e is error for e in _reported):
        _reported[:] = [error]
        sys.stderr.write(f"sagips: error: {error}\n" if isinstance(error, NonFiniteError) else  # (says it all)
                         f"sagips: rank {world.rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        status.failed(f"rank {world.rank}: {failure_line(error)}")
    if world.size > 1:
        time.sleep(0.5)  # let the launcher forward the traceback before MPI_Abort tears everything down
        world.Abort(1)


class _Run:
    """What the steps of one run share (filled in order by the steps of `_main`)."""

    def __init__(self, args: argparse.Namespace, world, peer):
        self.args, self.world, self.peer = args, world, peer
        self.phases: dict[str, float] = {}  # start-up phase -> seconds on this rank (run.json "startup")
        self._t = time.perf_counter()
        self.topo = self.exchange = self.agreement = self.node_data = self.split = self.batch_sized = None
        self.data_events: int | None = None  # events in the whole reference data set (run.json reference_data)

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self._t, 3)
        self._t = now


def _main(args: argparse.Namespace, world, peer=None) -> int:
    """One run, in named steps. peer: the torch-DDP baseline of `python -m sagips.ddp` (no SAGIPS exchange; see
    sagips/ddp.py), or None.

    The order of the end matters (issue 21, defect 1): `_fit` aborts the whole job on any error other than a
    requested stop, BEFORE `_clean_up` frees anything collectively (an RMA window, a communicator); only a requested
    stop and the normal end reach `_clean_up`."""
    r = _Run(args, world, peer)
    _configure(r)
    if r.nothing_to_do:
        if world.rank == 0:
            print(f"sagips: {args.output_dir} is complete at train.epochs={r.cfg.train.epochs}: nothing to resume "
                  f"(give a larger --epochs to train on)", file=sys.stderr, flush=True)
        return 0
    _place(r)
    _load_data(r)
    _build_trainer(r)
    _build_exchange(r)
    _describe(r)
    stopped = _fit(r)
    _clean_up(r)
    signal.signal(signal.SIGINT, r.sigint_before)  # (Ctrl-C in the run end's analysis interrupts again; SIGTERM
    # keeps asking the ended trainer to stop: the end finishes within a batch system's kill delay)
    if stopped is not None:
        _free_node_data(r)
        if r.is_root:  # every rank saved this epoch's state: run.json says where --resume will start
            r.run_info.update(status="stopped", stopped_at_epoch=r.state.epoch, end_time=_now())
            write_run_json(r.out_dir, r.run_info)
        print(f"sagips: rank {r.comm.rank}: {stopped}", file=sys.stderr, flush=True)
        return 143
    _finish(r)
    _free_node_data(r)
    return 0


def _configure(r: _Run) -> None:
    """The config (every rank validates the same input: the same error everywhere), the ensemble members' communicators,
    the output directory and, on --resume, the epoch that every rank holds."""
    from sagips.io.distribute import on_root  # (numpy: not at the top, which runs before the supervisor forks)
    from sagips.io.shard import agree

    args, world = r.args, r.world
    flags = cli_flags(args)
    base = on_root(world, saved_config, args.output_dir) if (args.resume and not args.config) else None
    # agreed: a config that one rank cannot load (a preset file or an environment package missing on one node) is
    # an error of every rank, not a rank that exits while the others wait in the next collective
    r.cfg = cfg = agree(world, lambda: load(args.config, args.set, flags, base=base), error=ConfigError)
    r.cfg = cfg = truth_of_the_data(r, cfg, flags, base)
    for key in PATH_KEYS:  # run.json's config names each file wherever the job started: --resume works from anywhere
        value = getattr(cfg.environment, key, None)
        if isinstance(value, str) and value and not os.path.isabs(value):
            setattr(cfg.environment, key, os.path.abspath(value))

    # ensemble members: independent runs in sub-communicators of the world
    r.members = members = cfg.ensemble.members
    if world.size % members:
        raise ConfigError(f"ensemble.members={members} (--ensemble-size) does not divide the number of ranks "
                          f"({world.size}): launch a multiple of {members} ranks, or choose a divisor of {world.size}")
    r.member = member = world.rank // (world.size // members)
    r.comm = comm = world.Split(color=member, key=world.rank) if members > 1 else world.Dup()
    r.out_dir = out_dir = os.path.join(cfg.output_dir, f"member{member:03d}") if members > 1 else cfg.output_dir
    if cfg.comm.inner_size > comm.size:
        raise ConfigError(f"comm.inner_size={cfg.comm.inner_size} is larger than the ranks of a run "
                          f"({comm.size}); use at most {comm.size}, or 0 for one group per node")
    for key in ("delay_ranks", "fail_ranks"):
        bad = [x for x in getattr(cfg.pipeline, key) if not 0 <= x < comm.size]
        if bad:
            raise ConfigError(f"pipeline.{key}: rank {bad[0]} does not exist in a run of {comm.size} ranks")

    def member_checks():  # (what may differ between ensemble members: agreed over the world below)
        if cfg.mode == "rma-arar-arar" and cfg.comm.inner_size and not cfg.comm.allow_cross_node_rma:
            # one-sided MPI across nodes has known hangs on Slingshot (docs/polaris.md): only on the user's word
            from sagips.comm.topology import groups_across_nodes, node_of_ranks

            across = groups_across_nodes(node_of_ranks(comm), cfg.comm.inner_size)
            if across:
                raise ConfigError(f"comm.inner_size={cfg.comm.inner_size} puts ranks of several nodes into "
                                  f"{len(across)} RMA group(s) (the first: ranks {across[0][0]}-{across[0][-1]}), "
                                  f"where one-sided MPI can hang (docs/polaris.md); use a size that keeps each group "
                                  f"on one node (0: one group per node), or set comm.allow_cross_node_rma=true to "
                                  f"take that risk")
        # the run's files are read by its rank 0 only, which shares what it found (or the error): file-system work
        # per rank must not grow with the ranks (400 ranks reading the same files on Lustre)
        on_root(comm, check_output_dir, out_dir, args.resume, args.overwrite)
        if members > 1 and world.rank == 0:  # the job's own directory, its analysis's (its member's claim made it)
            from sagips.io.claim import claim

            claim(cfg.output_dir)
        return (on_root(comm, check_resumable, out_dir, cfg, comm.size, r.peer.mode if r.peer else None)
                if args.resume else None)

    from sagips.io.refdata import DataError

    # agreed over the world: a member whose directory cannot be used fails the job, no other member waits for it
    r.prev_run = prev_run = agree(world, member_checks, error=(ConfigError, DataError))
    r.resume_from = None
    # what differs from the saved run (e.g. --resume --config with a preset or defaults that changed since the run
    # started): named once the resume has succeeded, so that a refused resume stays one line
    r.resume_changes = (changed_settings(absolute_paths(prev_run).get("config") or {}, config_to_dict(cfg))
                        if prev_run else [])
    if prev_run is not None:
        from sagips.io.state import agree_resume_epoch

        r.resume_from = agree_resume_epoch(comm, out_dir)  # (the newest epoch every rank holds, this rank's own)
        # agreed over the world: a member that cannot resume fails the job, no member waits for it
        agree(world, check_resume_epoch, out_dir, r.resume_from[0], cfg.train.epochs, error=ConfigError)
    # a job whose every run is complete at its epochs has nothing to resume: one line, not a start-up
    done = prev_run is not None and prev_run.get("status") == "complete" and r.resume_from[0] == cfg.train.epochs
    r.nothing_to_do = world.allreduce(int(not done)) == 0  # (every run of the job)
    if r.nothing_to_do:  # (its files, the job's analysis included, are left as they are)
        return
    resolved = ((prev_run or {}).get("precision") or {}).get("resolved")
    r.precision_kept = None
    if cfg.train.amp == "auto" and resolved in ("float32", "bf16", "fp16"):
        # a resumed run keeps the precision that its start resolved (a new probe could time it the other way), and
        # run.json keeps that start's record (its probe rounds) and the setting asked for
        cfg.train.amp = {"float32": "none"}.get(resolved, resolved)
        r.precision_kept = prev_run["precision"]
    world.Barrier()  # every rank has checked the output directory before anyone writes into it
    r.job = None
    if members > 1:  # the job's token: its members' run.json name it, so the last one to end analyses the job
        from sagips.analysis import job

        r.job = world.bcast(job.new_token() if world.rank == 0 else None, root=0)
    if prev_run is not None:
        from sagips.io.atomic import remove_stale_temps

        # half-written files of the killed run (the targets are intact): each rank in its own directories only
        own = [os.path.join(out_dir, d, f"rank{comm.rank:04d}") for d in ("state", "checkpoints")]
        if comm.rank == 0:
            own += [out_dir, os.path.join(out_dir, "state"), os.path.join(out_dir, "checkpoints")]
        stale = comm.reduce(sum(len(remove_stale_temps(d, recursive=False)) for d in own), root=0)
        if stale:
            print(f"sagips: --resume removed {stale} temporary file(s) left by an interrupted write",
                  file=sys.stderr, flush=True)
    world.Barrier()
    r.phase("config")


def truth_of_the_data(r: _Run, cfg, flags: dict, base: dict | None):
    """The config with the truth of its data file: a file that names its truth (attribute true_params, as `python -m
    sagips.data` writes it) was made at it, so it is the run's truth (run.json, the residuals, analyze's pulls),
    whatever environment.true_params say (they make generated data). A --set of environment.true_params that
    differs from the file's is a one-line error; so is a file's truth that the environment cannot take."""
    from sagips.io.distribute import on_root
    from sagips.io.refdata import DataError, file_truth

    data_file = getattr(cfg.environment, "data_file", None)
    current = getattr(cfg.environment, "true_params", None)
    if not data_file or current is None:
        return cfg
    found = on_root(r.world, file_truth, data_file)  # (rank 0 reads it, every rank gets it)
    if found is None:
        return cfg
    values, names = found
    # (a file of another environment: the run's may be the default, proxy1d, where environment.name was not set)
    other = ": is it a file of another environment? set environment.name to that one"
    if isinstance(current, dict):  # a ParametricEnvironment's: name -> value
        order = list(current)
        if len(values) != len(order):
            raise DataError(f"data file {data_file}: its true_params have {len(values)} values, environment "
                            f"{cfg.environment.name!r} has {len(order)} parameters ({', '.join(order)}){other}")
        names = names or order
        if sorted(names) != sorted(order):
            raise DataError(f"data file {data_file}: its true_params are for parameters {', '.join(names)}, "
                            f"environment {cfg.environment.name!r} has {', '.join(order)}{other}")
        truth: dict | list = {n: dict(zip(names, values))[n] for n in order}
        was = [float(current[n]) for n in order]
    else:  # (parameters without names, r_0, r_1, ...: a file that names others is another environment's)
        unnamed = [f"r_{i}" for i in range(len(current))]
        if len(values) != len(current) or (names and names != unnamed):
            raise DataError(f"data file {data_file}: its true_params have {len(values)} values"
                            + (f" (for {', '.join(names)})" if names else "")
                            + f", environment {cfg.environment.name!r} has {len(current)} parameters"
                            + (f" ({', '.join(unnamed)})" if names else "") + other)
        truth, was = list(values), [float(v) for v in current]
    now = list(truth.values()) if isinstance(truth, dict) else truth
    if all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(now, was)):
        return cfg
    shown = ", ".join(f"{v:.6g}" for v in now)
    for item in r.args.set:  # a --set that names a value of the truth: it must be the file's
        path, value = parse_set(item)
        if path[:2] != ["environment", "true_params"]:
            continue
        given = {path[2]: value} if len(path) > 2 else value
        pairs = (given.items() if isinstance(given, dict) and isinstance(truth, dict) else
                 zip(range(len(truth)), given) if isinstance(given, list) and isinstance(truth, list) else [])
        for key, v in pairs:
            try:
                differs = not math.isclose(float(v), truth[key], rel_tol=1e-9)
            except (TypeError, ValueError, KeyError, IndexError):
                differs = True  # (a --set the config would refuse anyway)
            if differs:
                how = "--true-params ..." if cfg.environment.name == "proxy1d" else "--set true_params..."
                raise ConfigError(f"{item.split('=', 1)[0].strip()} (--set) differs from the truth that data file "
                                  f"{data_file} was made at (true_params {shown}): drop the --set (a data file's "
                                  f"truth is the run's), or make the data at that truth (python -m sagips.data ... "
                                  f"{how})")
    try:
        cfg = load(r.args.config, [*r.args.set, f"environment.true_params={json.dumps(truth)}"], flags, base=base)
    except ConfigError as e:
        raise DataError(f"data file {data_file}: its true_params ({shown}) do not fit the run's config: {e}") from None
    if r.world.rank == 0:
        print(f"sagips: the truth is data file {data_file}'s true_params ({shown}), not environment.true_params "
              f"(those make generated data)", file=sys.stderr, flush=True)
    return cfg


def _place(r: _Run) -> None:
    """This rank's device and threads (from the ranks on its node), its seeds, and the environment's class."""
    from mpi4py import MPI

    node = r.world.Split_type(MPI.COMM_TYPE_SHARED, key=r.world.rank)
    local_rank = node.rank
    from sagips.trainer import affinity

    node_cpus = [set(c) for c in node.allgather(sorted(affinity()))]  # pinned per rank, or one shared set?
    node.Free()
    import torch

    from sagips.environment import get_environment
    from sagips.io.shard import agree
    from sagips.trainer import rank_seeds, set_threads

    # agreed: a node without CUDA (or without a driver) is an error of every rank, in one line
    r.device = agree(r.world, device_for, r.cfg, local_rank, error=ConfigError)
    r.threads = set_threads(r.cfg.train.threads, node_cpus)
    if r.device.type == "cpu":  # reuse freed activation memory instead of faulting in fresh pages every step
        from sagips.perf import retain_freed_memory

        retain_freed_memory()
    r.env_cls = get_environment(r.cfg.environment.name)
    averaged = 1 if independent_ranks(r) else r.comm.size
    r.env_cfg, r.batch = data_parallel_settings(r.cfg, r.env_cls, averaged)
    r.torch_seed, r.np_seed = rank_seeds(r.cfg.seed, r.member, r.comm.rank)
    torch.manual_seed(r.torch_seed)
    r.phase("imports")


def device_for(cfg, local_rank: int):
    """This rank's device (train.device), and the settings that need CUDA refused in one line where it has none."""
    from sagips import graph, precision
    from sagips.trainer import select_device

    device = select_device(cfg.train.device, local_rank)
    why = precision.unavailable(cfg.train.amp, device)
    if why:
        raise ConfigError(why)
    try:
        graph.resolve(cfg.train.cuda_graph, device, [])  # (what stands in the way on a CUDA device: at the first step)
    except graph.GraphCaptureError as e:
        raise ConfigError(str(e)) from None
    return device


def data_parallel_settings(cfg, env_cls, averaged: int) -> tuple[object, dict | None]:
    """The environment's config as this run uses it, and the batch record of run.json (None where the environment
    names no batch, Environment.batch_key). Mode hvd trains every rank on all the reference data (the paper's
    Horovod baseline: subset_fraction 1); train.split_batch divides the batch by the `averaged` ranks whose gradients
    are averaged (eq. 10). A changed copy: cfg keeps what the user asked for (run.json, and --resume derives the same
    again)."""
    import copy

    env_cfg = copy.copy(cfg.environment)
    if cfg.mode == "hvd" and hasattr(env_cfg, "subset_fraction"):
        env_cfg.subset_fraction = 1.0
    key = getattr(env_cls, "batch_key", None)
    if not key or not hasattr(env_cfg, key):
        if cfg.train.split_batch:
            raise ConfigError(f"train.split_batch: environment {cfg.environment.name!r} names no batch to split; set "
                              f"its Environment.batch_key to the field of its config that holds the batch per step")
        return env_cfg, None
    full = int(getattr(env_cfg, key))
    per_rank = full // averaged if cfg.train.split_batch else full
    if per_rank < 1:
        raise ConfigError(f"train.split_batch: environment.{key}={full} is smaller than the {averaged} ranks whose "
                          f"gradients are averaged; raise it to at least {averaged}, or drop train.split_batch")
    setattr(env_cfg, key, per_rank)
    return env_cfg, {"key": f"environment.{key}", "split": bool(cfg.train.split_batch), "requested": full,
                     "ranks_averaged": averaged, "per_rank": per_rank, "effective": per_rank * averaged}


def _load_data(r: _Run) -> None:
    """The reference data, without a byte of event data crossing MPI (issue 23, sagips/io/shard.py).

    A data file: world rank 0 reads its layout (names, shapes, attributes) and broadcasts it; every rank reads its
    own subset straight from the file (`data.subset`) and hands it to `attach_subset`. No file: every rank generates
    its own subset of the file that the seed would give (sagips/io/writer.py, `generate_subset`), or, where the
    environment has no `attach_subset` or no `reference_events`, all of the data, and keeps its random subset
    (`attach_data`). Environments without `attach_subset`, and
    generators too costly to run on every rank (`generate_per_rank = False`), keep the old way: world rank 0 loads or
    generates everything and broadcasts it. The subset is a pure function of `r.data_key` (saved in the states).
    With data.share=node, the ranks of a node hold one subset, the node's, in a shared window (`_load_node_subset`)."""
    from concurrent.futures import wait

    import numpy as np

    from sagips.environment import Environment
    from sagips.io import shard, writer
    from sagips.io.distribute import broadcast_arrays
    from sagips.io.refdata import DataError, read_reference

    cfg, env_cls = r.cfg, r.env_cls
    r.data_file = data_file = getattr(r.env_cfg, "data_file", None)
    fraction = float(getattr(r.env_cfg, "subset_fraction", 1.0))
    reads_own = env_cls.attach_subset is not Environment.attach_subset
    r.data_key = {"seed": cfg.seed, "member": r.member, "rank": r.comm.rank, "subset_fraction": fraction,
                  "share": cfg.data.share}
    generates_own = not data_file and reads_own and env_cls.generate_per_rank and writer.can_stream(r.env_cfg)
    r.split = split = data_split(r)
    if split is not None:  # (each check reads only what every rank has alike: all ranks raise, none waits)
        if split[2] < 2:
            raise ConfigError("ensemble.data=split: there is nothing to split the data among; give the job several "
                              "independent members (--ensemble-size M, or --mode ensemble on several ranks), or "
                              "drop ensemble.data=split")
        if not (reads_own and (data_file or generates_own)):
            raise ConfigError(f"ensemble.data=split: environment {cfg.environment.name!r} cannot keep a part of the "
                              f"data (it has no attach_subset, or generates all of its data on one rank); set "
                              f"environment.data_file (python -m sagips.data writes one), or ensemble.data=shared")
        if cfg.data.share == "node" and split[2] > r.members:
            raise ConfigError("ensemble.data=split with data.share=node: in --mode ensemble every rank learns from a "
                              "part of its own, which one shared window per node cannot hold; use data.share=rank")
        r.data_key["split"] = list(split[1:])
    if cfg.data.share == "node":
        _check_node_share(cfg, env_cls, data_file, reads_own, generates_own)
    pending = None
    if cfg.data.share != "node" and (generates_own or (data_file and reads_own)):
        # the rank's own rows, made in a thread while this one builds the environment (h5py's reads and numpy
        # release the GIL)
        if generates_own:
            # no file: the rank's subset of the file that `python -m sagips.data` would write with this seed,
            # generated block by block (only the blocks that hold the rank's rows; nothing is broadcast)
            n = int(r.env_cfg.reference_events)
            layout = writer.virtual_layout(env_cls, r.env_cfg, cfg.seed, n)
            # agreed: the parts of a split differ by a block, so a too-small subset can fail on some ranks only
            ranges = shard.agree(r.world, shard.subset_ranges, r.np_seed, layout, fraction, cfg.data.subset, split)
            pending = _in_background(lambda: writer.generate_subset(env_cls, r.env_cfg, cfg.seed, n, ranges)[0])
        else:
            layout, ranges = shard.plan_subset(r.world, data_file, env_cls.datasets, r.np_seed, fraction,
                                               cfg.data.subset, split)
            nbytes = int((ranges[:, 1] - ranges[:, 0]).sum()) * sum(env_cls.datasets.values()) * 4
            # a small read (under ~50 ms from the page cache) has nothing to hide behind, and a thread's reads cost
            # a few MB of allocator arena of their own (measured: +5-9 MB of peak memory)
            run = _in_background if nbytes >= BACKGROUND_READ_BYTES else _now_as_future
            pending = run(shard.read_subset, data_file, layout, ranges, env_cls.datasets)
    try:
        # agreed: an environment that fails on some ranks only (a file missing on one node) fails on every rank,
        # with its one line, instead of leaving the others waiting in the next collective
        r.env = env = shard.agree(r.world, lambda: env_cls(r.env_cfg, r.device, seed=r.torch_seed),
                                  error=(ConfigError, DataError))
    except BaseException:
        if pending is not None:
            wait([pending])  # the read ends before the error does: no thread left inside HDF5
        raise
    _check_nonclosure(r.cfg, env)
    if (data_file and reads_own) or generates_own:
        if cfg.data.share == "node":
            arrays, layout, ranges = _load_node_subset(r, fraction)
        else:  # a DataError of any rank's read (or blocks) is raised on every rank (no rank waits in a collective)
            arrays = shard.agree(r.world, pending.result)
        shard.agree(r.world, env.attach_subset, arrays, layout["attrs"], error=(ConfigError, DataError))
        shared = env.shared_state()
        if shared:
            env.set_shared_state(r.comm.bcast(shared, root=0))
        r.data_key.update(file=os.path.abspath(data_file) if data_file else None, layout=layout["checksum"],
                          subset=cfg.data.subset, rows=int((ranges[:, 1] - ranges[:, 0]).sum()))
        r.data_events = int(layout["rows"])
    elif not data_file and env_cls.generate_per_rank:
        arrays, attrs = env_cls.generate_reference(r.env_cfg, cfg.seed)
        env.attach_data(arrays, attrs, np.random.default_rng(r.np_seed))
        r.data_key.update(file=None, subset="rows")
        r.data_events = len(next(iter(arrays.values())))
    else:
        def make():
            if data_file:
                return read_reference(data_file, env_cls.datasets)
            return env_cls.generate_reference(r.env_cfg, cfg.seed)

        arrays, attrs = broadcast_arrays(r.world, make)
        env.attach_data(arrays, attrs, np.random.default_rng(r.np_seed))
        r.data_key.update(file=os.path.abspath(data_file) if data_file else None, subset="rows")
        r.data_events = len(next(iter(arrays.values())))
    del arrays
    # a batch that the config leaves to the data (events_per_sample=auto), from the events a rank keeps: nominal
    # (the same on every rank, and again on --resume), where the rows kept differ by a block between ranks
    parts = split[2] if split is not None else 1
    r.batch_sized = env.size_batch(max(1, round(fraction * r.data_events / parts)), cfg.train.ema,
                                   r.batch["requested"] if r.batch else None)
    r.phase("reference_data")


def independent_ranks(r: _Run) -> bool:
    """Do the run's ranks train independent GANs (--mode ensemble: no exchange, no peer)?"""
    return r.cfg.mode == "ensemble" and r.peer is None


def analyses_itself(r: _Run) -> bool:
    """Does rank 0 run sagips.analyze on this run at its end? Yes for a --mode ensemble run of several ranks that is
    not a member of a job (its ranks are independent members), unless ensemble.analyze=false. (A job of several
    members is analysed by its last member instead: sagips/analysis/job.py.)"""
    return independent_ranks(r) and r.members == 1 and r.world.size > 1 and r.cfg.ensemble.analyze


def data_split(r: _Run) -> tuple[int, int, int] | None:
    """ensemble.data=split: (seed, this rank's part, parts) for `shard.subset_ranges`, or None (shared data). The
    parts are the independent estimates: the members, and in --mode ensemble (no exchange) each rank of each."""
    if r.cfg.ensemble.data != "split":
        return None
    per_member = r.comm.size if independent_ranks(r) else 1
    index = r.member * per_member + (r.comm.rank if per_member > 1 else 0)
    return r.cfg.seed, index, r.members * per_member


def _now_as_future(fn, *args):
    """fn(*args) here and now, as a finished Future (what `_in_background` returns)."""
    from concurrent.futures import Future

    f = Future()
    try:
        f.set_result(fn(*args))
    except Exception as e:
        f.set_exception(e)
    return f


def _in_background(fn, *args):
    """fn(*args) in a worker thread: its Future (result() returns its value or raises its exception; the
    interpreter joins the thread at exit)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix="sagips-data")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


def _load_node_subset(r: _Run, fraction: float):
    """data.share=node: the node's one subset (keyed by the node's index, which joins the rank's data key) in the
    node's shared window, r.node_data (freed by `_free_node_data`); (its arrays, the layout, the node's ranges)."""
    from sagips.io import shard, writer
    from sagips.io.nodeshare import NodeData, split_nodes

    node, r.data_key["node"] = split_nodes(r.comm)
    seed = shard.node_seed(r.cfg.seed, r.member, r.data_key["node"])
    if r.data_file:
        layout, ranges = shard.plan_subset(r.world, r.data_file, r.env_cls.datasets, seed, fraction,
                                           r.cfg.data.subset, r.split)
        fill = shard.reader(r.data_file, layout, r.env_cls.datasets)
    else:  # the node's subset of the file that `python -m sagips.data` would write, generated by the node's ranks
        n = int(r.env_cfg.reference_events)
        layout = writer.virtual_layout(r.env_cls, r.env_cfg, r.cfg.seed, n)
        ranges = shard.agree(r.world, shard.subset_ranges, seed, layout, fraction, r.cfg.data.subset, r.split)
        fill = writer.generator(r.env_cls, r.env_cfg, r.cfg.seed, n)
    r.node_data = NodeData(node, ranges, r.env_cls.datasets, r.world, fill)
    return r.node_data.arrays, layout, ranges


def _check_node_share(cfg, env_cls, data_file, reads_own: bool, generates_own: bool) -> None:
    """data.share=node needs a data file, or an environment that generates its subset in blocks, and one that keeps
    the arrays it is given (no copy)."""
    if not data_file and not generates_own:
        raise ConfigError(f"data.share=node: environment {cfg.environment.name!r} cannot generate a node's share "
                          f"of its data without a file (it generates all of it on one rank); set "
                          f"environment.data_file (python -m sagips.data writes one), or data.share=rank")
    if not (reads_own and env_cls.keeps_arrays):
        raise ConfigError(f"data.share=node: environment {cfg.environment.name!r} copies the rows it is given "
                          f"(Environment.keeps_arrays is False), so a node's shared copy would save no memory; "
                          f"use data.share=rank")


def _build_trainer(r: _Run) -> None:
    """The networks, optimisers and precision; how the logged quality is gathered."""
    from sagips.comm import watchdog
    from sagips.trainer import Trainer

    cfg, comm = r.cfg, r.comm
    r.is_root = comm.rank == 0
    r.rma = cfg.mode == "rma-arar-arar"
    # rma-arar-arar never synchronises ranks outside the exchange: rank 0 logs its own generator only, and the other
    # ranks compute no quality at all (at 400 ranks, 399 would throw it away)
    local_quality = r.rma or comm.size == 1
    r.gathers_quality = not local_quality  # (a log epoch then waits for every rank: sagips/comm/stop.py)

    def gather_quality(q, epoch=-1):
        if local_quality:
            return [q]
        return watchdog.gather_json(comm, q, 0, timeout_s=cfg.comm.timeout_s or None, what="quality gather",
                                    epoch=epoch)

    r.trainer = Trainer(cfg, r.env, comm.rank, comm.size, r.out_dir, exchange=None, gather_quality=gather_quality,
                        is_root=r.is_root, share=lambda obj: comm.bcast(obj, root=0),
                        computes_quality=r.is_root or not local_quality,
                        decide=lambda make: r.world.bcast(make() if r.world.rank == 0 else None, root=0))
    r.trainer.data_key = r.data_key
    r.phase("networks_and_precision")


def _build_exchange(r: _Run) -> None:
    """The topology and the exchange of the mode (or the peer's wrapper); replicas start identical."""
    cfg, comm, trainer = r.cfg, r.comm, r.trainer
    if r.peer is not None:
        trainer.G = r.peer.wrap(comm, trainer.G, r.device)  # DDP broadcasts rank 0's weights at construction
    elif cfg.mode != "ensemble":
        from sagips.comm.modes import build_exchange
        from sagips.comm.topology import build_topology

        r.topo = build_topology(comm, cfg.comm.inner_size or None)
        broadcast_module(comm, trainer.G)  # replicas start identical
        timeout_s = cfg.comm.timeout_s or None
        r.exchange = build_exchange(cfg.mode, r.topo, trainer.grads.n, ring=cfg.comm.ring,
                                    outer_every=cfg.comm.outer_every, max_staleness=cfg.comm.max_staleness,
                                    timeout_s=timeout_s, outer_sync=cfg.comm.outer_sync)
        trainer.exchange = r.exchange
        if cfg.mode == "hvd":  # one data-parallel GAN: the critics start identical and average their gradients too
            broadcast_module(comm, trainer.D)
            trainer.d_exchange = build_exchange("allreduce", r.topo, trainer.d_grads.n, timeout_s=timeout_s)
        if cfg.comm.outer_sync == "weights":
            from sagips.comm.modes import WeightAverage

            trainer.average_weights = WeightAverage(r.topo.world, cfg.comm.outer_every, timeout_s)
    r.phase("exchange")


def _describe(r: _Run) -> None:
    """run.json (rank 0), the resumed state, the state marker and the stop agreement."""
    from sagips.io import refdata

    cfg, comm, trainer, env, out_dir = r.cfg, r.comm, r.trainer, r.env, r.out_dir
    n_params = sum(p.numel() for p in trainer.G.parameters())
    config = config_to_dict(cfg)
    if r.precision_kept is not None:
        config["train"]["amp"] = "auto"  # (what was asked for; the precision is the start's, below)
    r.run_info = run_info = {
        "sagips_run": 1, "status": "running", "output_dir": os.path.abspath(out_dir),
        "environment": cfg.environment.name, "mode": r.peer.mode if r.peer is not None else cfg.mode,
        "label": cfg.label, "world_size": comm.size, "ensemble_members": r.members, "member": r.member, "job": r.job,
        "config": config, "truth": env.truth(), "parameter_names": env.parameter_names(),
        # a data file of the user's that names no truth (measured data): env.truth() is only a placeholder
        "truth_known": refdata.truth_known(r.data_file) if r.is_root else None,
        "events_per_epoch": env.events_per_epoch, "batch": r.batch, "batch_sized": r.batch_sized,
        "reference_fraction": getattr(r.env_cfg, "subset_fraction", None),
        # how the ranks took their share (sagips/io/shard.py): rank 0's key, less what differs per rank; with
        # data.share=node, the size of rank 0's node window (every node holds as many rows) and the ranks sharing it
        "reference_data": {**{k: v for k, v in r.data_key.items() if k not in ("rank", "member", "node")},
                           "events": r.data_events,  # of the whole data set (rows: this rank's share)
                           **({"node_window_bytes": r.node_data.nbytes, "node_ranks": r.node_data.node.Get_size()}
                              if r.node_data is not None else {})},
        "n_critic": env.n_critic, "generator_params": n_params,
        "exchanged_floats": (trainer.grads.n if r.topo is not None else n_params if r.peer is not None else 0),
        "layout": (r.topo.describe() if r.topo is not None else
                   {"inner_size": 1, "groups": [[x] for x in range(comm.size)]}),
        "device": str(r.device), "threads_per_rank": r.threads,
        "hosts": sorted(set(comm.allgather(socket.gethostname()))),
        # rank -> host/pid: mpiexec, the OOM killer and system logs name processes by PID; this maps them to ranks
        # (supervisor_pid: the launched process that watches this rank's process, see sagips.supervise)
        "processes": [{"rank": x, "host": h, "pid": pid, "supervisor_pid": sup} for x, (h, pid, sup) in
                      enumerate(comm.allgather((socket.gethostname(), os.getpid(),
                                                os.getppid() if is_supervised() else None)))],
        "versions": versions(), "start_time": _now(),
        "data_file": os.path.abspath(r.data_file) if r.data_file else None,
        "cwd": os.getcwd(),  # where this start ran: the config's relative paths are relative to it
        "precision": r.precision_kept if r.precision_kept is not None else trainer.precision,
    }
    if r.prev_run is not None:
        from sagips.io.state import RankStates, load_state, state_path

        epoch0, mine = r.resume_from
        from sagips.io.shard import agree

        # a refused state (another data key: e.g. data.share, or a rank now on another node) may be refused on some
        # ranks only: every rank raises the first refusal, none waits in a later collective; the run's files are
        # touched only once it is accepted
        # (over the world: a job's members meet in world barriers next, so one member's refusal is every member's)
        agree(r.world, trainer.load_state_dict, load_state(out_dir, comm.rank, epoch0), error=ConfigError)
        for stale in (e for e in mine if e > epoch0):  # this rank's states from past the resumed epoch: written again
            os.unlink(state_path(out_dir, comm.rank, stale))
        trainer.states = RankStates(out_dir, comm.rank, [e for e in mine if e <= epoch0], complete=epoch0)
        changed = r.resume_changes
        if changed and r.is_root:
            print(f"sagips: --resume: {len(changed)} setting(s) differ from the saved run's, and this run uses the "
                  f"new value(s): {'; '.join(changed[:8])}{'; ...' if len(changed) > 8 else ''}", file=sys.stderr,
                  flush=True)
        if r.is_root:
            print(f"sagips: --resume: from epoch {epoch0} of {cfg.train.epochs}"
                  + schedule_change(r.prev_run.get("config") or {}, cfg, epoch0), file=sys.stderr, flush=True)
            truncate_metrics(os.path.join(out_dir, "metrics.jsonl"), epoch0)
        run_info["start_time"] = r.prev_run.get("start_time", run_info["start_time"])
        run_info["resumes"] = r.prev_run.get("resumes", []) + [{"epoch": epoch0, "time": _now()}]
    _replace_old_outputs(r)  # (every input checked, the resumed state accepted: the first write follows)
    if r.members > 1:
        trainer.progress_desc = f"{cfg.mode} member {r.member} of {r.members}"
    if r.is_root:  # state/latest.json: the newest epoch that every rank's state holds (from the ranks' reduction)
        from sagips.io.state import write_latest

        trainer.on_state_complete = lambda e: write_latest(out_dir, e, comm.size)
    # a failure of this rank is recorded in its run's run.json, and in the other members' (the abort ends them too)
    others = [os.path.join(cfg.output_dir, f"member{m:03d}", "run.json") for m in range(r.members) if m != r.member]
    if comm.size > 1:  # a SIGTERM seen by any rank stops every rank at the same epoch (sagips/comm/stop.py)
        from sagips.comm.stop import StopAgreement

        def syncs(epoch: int) -> bool:  # the epochs that wait for other ranks: a stop is learned before them
            if r.peer is not None:  # (a baseline's exchange: every epoch)
                return True
            return bool(r.exchange is not None and r.exchange.waits(epoch)) or (r.gathers_quality and
                                                                               trainer.logs_at(epoch))

        r.agreement = StopAgreement(comm, cfg.comm.timeout_s or None, syncs=syncs)
        trainer.stop_agreement = r.agreement
    r.phase("run_json")
    from sagips.perf import process_age_s

    # everything before the first epoch, from the launched process's start (interpreter and imports included)
    ages = comm.gather(process_age_s(is_supervised()), root=0)
    if r.is_root:
        known = [a for a in ages if a is not None]
        run_info["startup_s"] = round(max(known), 3) if known else None
        run_info["startup"] = {"rank0_phases_s": r.phases, "per_rank_s": ages,
                               "note": "process start to the first epoch; phases from the parsed command line"}
        write_run_json(out_dir, run_info)
    if r.world.size > 1:  # every member's run.json is written before any rank can fail into it (a rank that failed
        r.world.Barrier()  # at its first epoch, before its rank 0 wrote "running", left the run "running")
    status.mark(os.path.join(out_dir, "run.json"), r.is_root, others)
    if r.is_root:
        if r.member == 0:  # (one line per job: every member's is in its run.json)
            print(startup_line(run_info), file=sys.stderr, flush=True)
        if r.split is not None and r.member == 0 and float(run_info.get("reference_fraction") or 1.0) < 1.0:
            print(f"sagips: note: ensemble.data=split keeps environment.subset_fraction="
                  f"{run_info['reference_fraction']:g} of each part, so the members together use that fraction of "
                  f"the data; set environment.subset_fraction=1 to use every event once (docs/analysis.md)",
                  file=sys.stderr, flush=True)


def _fit(r: _Run):
    """Train. Returns the StopRequested of an agreed stop (SIGTERM, SIGUSR1, SIGINT), else None. Any other error is
    reported and aborts the job here, before `_clean_up`."""
    from sagips.checks import FirstEpochCheckError
    from sagips.trainer import StopRequested

    trainer = r.trainer

    first_int: list[float] = []

    def request_stop(signum, frame):  # PBS sends SIGTERM before it kills: finish the epoch, save, stop
        trainer.stop_requested = True
        if signum != signal.SIGINT:
            return
        # Ctrl-C: a second one interrupts at once. A rank gets each Ctrl-C more than once within milliseconds (the
        # terminal's process group, the launcher, the supervisor's forwarding): a second one counts after 1 s
        if first_int and time.monotonic() - first_int[0] > 1.0:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # (this Ctrl-C's own copies must not interrupt its report)
            raise KeyboardInterrupt
        if not first_int:
            first_int.append(time.monotonic())
            if r.world.rank == 0:
                print("\nsagips: Ctrl-C: every rank stops after an agreed epoch and saves its state (continue with "
                      "--resume); Ctrl-C again stops at once, without it", file=sys.stderr, flush=True)

    r.sigint_before = signal.getsignal(signal.SIGINT)  # (restored after _clean_up: Ctrl-C then interrupts again)
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # (SIGINT: Ctrl-C lost the epochs since the state)
        signal.signal(sig, request_stop)
    t0 = time.time()
    stopped = None
    try:
        r.state = trainer.fit(progress=r.member == 0)  # one bar per job (M bars garble one terminal line)
    except StopRequested as e:
        stopped, r.state = e, trainer.state
    except KeyboardInterrupt:  # the second Ctrl-C: no state, no traceback
        print(f"sagips: rank {r.world.rank}: interrupted again (Ctrl-C) in epoch {trainer.state.epoch + 1}: stopped "
              f"at once; --resume continues from the last saved state", file=sys.stderr, flush=True)
        status.failed("interrupted (Ctrl-C twice)")
        _reported[:] = [sys.exc_info()[1]]
        if r.world.size > 1:
            r.world.Abort(130)
        raise
    except FirstEpochCheckError:
        # the environment failed a first-epoch check (sagips.checks): every rank raised it at the same point, before
        # any exchange, so the collective clean-up is safe; main() prints the one line once and exits with status 2
        _free(r)
        _free_node_data(r)
        raise
    except BaseException:
        # Report and abort BEFORE any collective clean-up: freeing an RMA window or a communicator is collective,
        # so a failed rank that tried it would wait there for ranks that train on until the watchdog fires, and its
        # traceback would never be printed. Only a requested stop and the normal end free collectively.
        if r.world.size > 1:
            abort_job(r.world)  # does not return
        raise
    r.wall = time.time() - t0
    return stopped


def _clean_up(r: _Run) -> None:
    """After a normal end or an agreed stop only: complete the stop agreement's reductions (every rank posted the
    same ones), then free the exchange, the topology and the peer, collectively."""
    if r.agreement is not None:
        r.agreement.finish(r.state.epoch, r.trainer.states.newest)
        r.trainer.state_complete(r.agreement.complete)  # the final (or agreed stop) state is in the marker
        if r.agreement.signalled_at is not None:
            print(f"sagips: rank {r.comm.rank}: stop requested by a signal at the end of epoch "
                  f"{r.agreement.signalled_at}; every rank stops after epoch {r.agreement.target}",
                  file=sys.stderr, flush=True)
    _free(r)


def _free(r: _Run) -> None:
    if r.exchange is not None:
        r.exchange.free()
    if r.topo is not None:
        r.topo.free()
    if r.peer is not None:
        r.peer.close()


def _free_node_data(r: _Run) -> None:
    """data.share=node: free the node's window (collective over the node, the same point on every rank), after the
    environment's last use of the data (`_finish` may still evaluate it). The environment's views of the window
    (proxy1d's `data` tensor) are not used after this point."""
    if r.node_data is not None:
        r.node_data.free()


def _finish(r: _Run) -> None:
    """The run's final quality (every rank's generator), timings and summary in run.json, and the table."""
    from sagips.comm import watchdog

    cfg, comm, env, state, trainer = r.cfg, r.comm, r.env, r.state, r.trainer
    final_q = trainer.last_quality
    if r.rma and comm.size > 1:
        # the logged quality was rank 0's generator alone (see _build_trainer); the final one is the run's: every
        # rank's generator, combined as in the other modes (the ensemble mean of eq. 7), gathered once, after fit
        q = env.quality(trainer.G_eval, cfg.train.quality_samples)
        all_q = watchdog.gather_json(comm, q, 0, timeout_s=cfg.comm.timeout_s or None, what="final quality gather",
                                     epoch=state.epoch)
        final_q = env.combine_quality(all_q) if r.is_root else None
    train_s = comm.gather(state.time_s, root=0)
    walls = comm.gather(r.wall, root=0)
    stats = comm.gather(state.stats, root=0)
    if r.is_root:
        try:
            _report(r, final_q, train_s, walls, stats)
        except Exception:
            if comm.size > 1:  # the others wait for rank 0 below, without a timeout: never leave them waiting
                abort_job(r.world)
            raise
    # the other ranks wait for rank 0's end-of-run work (the convergence diagnostic estimates the data's information,
    # 10-30 s for a simulator of two columns) sleeping, not busy-polling in MPI's teardown: on a laptop with more
    # ranks than cores they would take the core from it. No timeout: a rank 0 that dies ends the job through its
    # supervisor (sagips/supervise.py), as it would in the teardown.
    watchdog.barrier(comm, timeout_s=math.inf, what="the end of the run")
    comm.Free()


def predicted_table(names, params) -> str:
    """The end of a run on measured data: the parameters it predicts, without a truth or residuals."""
    names = names or [f"r_{i}" for i in range(len(params))]  # (an environment that names none: proxy1d's r_i)
    w = max(9, *(len(n) for n in names))
    return "\n".join([f"  {'parameter':{w}s}  {'predicted':>12s}", "  " + "-" * (w + 14),
                      *(f"  {n:{w}s}  {float(p):+12.6g}" for n, p in zip(names, params))])


def _report(r: _Run, final_q, train_s, walls, stats) -> None:
    """Rank 0: run.json's summary, the convergence diagnostic and the table."""
    from sagips.io import refdata

    comm, env, state, trainer = r.comm, r.env, r.state, r.trainer
    r.run_info.update(status="complete", end_time=_now(), epochs=state.epoch, train_seconds=train_s,
                      wall_seconds=walls, exchange_stats=stats, final_quality=final_q,
                      # train.cuda_graph on rank 0: used or not, and why (sagips/graph.py)
                      cuda_graph=trainer.graphs.record() if trainer.graphs is not None else None)
    from sagips.analysis.ensemble import run_end_convergence  # is a parameter still moving? (issue 36)

    # a run that analyses itself gets analyze's diagnostic below: the data's information (10-30 s for a simulator)
    # is computed there once, not here too (and here, only if that analysis fails)
    itself = analyses_itself(r)
    conv = run_end_convergence(r.out_dir, r.run_info, final_q, env.parameter_names(), None if itself else env)
    if conv and not itself:  # (a run that analyses itself stores analyze's below, or its own with the floor)
        r.run_info["convergence"] = conv[0]
    short = short_run_note(r.cfg.train, state.epoch)
    if short:  # (kept for a script that reads run.json; printed below)
        r.run_info["short_run"] = short.removeprefix("sagips: note: ")
    write_run_json(r.out_dir, r.run_info)
    done = (f"\nsagips: {r.run_info['mode']} on {comm.size} rank(s), {state.epoch} epochs in {max(train_s):.1f} s "
            f"of training; outputs in {r.out_dir}")
    if r.members > 1 and r.cfg.ensemble.analyze:
        # one member of several: its own table and diagnostic are in its run.json; the job's p^ +- sigma follows
        # from the member that ends last (sagips/analysis/job.py)
        from sagips.analysis import job

        print(f"{done} (member {r.member} of {r.members})", flush=True)
        if short and r.member == 0:  # (one line per job)
            print(short, flush=True)
        job.job_result(r.cfg.output_dir, r.members, r.job, say=lambda m: print(m, flush=True))
        return
    # measured data of an environment that predicts parameters: the truth is a placeholder, no residual against it
    measured = r.run_info.get("truth_known") is False and bool(final_q) and "params" in final_q
    table = (predicted_table(env.parameter_names(), final_q["params"]) if measured else env.summary_table(final_q)) \
        if final_q else ""
    print(f"{done}; the table is the mean of all {comm.size} rank(s)' generators", flush=True)
    if table:
        print(table, flush=True)
    if measured:
        print(f"sagips: note: {refdata.NO_TRUTH}", flush=True)
    if short and conv:
        print(short, flush=True)
    if itself and conv:  # (no parameters logged, or one record: nothing to judge, no p^ +- sigma to quote)
        # independent ranks: the run's p^ +- sigma and its convergence diagnostic, sagips.analyze's (issue 36), which
        # run.json then keeps, as printed
        from sagips.analysis import job

        summary = job.run_result(r.out_dir, comm.size, say=lambda m: print(m, flush=True))
        groups = (summary or {}).get("groups") or [{}]
        if groups[0].get("convergence"):
            r.run_info["convergence"] = groups[0]["convergence"]
            write_run_json(r.out_dir, r.run_info)
            return
        conv = run_end_convergence(r.out_dir, r.run_info, final_q, env.parameter_names(), env)  # with the floor
        r.run_info["convergence"] = conv[0]
        write_run_json(r.out_dir, r.run_info)
    if conv:
        print(f"sagips: convergence ({conv[1]}):\n" + "\n".join("  " + c["message"] for c in conv[0]),
              flush=True)


def short_run_note(train, epochs: int) -> str:
    """A note beside the run end's convergence lines where the run is shorter than 10 windows of its weight average
    (train.ema): its rates decayed (train.lr_final) and its average lagged over a few hundred epochs, and it stops
    moving wherever it is (make run --epochs 300: max|r| 0.31, all six parameters 'converged'); '' otherwise."""
    if not 0.0 < train.ema < 1.0 or epochs >= 10.0 / (1.0 - train.ema):
        return ""
    decay = f" and its learning rates decayed to {train.lr_final:g} of their start" if train.lr_final < 1.0 else ""
    return (f"sagips: note: {epochs} epochs is short against the weight average's ~{1.0 / (1.0 - train.ema):.0f}-epoch "
            f"window (train.ema {train.ema:g}){decay}: a parameter that stopped moving may have stopped short of the "
            f"data's fit; train at least {10.0 / (1.0 - train.ema):.0f} epochs to measure (docs/analysis.md, \"a run "
            f"too short for its schedule\")")


def truncate_metrics(path: str, epoch: int) -> None:
    """Drop metrics records after the resumed epoch (they will be written again), atomically."""
    from sagips.io.atomic import write_text

    if not os.path.exists(path):
        return
    keep = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                if json.loads(line)["epoch"] <= epoch:
                    keep.append(line if line.endswith("\n") else line + "\n")
            except (json.JSONDecodeError, KeyError):
                break  # a torn last line
    write_text(path, "".join(keep))


def broadcast_module(comm, module) -> None:
    """Copy rank 0's parameters to every rank (as one flat float32 buffer)."""
    import torch
    from mpi4py import MPI

    with torch.no_grad():
        params = [p for p in module.parameters()]
        flat = torch.cat([p.detach().reshape(-1).cpu() for p in params]).contiguous()
        comm.Bcast([flat.numpy(), MPI.FLOAT], root=0)
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def startup_line(info: dict) -> str:
    """One line before the first epoch: what runs where, in which precision and why, and how long start-up took."""
    from sagips.precision import describe

    startup = f"{info['startup_s']:.1f} s" if info.get("startup_s") is not None else "n/a"
    sized = info.get("batch_sized")
    if sized and sized.get("ratio"):
        sized = (f"; events_per_sample auto: {sized['events_per_sample']} (the synthetic events of a "
                 f"{sized['window_epochs']:.0f}-epoch weight average: {sized['ratio']:.1f} x the "
                 f"{sized['events_kept']:,} events a rank keeps)")
    elif sized:
        sized = f"; events_per_sample auto: {sized['events_per_sample']} (no weight average, train.ema 0)"
    members = int(info.get("ensemble_members") or 1)
    where = (f"{members} members of {info['mode']} on {info['world_size']} rank(s) each" if members > 1
             else f"{info['mode']} on {info['world_size']} rank(s)")
    return (f"sagips: {where} ({info['device']}, "
            f"{info['threads_per_rank']} thread(s) each); {describe(info['precision'])}; start-up {startup}"
            f"{sized or ''}")


if __name__ == "__main__":
    sys.exit(main())
