"""The Polaris scripts against what PBS and PALS will do with them (issue 27, items 1-4).

- every `qsub` example in the scripts' comments and in docs/polaris.md, merged with the script's own #PBS
  directives, names a node count and a walltime that its queue accepts (ALCF's queue table, below);
- set_affinity_gpu.sh without a node-local rank fails with one line (no silent GPU 3 for every rank);
- env.sh names its venv after the loaded conda module and Cray MPICH, and rebuilds one whose stamp or interpreter
  no longer matches;
- ensemble.pbs sleeps 1 s between its background mpiexec launches (as ALCF's ensemble example does);
- the modes the scripts accept are sagips.config.MODES.
Issue 35: env.sh rebuilds an mpi4py that no longer imports (a fake broken one on PATH), with the compiler of the
PrgEnv, through ALCF's proxy inside a job, and says where torch, mpi4py and libmpi come from; every .pbs runs with a
short TMPDIR; MPICH_ASYNC_PROGRESS=1 gives torch 7 threads; scaling.pbs's node-hours, from its directives, are at most
the points' own.
Cheap: bash and a few dry runs, no mpiexec, no torch.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_launch import mpiexec_lines

ROOT = Path(__file__).resolve().parents[1]
POLARIS = ROOT / "launch" / "polaris"
PBS_SCRIPTS = sorted(POLARIS.glob("*.pbs"))
DOCS = ROOT / "docs" / "polaris.md"

# ALCF, "Running Jobs on Polaris" (https://docs.alcf.anl.gov/polaris/running-jobs/): the queues a user submits to,
# with node and walltime limits. `prod` is a routing queue: by node count a job goes to small, medium or large,
# each with its own walltime limit, so prod has one row per execution queue. A job is accepted when one row of its
# queue holds both its node count and its walltime.
#   queue            execution queue  min nodes  max nodes  min walltime  max walltime
QUEUE_LIMITS = [
    ("debug",         "debug",         1,   2,   "00:05:00", "01:00:00"),
    ("debug-scaling", "debug-scaling", 1,   10,  "00:05:00", "01:00:00"),
    ("prod",          "small",         10,  24,  "00:05:00", "03:00:00"),
    ("prod",          "medium",        25,  99,  "00:05:00", "06:00:00"),
    ("prod",          "large",         100, 496, "00:05:00", "24:00:00"),
]


def seconds(walltime: str) -> int:
    """PBS walltime ([[HH:]MM:]SS) in seconds."""
    parts = [int(x) for x in walltime.split(":")]
    assert 1 <= len(parts) <= 3, walltime
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return 3600 * h + 60 * m + s


def accepted_by(queue: str, nodes: int, walltime: str) -> str | None:
    """The execution queue that takes the job, or None when PBS would refuse it."""
    for q, execution, lo, hi, tmin, tmax in QUEUE_LIMITS:
        if q == queue and lo <= nodes <= hi and seconds(tmin) <= seconds(walltime) <= seconds(tmax):
            return execution
    return None


def test_queue_table_itself():
    """The checker refuses what ALCF refuses (so that the example test below can fail)."""
    assert accepted_by("debug", 2, "01:00:00") == "debug"
    assert accepted_by("debug", 2, "02:00:00") is None          # run.pbs's old example
    assert accepted_by("debug-scaling", 10, "03:00:00") is None  # scaling.pbs's old example
    assert accepted_by("debug", 3, "00:30:00") is None
    assert accepted_by("prod", 2, "00:30:00") is None            # prod starts at 10 nodes
    assert accepted_by("prod", 40, "03:00:00") == "medium"
    assert accepted_by("prod", 24, "06:00:00") is None           # small: 3 h
    assert accepted_by("prod", 100, "24:00:00") == "large"
    assert accepted_by("debug", 1, "00:04:00") is None           # 5 minutes at least


# ------------------------------------------------------------------------------------------ directives, examples
def directives(script: Path) -> dict:
    """queue, nodes (select=N) and walltime from the script's #PBS lines."""
    out = {}
    for line in script.read_text().splitlines():
        if not line.startswith("#PBS "):
            continue
        argv = shlex.split(line[len("#PBS "):])
        apply_options(out, argv, where=f"{script.name}: {line}")
    return out


