"""Config: paper defaults, YAML presets, --set overrides, and one-line errors with exit status 2."""
import pytest

from sagips.config import Config, ConfigError, build_config, load, parse_set
from sagips.run import main
from tests._mpirun import ROOT, run_py


def test_defaults_are_the_papers():
    cfg = load(None)
    assert cfg.train.lr_g == 1e-5 and cfg.train.lr_d == 1e-4 and cfg.train.beta1 == 0.5
    assert cfg.train.epochs == 100_000 and cfg.comm.outer_every == 1000
    env = cfg.environment
    assert env.param_samples * env.events_per_sample == 102_400
    assert env.true_params == [2.1875, -0.5, 3.0, 1.09375, -0.5, 4.0]
    assert cfg.mode == "ensemble" and isinstance(cfg, Config)


@pytest.mark.parametrize("preset", ["proxy1d.yaml", "proxy1d-quick.yaml"])
def test_presets_load(preset):
    cfg = load(str(ROOT / "configs" / preset))
    assert cfg.environment.name == "proxy1d"
    # the quick preset carries the non-closure its calibration measured (docs/benchmarks/coverage.md); the paper's
    # preset, never calibrated, none
    assert cfg.analysis.nonclosure == (0.4 if preset == "proxy1d-quick.yaml" else 0.0)


def test_set_values_are_yaml():
    cfg = load(None, ["environment.true_params=[2,-0.5,3,1,-0.5,4]", "train.lr_g=1e-4", "comm.exchange_bias=true"])
    assert cfg.environment.true_params == [2.0, -0.5, 3.0, 1.0, -0.5, 4.0]
    assert cfg.train.lr_g == 1e-4 and cfg.comm.exchange_bias is True
    assert parse_set("a.b=[1, 2]") == (["a", "b"], [1, 2])


def test_a_whole_number_may_be_written_as_a_float():
    """`--set environment.reference_events=1e5` (YAML 1.1 reads `1e5` as a string), or 2.0e3: the integer meant;
    1.5, ten or inf are still one-line errors."""
    c = load(None, ["environment.reference_events=1e5", "train.epochs=2.0e3"])
    assert c.environment.reference_events == 100_000 and type(c.environment.reference_events) is int
    assert c.train.epochs == 2000 and type(c.train.epochs) is int
    for bad in ("1.5", "ten", "inf", ".nan", "1e400"):
        with pytest.raises(ConfigError, match="train.epochs: expected an integer, got"):
            load(None, [f"train.epochs={bad}"])


def test_yes_no_on_off_are_words_except_where_a_boolean_is_expected(tmp_path):
    """YAML 1.1 reads on/off/yes/no as booleans: a label `yes` became 'on', and `--set train.amp=no` was told it
    got 'off'. Config values read them as words (YAML 1.2: only true/false are booleans); a boolean key still takes
    them, from --set and from a file."""
    assert parse_set("label=yes") == (["label"], "yes") and parse_set("a=No") == (["a"], "No")
    assert parse_set("a=true") == (["a"], True) and parse_set("a=FALSE") == (["a"], False)
    cfg = load(None, ["label=yes", "train.progress=off", "comm.exchange_bias=Yes"])
    assert cfg.label == "yes" and cfg.train.progress is False and cfg.comm.exchange_bias is True
    with pytest.raises(ConfigError, match="train.amp: must be one of .*, got 'no'$"):
        load(None, ["train.amp=no"])
    f = tmp_path / "c.yaml"
    f.write_text("label: on\ntrain:\n  progress: no\n  fused_adam: on\n")
    cfg = load(str(f))
    assert cfg.label == "on" and cfg.train.progress is False and cfg.train.fused_adam is True


