"""Environments from third-party packages: broken entry points (skipped by --help-config, refused with one line when
chosen), environment keys without environment.name, presets that travel with an environment (ENV:NAME), its
config defaults, and ParametricEnvironment's config errors that name the parameter."""
import pytest

from sagips.config import ConfigError, load
from tests._mpirun import run_py
from tests._plugins import TOY_SRC, add_to_sys_path, pythonpath, toy_site, write_dist

BROKEN = {"broken_module": "sagips_no_such_module_xyz:Env", "broken_attr": "sagips_toy1d:NoSuchClass",
          "not_an_env": "sagips.config:Config"}


@pytest.fixture
def site(tmp_path, monkeypatch):
    paths = toy_site(tmp_path / "site")
    write_dist(tmp_path / "site", "sagips-broken", BROKEN)
    add_to_sys_path(paths, monkeypatch)
    return paths


@pytest.mark.parametrize("name, detail", [("broken_module", "ModuleNotFoundError"),
                                          ("broken_attr", "AttributeError"),
                                          ("not_an_env", "is not a subclass of sagips.Environment")])
def test_a_broken_entry_point_is_refused_with_one_line(site, name, detail):
    with pytest.raises(ConfigError) as e:
        load(None, [f"environment.name={name}"])
    msg = str(e.value)
    assert msg.startswith(f"environment {name!r}: its entry point {BROKEN[name]!r} from package 'sagips-broken'")
    assert detail in msg and "\n" not in msg


def test_help_config_skips_broken_entry_points(site, capsys):
    from sagips.run import print_config_help

    print_config_help()
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped:")]
    assert len(skipped) == 3 and all("package 'sagips-broken'" in line for line in skipped)
    assert "environment.name=proxy1d:" in out and "environment.* for environment.name=toy1d (presets: " \
        "--config toy1d:quick):" in out and "environment.true_params" in out
    # a ParametricEnvironment (toy1d): its own training defaults are listed beneath its keys
    assert "  defaults of its own, beneath any preset: train.epochs=2000 " in out


def test_broken_entry_point_from_the_command_line(tmp_path):
    paths = toy_site(tmp_path / "site")
    write_dist(tmp_path / "site", "sagips-broken", BROKEN)
    r = run_py(["-m", "sagips.run", "--set", "environment.name=broken_attr", "--output-dir", str(tmp_path / "o")],
               env=pythonpath(paths), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if line.strip()] == [
        "sagips: error: environment 'broken_attr': its entry point 'sagips_toy1d:NoSuchClass' from package "
        "'sagips-broken' cannot be loaded (AttributeError: module 'sagips_toy1d' has no attribute 'NoSuchClass'); "
        "fix or reinstall that package"]


def test_environment_keys_without_a_name(site):
    with pytest.raises(ConfigError, match=r"^environment keys without environment.name were read as proxy1d's "
                                          r"\(environment.true_params: expected 6 values, got 3\); set "
                                          r"environment.name to your environment$"):
        load(None, ["environment.true_params=[1.7,-0.4,0.9]"])
    assert load(None, ["environment.name=toy1d", "environment.true_params=[1.7,-0.4,0.9]"]).environment.name == "toy1d"