# qsub options that take a value (PBS Pro). An option outside this list fails the test: the parser must not skip
# something that changes the queue, the nodes or the walltime.
_VALUE_OPTIONS = {"-A", "-q", "-l", "-v", "-N", "-k", "-j", "-o", "-e", "-W", "-J", "-r", "-m", "-M", "-P", "-S"}
_FLAG_OPTIONS = {"-V", "-h", "-z"}


def apply_options(job: dict, argv: list[str], where: str) -> list[str]:
    """Apply qsub options in argv to job (queue, nodes, walltime); returns the remaining operands."""
    operands, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in _FLAG_OPTIONS:
            i += 1
            continue
        if a in _VALUE_OPTIONS:
            assert i + 1 < len(argv), f"{where}: {a} without a value"
            value = argv[i + 1]
            if a == "-q":
                job["queue"] = value
            elif a == "-l":
                for res in value.split(","):
                    key, _, val = res.partition("=")
                    if key == "select":
                        job["nodes"] = int(re.match(r"(\d+)", val).group(1))
                    elif key == "walltime":
                        job["walltime"] = val
            i += 2
            continue
        assert not a.startswith("-"), f"{where}: qsub option {a} is not known to this test"
        operands.append(a)
        i += 1
    return operands


def _joined(lines: list[str]) -> list[str]:
    """Join backslash-continued lines."""
    out, cur = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    if cur:
        out.append(cur)
    return out


def _qsub_argv(line: str) -> list[str] | None:
    """The argv after `qsub` in a shell line (comments and everything before `qsub` dropped), or None."""
    m = re.search(r"(?:^|[\s;&|`(])qsub\s", line)
    if not m:
        return None
    return shlex.split(line[m.end():], comments=True)


def examples_in_script(script: Path) -> list[tuple[str, list[str]]]:
    """(the line, the qsub argv) of every qsub example in the script's comment header."""
    comments = [ln[1:].strip() for ln in script.read_text().splitlines()
                if ln.startswith("#") and not ln.startswith(("#PBS", "#!"))]
    found = []
    for line in _joined(comments):
        argv = _qsub_argv(line)
        if argv is not None and any(a.endswith(".pbs") for a in argv):
            found.append((line, argv))
    return found


def examples_in_docs(text: str) -> list[tuple[str, list[str]]]:
    """qsub commands in fenced code blocks, and inline code spans that submit a .pbs script."""
    found, in_block, block = [], False, []
    for line in text.splitlines():
        if line.startswith("```"):
            if in_block:
                for cmd in _joined(block):
                    argv = _qsub_argv(cmd)
                    if argv is not None and any(a.endswith(".pbs") for a in argv):
                        found.append((cmd, argv))
                block = []
            in_block = not in_block
            continue
        if in_block:
            block.append(line)
        else:
            for span in re.findall(r"`([^`]*qsub [^`]*\.pbs[^`]*)`", line):
                found.append((span, _qsub_argv(span)))
    return found


def check_example(line: str, argv: list[str]) -> str:
    job = {"queue": None, "nodes": None, "walltime": None}
    operands = apply_options({}, argv, where=line)  # find the script first
    scripts = [a for a in operands if a.endswith(".pbs")]
    assert len(scripts) == 1, f"{line!r}: one script expected, got {operands}"
    script = ROOT / scripts[0]
    assert script.is_file(), f"{line!r}: {scripts[0]} does not exist (submit from the repository root)"
    job.update(directives(script))       # the script's directives ...
    apply_options(job, argv, where=line)  # ... overridden by the command line
    assert None not in job.values(), f"{line!r}: incomplete job {job}"
    execution = accepted_by(job["queue"], job["nodes"], job["walltime"])
    assert execution, (f"PBS would refuse {line!r}: queue {job['queue']}, {job['nodes']} nodes, walltime "
                       f"{job['walltime']} (limits: {[r for r in QUEUE_LIMITS if r[0] == job['queue']]})")
    return execution


@pytest.mark.parametrize("script", PBS_SCRIPTS, ids=lambda p: p.name)
def test_qsub_examples_in_scripts_are_accepted(script):
    found = examples_in_script(script)
    assert found, f"{script.name} shows no qsub example"
    assert any(argv[-1].endswith(script.name) for _, argv in found)
    for line, argv in found:
        check_example(line, argv)


