"""The launch scripts (launch/local.sh, launch/polaris/*): syntax, and what their dry runs would launch.

Every script has DRY_RUN=1, which prints the commands instead of running them and needs neither PBS nor modules.
These tests parse the printed mpiexec lines: the rank count and layout, the affinity wrapper, and the
`python -m sagips.run` argv, which must be accepted by sagips.run's own parser and config loader.
No mpiexec is started.
"""
from __future__ import annotations

import functools
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from sagips.config import MODES

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
POLARIS = LAUNCH / "polaris"
SCRIPTS = [LAUNCH / "local.sh", *sorted(POLARIS.glob("*.sh")), *sorted(POLARIS.glob("*.pbs"))]


def dry_run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run `script` with DRY_RUN=1 outside any PBS job (PBS_* removed unless given in `env`)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "PMI_", "PALS_"))}
    base.update({"DRY_RUN": "1", **env})
    for k in ("NODES", "MODE", "MODES", "RANKS", "EPOCHS", "OUT", "SAGIPS_ARGS", "ENSEMBLE_SIZE", "ENSEMBLE_LAUNCH"):
        if k not in env:
            base.pop(k, None)
    return subprocess.run(["bash", str(script), *args], cwd=ROOT, env=base, capture_output=True, text=True,
                          timeout=30)


def mpiexec_lines(out: str) -> list[list[str]]:
    """argv of every printed command line whose program is mpiexec (comment lines start with '#')."""
    lines = []
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        argv = shlex.split(line)
        if Path(argv[0]).name == "mpiexec":
            lines.append(argv)
    return lines