def test_presets_and_defaults_travel_with_the_environment(site):
    cfg = load("toy1d:quick", ["train.epochs=7"])
    assert cfg.mode == "rma-arar-arar" and cfg.environment.name == "toy1d" and cfg.train.epochs == 7
    assert cfg.train.lr_g == 1e-3 and cfg.train.lr_d == 1e-3 and cfg.comm.outer_every == 1  # its config_defaults
    # (a density keeps lr_g 1e-3: ParametricEnvironment.DENSITY_LR_G; a simulator's is 3e-4)
    plain = load(None, ["environment.name=toy1d", "train.lr_d=5e-4"])
    assert plain.train.lr_g == 1e-3 and plain.train.lr_d == 5e-4 and plain.train.epochs == 2000
    paper = load(None, [])  # proxy1d ships no defaults: the paper's settings
    assert paper.train.lr_g == 1e-5 and paper.train.epochs == 100_000
    with pytest.raises(ConfigError, match=r"^--config toy1d:fast: environment 'toy1d' ships no preset 'fast' "
                                          r"\(its presets: toy1d:quick\)$"):
        load("toy1d:fast")
    with pytest.raises(ConfigError, match=r"unknown environment 'nope' \(registered: .*toy1d.*\); a package of your "
                                          r"own registers it with an entry point in the group sagips.environments, "
                                          r"once installed \(pip install -e YOUR_PACKAGE, or pip install --target "
                                          r"DIR with DIR on PYTHONPATH\) where sagips runs, and sagips.analyze too") \
            as e:
        load("nope:quick")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key, value, message", [
    ("true_params.a", "5", r"^environment.true_params.a: 5.0 is outside the bounds \[0.5, 3.0\] of parameter a$"),
    ("true_params.d", "1", r"^environment.true_params.d: unknown parameter \(parameters: a, b, c\)$"),
    ("true_params", "[1, 2]", r"^environment.true_params: expected 3 values \(a, b, c\), got 2$"),
    ("true_params.b", "0", r"^environment.true_params.b: must be non-zero"),
    ("true_params.c", "x", r"^environment.true_params.c: expected a finite number, got 'x'$"),
    ("bounds.c", "[2, 1]", r"^environment.bounds.c: low must be < high, got \[2.0, 1.0\]$"),
    ("bounds.a", "[2.0, 3.0]", r"^the environment class's true_params\['a'\] \(environment.true_params.a not changed\): "
                               r"1.7 is outside the bounds \[2.0, 3.0\] of parameter a$"),
])
def test_parametric_config_errors_name_the_parameter(site, key, value, message):
    with pytest.raises(ConfigError, match=message):
        load(None, ["environment.name=toy1d", f"environment.{key}={value}"])


def test_partial_truth_and_bounds_keep_the_defaults(site):
    env = load(None, ["environment.name=toy1d", "environment.true_params.a=2.5", "environment.bounds.b=[-0.5,0.5]"])
    assert env.environment.true_params == {"a": 2.5, "b": -0.4, "c": 0.9}
    assert env.environment.bounds == {"a": [0.5, 3.0], "b": [-0.5, 0.5], "c": [0.1, 2.0]}


def test_class_definition_mistakes():
    from sagips import ParametricEnvironment

    with pytest.raises(TypeError, match="define exactly one of density"):
        class Neither(ParametricEnvironment):
            name = "n"
            parameters = {"a": (0.0, 1.0)}
            true_params = {"a": 0.5}
    with pytest.raises(TypeError, match="true_params: expected a mapping with the names of `parameters`"):
        class Mismatch(ParametricEnvironment):
            name = "m"
            parameters = {"a": (0.0, 1.0)}
            true_params = {"b": 0.5}

            def density(self, p, x):
                return p + x
    for attr, bad in (("event_width", 0), ("n_uniforms", 1.5), ("event_width", True)):
        with pytest.raises(TypeError, match=rf"BadWidth\.{attr}: expected a positive integer \(a class attribute\), "
                                            rf"got {bad!r}$"):
            type("BadWidth", (ParametricEnvironment,), {"name": "w", "parameters": {"a": (0.0, 1.0)},
                                                         "true_params": {"a": 0.5}, attr: bad,
                                                         "simulate": lambda self, p, u: u})
    # a reversed range: named at the class (it read 'environment.bounds.f: low must be < high', a key the user never
    # set, or 'density: negative or all-zero values' for a reversed support; a new user's trial)
    for attrs, msg in (({"support": (10.0, 0.0)}, r"Rev\.support: low must be < high, got \(10\.0, 0\.0\)$"),
                       ({"parameters": {"a": (0.95, 0.05)}},
                        r"Rev\.parameters\['a'\]: low must be < high, got \(0\.95, 0\.05\)$"),
                       ({"parameters": {"a": (0.0, float("inf"))}},
                        r"Rev\.parameters\['a'\]: expected \(low, high\), two finite numbers, got \(0\.0, inf\)$")):
        with pytest.raises(TypeError, match=msg):
            type("Rev", (ParametricEnvironment,), {"name": "r", "parameters": {"a": (0.0, 1.0)},
                                                    "true_params": {"a": 0.5}, **attrs,
                                                    "density": lambda self, p, x: p + x})


def test_toy_package_is_at_most_30_lines():
    lines = (TOY_SRC / "sagips_toy1d" / "__init__.py").read_text().splitlines()
    assert len(lines) <= 30