def test_qsub_examples_in_docs_are_accepted():
    found = examples_in_docs(DOCS.read_text())
    names = {Path(a).name for _, argv in found for a in argv if a.endswith(".pbs")}
    assert {"run.pbs", "ensemble.pbs", "scaling.pbs", "validate.pbs"} <= names, names
    queues = {check_example(line, argv) for line, argv in found}
    assert {"debug", "debug-scaling"} <= queues  # the short-queue examples are the ones that went wrong
    assert "docs.alcf.anl.gov/polaris/running-jobs" in DOCS.read_text()  # the table's source is cited


@pytest.mark.parametrize("script", PBS_SCRIPTS, ids=lambda p: p.name)
def test_script_directives_are_accepted(script):
    job = directives(script)
    assert accepted_by(job["queue"], job["nodes"], job["walltime"]), (script.name, job)


def test_validate_pbs_is_a_short_debug_job():
    job = directives(POLARIS / "validate.pbs")
    assert job["queue"] == "debug" and 1 <= job["nodes"] <= 2 and seconds(job["walltime"]) <= 15 * 60


def test_example_checker_catches_the_old_examples():
    """The examples of issue 27, item 1, as they were: the checker must refuse them."""
    for old in ("qsub -l select=2:system=polaris -q debug -v MODE=arar-arar,EPOCHS=2000 launch/polaris/run.pbs",
                "qsub -A MyProject -q debug-scaling -l select=10:system=polaris -v EPOCHS=1000 "
                "launch/polaris/scaling.pbs"):
        with pytest.raises(AssertionError, match="PBS would refuse"):
            check_example(old, _qsub_argv(old))


# --------------------------------------------------------------------------------------------- set_affinity_gpu.sh
def _bare_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "PMI_", "PALS_"))}
    env.pop("DRY_RUN", None)
    env.update(extra)
    return env