@pytest.mark.parametrize("sets, fragment", [
    (["train.lr_gg=1"], "train.lr_gg"),
    (["bogus=1"], "bogus"),
    (["environment.true_paramz=[1]"], "environment.true_paramz"),
    (["train.epochs=ten"], "train.epochs"),
    (["train.epochs=0"], "train.epochs"),
    (["train.epochs=1.5"], "train.epochs"),
    (["train.lr_g=-1e-4"], "train.lr_g"),
    (["comm.outer_every=0"], "comm.outer_every"),
    (["comm.outer_every=-5"], "comm.outer_every"),
    (["comm.ring=tree"], "comm.ring"),
    (["mode=horovod"], "mode"),
    (["environment.name=nope"], "environment.name"),
    (["environment.true_params=[1,2]"], "environment.true_params"),
    (["environment.true_params=[9,-0.5,3,1,-0.5,4]"], "environment.true_params[0]"),
    (["environment.subset_fraction=1.5"], "environment.subset_fraction"),
    (["train.progress=maybe"], "train.progress"),
    (["train=3"], "train"),
    (["analysis.nonclosure=-0.5"], "analysis.nonclosure"),
    (["analysis.nonclosure=much"], "analysis.nonclosure"),
])
def test_bad_values_name_the_key(sets, fragment):
    with pytest.raises(ConfigError) as exc:
        load(None, sets)
    msg = str(exc.value)
    assert fragment in msg and "\n" not in msg


def test_unknown_section_key_in_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epochs: 3\n  learning_rate: 1\n")
    with pytest.raises(ConfigError, match="train.learning_rate"):
        load(str(f))
    with pytest.raises(ConfigError, match="no such file"):
        load(str(tmp_path / "missing.yaml"))
    f.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(str(f))


def test_build_config_rejects_non_mapping_environment():
    with pytest.raises(ConfigError, match="environment"):
        build_config({"environment": 3})


@pytest.mark.parametrize("argv", [["--set", "train.nope=1"], ["--set", "comm.outer_every=0"],
                                  ["--config", "/nonexistent.yaml"],
                                  ["--set", "environment.data_file=/nonexistent.h5"]])
def test_cli_exits_2_before_work(argv, tmp_path, capsys):
    assert main(argv + ["--output-dir", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sagips: error:")
    assert not (tmp_path / "o" / "checkpoints").exists()


def test_cli_subprocess_exit_status_and_help():
    r = run_py(["-m", "sagips.run", "--set", "train.lr_g=abc"])
    assert r.returncode == 2 and "train.lr_g" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    h = run_py(["-m", "sagips.run", "--help"])
    assert h.returncode == 0
    for flag in ["--config", "--mode", "--epochs", "--output-dir", "--seed", "--set", "--resume", "--ensemble-size"]:
        assert flag in h.stdout
    c = run_py(["-m", "sagips.run", "--help-config"])
    assert c.returncode == 0 and "comm.outer_every" in c.stdout and "environment.true_params" in c.stdout


def test_help_config_shows_the_values_a_run_would_use(capsys):
    """With a preset, --set and a flag: every key as the run would have it, each change from the library's default
    marked; a bad value is the run's one-line error."""
    preset = str(ROOT / "configs" / "proxy1d-quick.yaml")
    assert main(["--help-config", "--config", preset, "--set", "train.lr_g=2e-4", "--epochs", "300"]) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln.split()[1] for ln in out.splitlines()[1:] if ln.strip()}
    want = load(preset, ["train.lr_g=2e-4"], {"train.epochs": 300})
    assert rows["train.lr_g"] == "0.0002*" and rows["train.epochs"] == "300*"
    assert rows["environment.reference_events"] == f"{want.environment.reference_events}*"
    assert rows["train.beta2"] == f"{want.train.beta2}*" and rows["seed"] == f"{Config().seed}"
    assert main(["--help-config", "--set", "train.lr_g=abc"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["sagips: error: train.lr_g: expected a number, got 'abc'"]


def test_resume_names_a_changed_nonclosure_mapping_whole():
    """--resume lists changed settings; analysis.nonclosure's mapping is one value, not a section: adding a name, or
    going from a number to a mapping, is a change it names."""
    from sagips.run import changed_settings

    old = {"analysis": {"nonclosure": {"r_0": 1.0}}, "train": {"epochs": 10}}
    assert changed_settings(old, {"analysis": {"nonclosure": {"r_0": 1.0, "r_3": 2.0}}, "train": {"epochs": 10}}) == [
        "analysis.nonclosure: {'r_0': 1.0} -> {'r_0': 1.0, 'r_3': 2.0}"]
    assert changed_settings({"analysis": {"nonclosure": 0.7}}, {"analysis": {"nonclosure": {"r_0": 1.0}}}) == [
        "analysis.nonclosure: 0.7 -> {'r_0': 1.0}"]
    assert changed_settings(old, {"train": {"epochs": 20}}) == ["train.epochs: 10 -> 20"]