def split_launch(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(mpiexec options, program prefix before `-m sagips.run`, sagips.run argv)."""
    i = argv.index("-m")
    assert argv[i + 1] == "sagips.run", argv
    prefix = argv[1:i]
    # mpiexec options come first: '-n N', '--ppn 4', '--depth 8', '--cpu-bind depth', '--hostfile F'
    opts, j = {}, 0
    while j < len(prefix) and prefix[j].startswith("-"):
        opts[prefix[j]] = prefix[j + 1]
        j += 2
    return opts, prefix[j:], argv[i + 2:]


@functools.cache
def _load_config(config: str | None, sets: tuple[str, ...], flags: tuple) -> object:
    """Validate like sagips.config.load, except the `environment` section (its dataclass lives in the environment
    package, whose import pulls in torch: seconds; here only its keys' presence in a preset is checked)."""
    from sagips.config import Config, from_dict, load_yaml, merge, parse_set

    raw = load_yaml(str(ROOT / config)) if config else {}
    for item in sets:
        path, value = parse_set(item)
        merge(raw, path, value)
    for dotted, value in flags:
        if value is not None:
            merge(raw, dotted.split("."), value)
    env = raw.pop("environment", {}) or {}
    assert isinstance(env, dict) and env.get("name", "proxy1d") == "proxy1d"
    return from_dict(Config, raw)


def check_sagips_argv(run_argv: list[str]):
    """sagips.run's parser accepts the argv, the mode is valid, and the config + --set values validate."""
    from sagips.run import parse_args

    args = parse_args(run_argv)
    assert args.mode in MODES
    assert args.output_dir
    flags = (("mode", args.mode), ("train.epochs", args.epochs), ("seed", args.seed),
             ("ensemble.members", args.ensemble_size))
    _load_config(args.config, tuple(args.set), flags)  # raises ConfigError on an unknown key or a bad value
    return args


def check_polaris_line(argv: list[str], n_ranks: int):
    opts, program, run_argv = split_launch(argv)
    assert int(opts["-n"]) == n_ranks
    assert opts["--ppn"] == "4"
    assert opts["--depth"] == "8" and opts["--cpu-bind"] == "depth"
    assert Path(program[0]).name == "set_affinity_gpu.sh" and Path(program[0]).is_file()
    assert Path(program[1]).name.startswith("python")
    return opts, check_sagips_argv(run_argv)


# ------------------------------------------------------------------------------------------------------ syntax
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_bash_syntax(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_all_scripts_present_and_executable():
    names = {p.name for p in SCRIPTS}
    assert {"local.sh", "env.sh", "set_affinity_gpu.sh", "run.pbs", "ensemble.pbs", "scaling.pbs"} <= names
    for p in SCRIPTS:
        if p.suffix == ".pbs" or p.name in ("local.sh", "set_affinity_gpu.sh"):
            assert os.access(p, os.X_OK), p


@pytest.mark.parametrize("pbs", sorted(POLARIS.glob("*.pbs")), ids=lambda p: p.name)
def test_pbs_directives(pbs):
    text = pbs.read_text()
    for directive in ("#PBS -A PROJECT", "#PBS -q ", "#PBS -l walltime=", "#PBS -l filesystems=home:eagle",
                      "#PBS -k doe"):
        assert directive in text, directive
    assert "system=polaris" in text and "#PBS -l select=" in text
    assert "launch/polaris/env.sh" in text


# ------------------------------------------------------------------------------------------------------ run.pbs
@pytest.mark.parametrize("nodes", [None, "2", "100"])
def test_run_pbs_dry_run(nodes):
    env = {"NODES": nodes} if nodes else {}
    r = dry_run(POLARIS / "run.pbs", **env)
    assert r.returncode == 0, r.stderr
    (line,) = mpiexec_lines(r.stdout)
    n_nodes = int(nodes or 100)  # without NODES: the script's own select=100
    _, args = check_polaris_line(line, 4 * n_nodes)
    assert args.mode == "rma-arar-arar"
    assert args.output_dir.endswith("runs/dryrun")


def test_run_pbs_uses_pbs_nodefile_and_job_id(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("".join(f"x3000c0s{i}b0n0\n" for i in range(3)))
    r = dry_run(POLARIS / "run.pbs", "--set", "comm.ring=chunked", PBS_NODEFILE=str(nodefile),
                PBS_JOBID="123456.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov", PBS_O_WORKDIR=str(ROOT),
                MODE="arar-arar", EPOCHS="10", SAGIPS_ARGS="--seed 7 --set environment.true_params=[2,-0.5,3,1,-0.5,4]")
    assert r.returncode == 0, r.stderr
    (line,) = mpiexec_lines(r.stdout)
    opts, args = check_polaris_line(line, 12)
    assert opts["--hostfile"] == str(nodefile)
    assert args.output_dir == str(ROOT / "runs" / "123456")
    assert (args.mode, args.epochs, args.seed) == ("arar-arar", 10, 7)
    assert "comm.ring=chunked" in args.set and "environment.true_params=[2,-0.5,3,1,-0.5,4]" in args.set


def test_run_pbs_rejects_unknown_mode():
    r = dry_run(POLARIS / "run.pbs", NODES="2", MODE="ring")
    assert r.returncode != 0 and "unknown mode" in r.stderr


def test_env_sh_dry_run_changes_nothing():
    r = dry_run(POLARIS / "env.sh")
    assert r.returncode == 0, r.stderr
    assert "module load conda" in r.stdout and "--system-site-packages" in r.stdout
    text = (POLARIS / "env.sh").read_text()
    assert "MPICH_GPU_SUPPORT_ENABLED=0" in text and "MPICH_ASYNC_PROGRESS=1" in text
    assert 'pip install -e "$SAGIPS_ROOT"' in text and "[mpich]" not in text.replace('NOT ".[mpich]"', "")


# ------------------------------------------------------------------------------------------------- ensemble.pbs
def test_ensemble_pbs_split():
    r = dry_run(POLARIS / "ensemble.pbs", NODES="40", ENSEMBLE_SIZE="20")
    assert r.returncode == 0, r.stderr
    (line,) = mpiexec_lines(r.stdout)
    _, args = check_polaris_line(line, 160)
    assert args.ensemble_size == 20


def test_ensemble_pbs_hostfile_slices():
    r = dry_run(POLARIS / "ensemble.pbs", NODES="6", ENSEMBLE_SIZE="3", ENSEMBLE_LAUNCH="hostfile")
    assert r.returncode == 0, r.stderr
    lines = mpiexec_lines(r.stdout)
    assert len(lines) == 3
    dirs, seeds = set(), set()
    for line in lines:
        _, args = check_polaris_line(line, 8)
        dirs.add(args.output_dir)
        seeds.add(args.seed)
        assert args.ensemble_size is None
    assert len(dirs) == 3 and len(seeds) == 3  # distinct members: own directory, own seed
    slices = [ln for ln in r.stdout.splitlines() if ln.startswith("# sed -n")]
    assert [s.split("'")[1] for s in slices] == ["1,2p", "3,4p", "5,6p"]


def test_ensemble_pbs_rejects_size_that_does_not_divide():
    r = dry_run(POLARIS / "ensemble.pbs", NODES="2", ENSEMBLE_SIZE="3")
    assert r.returncode != 0 and "does not divide" in r.stderr


# -------------------------------------------------------------------------------------------------- scaling.pbs
def test_scaling_pbs_sweep():
    r = dry_run(POLARIS / "scaling.pbs", NODES="8")
    assert r.returncode == 0, r.stderr
    lines = mpiexec_lines(r.stdout)
    points = set()
    dirs = set()
    for line in lines:
        opts, args = check_polaris_line(line, int(line[line.index("-n") + 1]))
        n = int(opts["-n"])
        assert n % 4 == 0 and 4 <= n <= 32
        points.add((n, args.mode))
        dirs.add(args.output_dir)
        assert args.output_dir.endswith(f"{args.mode}-n{n:04d}")
        assert Path(opts["--hostfile"]).parent == Path(args.output_dir)
    expected = {(4, "ensemble")} | {(n, m) for n in (4, 8, 16, 32)
                                    for m in ("allreduce", "arar", "arar-arar", "rma-arar-arar")}
    assert points == expected
    assert len(lines) == len(expected) == len(dirs)  # one line per point, one directory per point
    slices = [ln.split("'")[1] for ln in r.stdout.splitlines() if ln.startswith("# sed -n")]
    sizes = [int(b) - int(a) + 1 for a, b in (x[:-1].split(",") for x in slices)]
    assert sorted(sizes) == sorted(n // 4 for n, _ in expected)  # N/4 nodes each (issue 35: side by side)


def test_scaling_pbs_default_reaches_the_job_size():
    r = dry_run(POLARIS / "scaling.pbs")  # select=100 -> up to 400 ranks
    assert r.returncode == 0, r.stderr
    ns = sorted({int(line[line.index("-n") + 1]) for line in mpiexec_lines(r.stdout)})
    assert ns == [4, 8, 16, 32, 64, 128, 256, 400]


def test_scaling_pbs_custom_points_and_bad_ranks():
    r = dry_run(POLARIS / "scaling.pbs", NODES="10", RANKS="4 40", MODES="arar", REFERENCE="0")
    assert r.returncode == 0, r.stderr
    assert sorted(int(x[x.index("-n") + 1]) for x in mpiexec_lines(r.stdout)) == [4, 40]
    r = dry_run(POLARIS / "scaling.pbs", NODES="2", RANKS="6")
    assert r.returncode != 0 and "multiple of 4" in r.stderr


# ----------------------------------------------------------------------------------------------------- local.sh
@pytest.mark.parametrize("n,g,expect_inner", [(None, None, 2), ("1", None, 1), ("8", "4", 4), ("3", "0", 0)])
def test_local_sh_dry_run(n, g, expect_inner):
    opts = (["-n", n] if n else []) + (["-g", g] if g else [])
    r = dry_run(LAUNCH / "local.sh", *opts, "--", "--mode", "rma-arar-arar", "--epochs", "5")
    assert r.returncode == 0, r.stderr
    (line,) = mpiexec_lines(r.stdout)
    i = line.index("-m")
    assert line[1] == "-n" and int(line[2]) == int(n or 4)
    args = check_sagips_argv(line[i + 2:])
    assert f"comm.inner_size={expect_inner}" in args.set
    assert (args.mode, args.epochs) == ("rma-arar-arar", 5)  # user arguments override the defaults


def test_local_sh_rejects_bad_group():
    r = dry_run(LAUNCH / "local.sh", "-n", "2", "-g", "3")
    assert r.returncode == 2


# ------------------------------------------------------------------------------------------ set_affinity_gpu.sh
@pytest.mark.parametrize("var", ["PMI_LOCAL_RANK", "PALS_LOCAL_RANKID"])
def test_affinity_maps_local_rank_to_one_gpu(var):
    seen = []
    for local_rank in range(8):
        r = dry_run(POLARIS / "set_affinity_gpu.sh", "python", "-c", "pass", **{var: str(local_rank)})
        assert r.returncode == 0, r.stderr
        first = r.stdout.split()[0]
        assert first.startswith("CUDA_VISIBLE_DEVICES=")
        seen.append(int(first.split("=")[1]))
    assert seen == [3, 2, 1, 0, 3, 2, 1, 0]  # reversed, as ALCF's script: cores 0-7 are closest to GPU 3