@pytest.mark.parametrize("dry", ["0", "1"])
def test_affinity_without_a_local_rank_fails_with_one_line(dry):
    r = subprocess.run([str(POLARIS / "set_affinity_gpu.sh"), "echo", "ran"], env=_bare_env(DRY_RUN=dry),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "ran" not in r.stdout and "CUDA_VISIBLE_DEVICES" not in r.stdout  # the program never started
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "PMI_LOCAL_RANK" in lines[0] and "PALS_LOCAL_RANKID" in lines[0]


def test_affinity_rejects_a_local_rank_that_is_not_a_number():
    r = subprocess.run([str(POLARIS / "set_affinity_gpu.sh"), "echo", "ran"],
                       env=_bare_env(PALS_LOCAL_RANKID="x"), capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "ran" not in r.stdout and len(r.stderr.strip().splitlines()) == 1


def test_affinity_runs_the_program_with_one_gpu():
    r = subprocess.run([str(POLARIS / "set_affinity_gpu.sh"), "sh", "-c", 'echo "gpu=$CUDA_VISIBLE_DEVICES"'],
                       env=_bare_env(PALS_LOCAL_RANKID="1"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "gpu=2", r.stderr


# ----------------------------------------------------------------------------------------------------------- env.sh
def env_sh(script: str, **env) -> subprocess.CompletedProcess:
    """Source env.sh under DRY_RUN=1 (no module, no venv) in bash, then run `script`."""
    base = _bare_env(DRY_RUN="1")
    for k in ("LOADEDMODULES", "CRAY_MPICH_VERSION", "PE_ENV", "SAGIPS_VENV", "SAGIPS_CONDA_MODULE"):
        base.pop(k, None)
    base.update(env)
    return subprocess.run(["bash", "-c", f'source "{POLARIS}/env.sh" >/dev/null && {script}'], env=base,
                          capture_output=True, text=True, timeout=30)


def test_env_sh_names_the_venv_after_the_module_and_the_pe():
    r = env_sh('sagips_venv_key; echo "$SAGIPS_VENV"', LOADEDMODULES="craype/2.7.20:cray-mpich/8.1.28:conda/2024-04-29",
               CRAY_MPICH_VERSION="8.1.28", PE_ENV="NVIDIA")
    assert r.returncode == 0, r.stderr
    key, venv = r.stdout.split()
    assert "conda-2024-04-29" in key and "cray-mpich-8.1.28" in key and "nvidia" in key
    assert venv == str(ROOT / ".venv-polaris" / key)
    # another module (ALCF changed the default on 2025-10-24) or another Cray MPICH: another venv
    r2 = env_sh("sagips_venv_key", LOADEDMODULES="cray-mpich/9.0.1:conda/2025-09-25", CRAY_MPICH_VERSION="9.0.1",
                PE_ENV="NVIDIA")
    assert r2.returncode == 0 and r2.stdout.strip() not in (key, "")
    assert "conda-2025-09-25" in r2.stdout and "cray-mpich-9.0.1" in r2.stdout


def test_env_sh_dry_run_prints_the_venv_it_would_use():
    r = env_sh("true", LOADEDMODULES="conda/2024-04-29", CRAY_MPICH_VERSION="8.1.28", PE_ENV="GNU")
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["bash", str(POLARIS / "env.sh")], capture_output=True, text=True, timeout=30,
                       env={**_bare_env(DRY_RUN="1"), "LOADEDMODULES": "conda/2024-04-29",
                            "CRAY_MPICH_VERSION": "8.1.28", "PE_ENV": "GNU"})
    assert r.returncode == 0, r.stderr
    assert ".venv-polaris/conda-2024-04-29_cray-mpich-8.1.28-gnu" in r.stdout


def test_env_sh_rebuilds_a_venv_whose_stamp_or_interpreter_changed(tmp_path):
    """sagips_venv_ok: the stamp names this key and the venv's interpreter still starts and loads mpi4py's
    extension (what a renamed libmpi breaks); anything else means: rebuild."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"

    def interpreter(target):  # the venv's python: here a wrapper around an interpreter that has (or lacks) mpi4py
        python.write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
        python.chmod(0o755)

    interpreter(sys.executable)
    (venv / ".sagips-venv").write_text("key=conda-A_cray-mpich-1\npython=/x\n")
    ok = 'sagips_venv_ok "$V" "$K" && echo ok || echo rebuild'
    assert env_sh(ok, V=str(venv), K="conda-A_cray-mpich-1").stdout.strip() == "ok"
    assert env_sh(ok, V=str(venv), K="conda-B_cray-mpich-1").stdout.strip() == "rebuild"   # module changed
    interpreter(tmp_path / "gone" / "python3")                                           # interpreter gone
    assert env_sh(ok, V=str(venv), K="conda-A_cray-mpich-1").stdout.strip() == "rebuild"
    interpreter(sys.executable)
    python.write_text(python.read_text().replace('"$@"', '-c "import sys; sys.exit(1)"'))  # mpi4py.MPI fails to load
    assert env_sh(ok, V=str(venv), K="conda-A_cray-mpich-1").stdout.strip() == "rebuild"
    assert env_sh(ok, V=str(tmp_path / "none"), K="conda-A_cray-mpich-1").stdout.strip() == "rebuild"


def test_env_sh_never_deletes_a_directory_it_did_not_build(tmp_path):
    mine = tmp_path / "not-a-venv"
    mine.mkdir()
    (mine / "precious").write_text("x")
    r = env_sh('sagips_remove_venv "$V"', V=str(mine))
    assert r.returncode != 0 and (mine / "precious").exists()
    assert "not a venv built by env.sh" in r.stderr


# ----------------------------------------------------------------------------------------------------- ensemble.pbs
def test_ensemble_hostfile_launches_are_one_second_apart():
    env = _bare_env(DRY_RUN="1", NODES="6", ENSEMBLE_SIZE="3", ENSEMBLE_LAUNCH="hostfile")
    for k in ("MODE", "EPOCHS", "OUT", "SAGIPS_ARGS"):
        env.pop(k, None)
    r = subprocess.run(["bash", str(POLARIS / "ensemble.pbs")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    kinds = []
    for line in r.stdout.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        argv = shlex.split(line)
        kinds.append("sleep 1s" if argv == ["sleep", "1s"] else Path(argv[0]).name)
    assert [k for k in kinds if k in ("mpiexec", "sleep 1s")] == \
        ["mpiexec", "sleep 1s", "mpiexec", "sleep 1s", "mpiexec"]
    text = (POLARIS / "ensemble.pbs").read_text()
    assert re.search(r"&\s*#.*\n(.*\n){0,3}.*sleep 1s", text) or "sagips_cmd sleep 1s" in text


# -------------------------------------------------------------------------------------------------------- common.sh
def test_scripts_accept_exactly_the_modes_of_sagips_run():
    from sagips.config import MODES

    r = subprocess.run(["bash", "-c", f'source "{POLARIS}/common.sh" 2>/dev/null; echo "$SAGIPS_MODES"'],
                       env=_bare_env(DRY_RUN="1", NODES="1"), capture_output=True, text=True, timeout=30)
    assert r.stdout.splitlines()[-1].split() == list(MODES), r.stderr


def test_every_pbs_runs_with_a_short_tmpdir(tmp_path):
    """ALCF's known issue "AF_UNIX path too long" under mpiexec: common.sh exports TMPDIR=/tmp before any mpiexec,
    whatever TMPDIR the job inherited, and refuses one too long for Python's sockets."""
    long_tmp = str(tmp_path / ("x" * 90))
    for script in PBS_SCRIPTS:
        code = [ln.strip() for ln in script.read_text().splitlines() if not ln.lstrip().startswith("#")]
        first_launch = next(i for i, ln in enumerate(code) if "mpiexec" in ln or "validate.py" in ln)
        assert code.index('source "$SAGIPS_ROOT/launch/polaris/common.sh"') < first_launch, script.name
        r = subprocess.run(["bash", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=30,
                           env=_bare_env(DRY_RUN="1", NODES="2", TMPDIR=long_tmp, ENSEMBLE_SIZE="2"))
        assert r.returncode == 0, (script.name, r.stderr)
        assert f"# {script.name}: TMPDIR=/tmp" in r.stdout.splitlines(), script.name
        r = subprocess.run(["bash", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=30,
                           env=_bare_env(DRY_RUN="1", NODES="2", SAGIPS_TMPDIR=long_tmp))
        assert r.returncode != 0 and "AF_UNIX path too long" in r.stderr and len(r.stderr.splitlines()) == 1


def test_async_progress_gives_torch_seven_threads():
    for script in PBS_SCRIPTS:
        for progress, want in (("1", ["train.threads=7"]), ("0", [])):
            r = subprocess.run(["bash", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=30,
                               env=_bare_env(DRY_RUN="1", NODES="2", ENSEMBLE_SIZE="2", RANKS="4",
                                             MPICH_ASYNC_PROGRESS=progress))
            assert r.returncode == 0, r.stderr
            lines = [ln for ln in r.stdout.splitlines() if "train.threads" in ln or "sagips.run" in ln
                     or "validate.py" in ln]
            assert lines, script.name
            for ln in lines:
                assert re.findall(r"train\.threads=\d+", ln) == want, (script.name, ln)


# -------------------------------------------------------------------------------- env.sh: mpi4py after a PE upgrade
FAKE_PYTHON = r"""#!/bin/bash
# A python for env.sh's tests. $FAKE/built exists once "pip" installed mpi4py; FAKE_MPI4PY=broken: the module's
# mpi4py (version 4.0.1) cannot load its libmpi, as after a PE upgrade; ok: it loads.
case "$1" in
-m)
    case "$2" in
    venv) mkdir -p "${@: -1}/bin"; : > "${@: -1}/bin/activate"; exit 0 ;;
    pip) echo "MPICC=${MPICC:-} https_proxy=${https_proxy:-} ${*:3}" >> "$FAKE/pip.log"
         [[ "$*" == *mpi4py* ]] && : > "$FAKE/built"; exit 0 ;;
    esac ;;
-c)
    if [[ "$2" == *"from mpi4py import MPI"* ]]; then
        if [[ -e "$FAKE/built" || "$FAKE_MPI4PY" == ok ]]; then
            [[ "$2" == *find_spec* ]] && printf '%s\n' "$FAKE_TORCH" "$FAKE/site/mpi4py/__init__.py"
            [[ "$2" == *Get_library_version* ]] && echo "${FAKE_MPI:-MPI VERSION    : CRAY MPICH version 9.0.1.2}"
            exit 0
        fi
        echo "ImportError: libmpi_nvidia.so.12: cannot open shared object file" >&2; exit 1
    fi ;;
esac
exit 0
"""


def _fake_tools(tmp_path, cc_says="nvc 25.9-0 64-bit target on x86-64 Linux"):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("python", "python3"):
        (bin_ / name).write_text(FAKE_PYTHON)
        (bin_ / name).chmod(0o755)
    (bin_ / "cc").write_text(f'#!/bin/sh\necho\necho "{cc_says}"\n')  # nvc: a blank line, then the version
    (bin_ / "cc").chmod(0o755)
    (tmp_path / "site").mkdir()
    return {"PATH": f"{bin_}:{os.environ['PATH']}", "FAKE": str(tmp_path), "PE_ENV": "NVIDIA",
            "FAKE_TORCH": str(tmp_path / "site" / "torch" / "__init__.py")}


def _pip_log(tmp_path) -> list[str]:
    log = tmp_path / "pip.log"
    return log.read_text().splitlines() if log.exists() else []


def test_env_sh_rebuilds_an_mpi4py_that_no_longer_imports(tmp_path):
    """The module's mpi4py is 4.x but no longer loads its libmpi (a PE upgrade): the import test, not the version,
    decides; mpi4py is built into the venv with the Cray wrapper; inside a job (SAGIPS_BUILD_IN_JOB=1) pip goes
    through ALCF's proxy."""
    fake = _fake_tools(tmp_path)
    venv = tmp_path / "venv"
    base = {k: v for k, v in _bare_env().items() if not k.lower().endswith("_proxy")}
    env = {**base, **fake, "FAKE_MPI4PY": "broken", "SAGIPS_VENV": str(venv), "PBS_JOBID": "123.polaris",
           "SAGIPS_BUILD_IN_JOB": "1", "PE_ENV": "NVHPC"}  # PrgEnv-nvhpc: Polaris's default PE
    r = subprocess.run(["bash", "-c", f'source "{POLARIS}/env.sh"'], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    pip = _pip_log(tmp_path)
    builds = [ln for ln in pip if "mpi4py" in ln]
    assert len(builds) == 1 and builds[0].startswith("MPICC=cc -shared https_proxy=http://proxy.alcf.anl.gov:3128")
    assert "--no-binary=mpi4py" in builds[0] and "--ignore-installed" in builds[0]
    assert any(ln.endswith(f"install -e {ROOT}") for ln in pip)     # sagips itself, without the mpich extra
    assert "key=" in (venv / ".sagips-venv").read_text() and "CRAY MPICH" in (venv / ".sagips-venv").read_text()
    assert "does not load" in r.stderr


def test_env_sh_keeps_an_mpi4py_that_imports(tmp_path):
    fake = _fake_tools(tmp_path)
    r = subprocess.run(["bash", "-c", f'source "{POLARIS}/env.sh"'], capture_output=True, text=True, timeout=60,
                       env={**_bare_env(), **fake, "FAKE_MPI4PY": "ok", "SAGIPS_VENV": str(tmp_path / "venv")})
    assert r.returncode == 0, r.stderr
    assert not [ln for ln in _pip_log(tmp_path) if "mpi4py" in ln]


def test_env_sh_builds_only_with_the_compiler_of_the_prgenv(tmp_path):
    fake = _fake_tools(tmp_path, cc_says="gcc (SUSE Linux) 12.3.0")
    r = subprocess.run(["bash", "-c", f'source "{POLARIS}/env.sh"'], capture_output=True, text=True, timeout=60,
                       env={**_bare_env(), **fake, "FAKE_MPI4PY": "broken", "SAGIPS_VENV": str(tmp_path / "venv")})
    assert r.returncode != 0 and not [ln for ln in _pip_log(tmp_path) if "mpi4py" in ln]
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert "cc is 'gcc (SUSE Linux) 12.3.0', not nvc of PrgEnv-nvidia" in errors[0]


def test_env_sh_says_where_torch_mpi4py_and_libmpi_come_from(tmp_path):
    fake = _fake_tools(tmp_path)
    env = {**fake, "FAKE_MPI4PY": "ok", "CONDA_PREFIX": str(tmp_path / "site"), "VIRTUAL_ENV": str(tmp_path / "venv")}
    r = env_sh("sagips_check_sources", **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"env.sh: torch from the conda module: {fake['FAKE_TORCH']}",
                                     f"env.sh: mpi4py from the conda module: {tmp_path}/site/mpi4py/__init__.py",
                                     "env.sh: MPI library: MPI VERSION    : CRAY MPICH version 9.0.1.2"]
    pip_torch = str(tmp_path / "venv" / "lib" / "torch" / "__init__.py")   # a CPU torch pip put into the venv
    r = env_sh("sagips_check_sources", **{**env, "FAKE_TORCH": pip_torch})
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not the conda module's" in r.stderr
    r = env_sh("sagips_check_sources", **{**env, "FAKE_MPI": "MPICH Version:      4.3.0"})  # the mpich wheel
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not Cray MPICH" in r.stderr


# ------------------------------------------------------------------------------------------------------- scaling.pbs
def test_scaling_pbs_node_hours_are_at_most_the_points_own():
    """Issue 35, item 5: the job holds select x walltime node-hours (its directives); its points, run side by side in
    waves of at most POINT_LIMIT_S each, must fit that walltime, and the job must cost no more than the same points
    as one job each (each its own select, the same limit and the same start-up allowance SETUP_S)."""
    job = directives(POLARIS / "scaling.pbs")
    job_node_s = job["nodes"] * seconds(job["walltime"])
    r = subprocess.run(["bash", str(POLARIS / "scaling.pbs")], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=_bare_env(DRY_RUN="1"))
    assert r.returncode == 0, r.stderr
    text = (POLARIS / "scaling.pbs").read_text()
    limit = int(re.search(r"POINT_LIMIT_S=\$\{POINT_LIMIT_S:-(\d+)\}", text).group(1))
    setup = int(re.search(r"SETUP_S=\$\{SETUP_S:-(\d+)\}", text).group(1))
    margin = int(re.search(r"^WAVE_MARGIN_S=(\d+)", text, re.M).group(1))  # launch steps + the agreed stop
    waves = {}   # wave -> node ranges
    for m in re.finditer(r"^# wave (\d+)/\d+: \S+ n=(\d+) on nodes (\d+)-(\d+) of (\d+)", r.stdout, re.M):
        w, n, a, b, total = map(int, m.groups())
        assert b - a + 1 == n // 4 and 1 <= a <= b <= total == job["nodes"]
        waves.setdefault(w, []).append(set(range(a, b + 1)))
    points = [p for ps in waves.values() for p in ps]
    assert len(points) == len(mpiexec_lines(r.stdout)) == 33
    for slices in waves.values():   # disjoint slices within a wave
        assert sum(map(len, slices)) == len(set().union(*slices))
    assert margin >= 20 and len(waves) * (limit + margin) + setup <= seconds(job["walltime"])  # fits its walltime
    one_job_each = sum(len(p) * (limit + setup) for p in points)
    assert job_node_s <= one_job_each, (job_node_s / 3600, one_job_each / 3600)
    assert job_node_s / 3600 <= 110    # docs/polaris.md: at most 108 node-hours (the old script asked for 300)


def test_a_node_file_with_repeated_hosts_counts_and_slices_each_node_once(tmp_path):
    """PBS may list a host once per rank slot: NNODES and the hostfile slices (scaling.pbs, ensemble.pbs) must read
    the same one-line-per-node list, in PBS's order."""
    nodes = [f"x3000c0s{i}b0n0" for i in (4, 1, 7)]
    nodefile = tmp_path / "nodes"
    nodefile.write_text("".join(f"{n}\n" * 4 for n in nodes))
    script = f'SAGIPS_ROOT={ROOT}; source {POLARIS / "common.sh"}; echo "N=$NNODES"; cat "$NODEFILE"'
    r = subprocess.run(["bash", "-c", script], env=_bare_env(DRY_RUN="1", PBS_NODEFILE=str(nodefile)),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = [x for x in r.stdout.splitlines() if not x.startswith("#")]
    assert out == ["N=3"] + nodes
    assert nodefile.read_text().count("\n") == 12  # PBS's own file is left as it is
