"""Fuzz the config loader: any input either loads into a valid Config or raises ConfigError with ONE line.

Never another exception (a traceback is what `sagips.run` prints for a bug, exit 1 instead of 2), never a message
that spans lines. Three doors into the loader are fuzzed, in-process:
- `--set key=value` strings (keys: the real key set, section names, and junk; values: plausible values of the key's
  type, random YAML values, and raw text that YAML may turn into dates, binary, tags, or refuse);
- nested dicts as `base` (what `--resume` reads back from run.json) and as a YAML `--config` file;
- plus a property of every config that loads: its run.json form loads again into the same config (--resume needs it).

Deterministic (derandomize=True) so that the suite is stable; raise SAGIPS_FUZZ_EXAMPLES and set SAGIPS_FUZZ_RANDOM=1
to search further, e.g. SAGIPS_FUZZ_EXAMPLES=5000 SAGIPS_FUZZ_RANDOM=1 pytest tests/test_config_fuzz.py
"""
import functools
import json
import os
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import sagips.environment
from sagips.config import MODES, Config, ConfigError, build_config, config_to_dict, describe, load
from sagips.environment import get_environment

SETTINGS = settings(max_examples=int(os.environ.get("SAGIPS_FUZZ_EXAMPLES", "200")), deadline=None,
                    derandomize=not os.environ.get("SAGIPS_FUZZ_RANDOM"), database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

ENV = get_environment("proxy1d")
FIELDS = {k: d for k, d, _ in describe(Config)} | {k: d for k, d, _ in describe(ENV.Config, "environment.")}
SECTIONS = ["train", "comm", "pipeline", "ensemble", "environment"]
REAL_KEYS = sorted(FIELDS) + SECTIONS

# raw --set values that YAML turns into something surprising (or refuses)
TRICKY = ["2001-13-45", "2001-02-29", "2001-12-14t21:59:43.10-05:00", "!!timestamp 2020-99-99", "!!binary aGVsbG8=",
          "!!binary ???", "!!int x", "!!float y", "!!bool maybe", "!!python/object:os.system x", "!!set {a, b}",
          "!!omap [a: 1]", "!!str 1", "!!null x", "[1,", "{a: ", "&a [*a]", "*alias", "1e999", "-1e999", ".nan",
          ".inf", "0x1F", "0o17", "1_000", "1:20", "~", "yes", "off", "'", '"\\x"', "- a", "? a", "%TAG ! x", "---",
          "...", "1" + "0" * 400, "[1" + "0" * 400 + "]", "[" * 100, "{" * 50, "@", "`", "|", ">", "a: b: c",
          "\t", "\n", "x\ny", "[[1, 2], [3]]", "{a: [1, {b: 2}]}"]

# ------------------------------------------------------------------------------------------------- strategies
HUGE = st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 63, -(2 ** 63) - 1, 2 ** 1024])
scalars = st.one_of(st.none(), st.booleans(), st.integers(), HUGE, st.floats(), st.text(max_size=12))
yaml_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()), inner, max_size=3),
    max_leaves=8)


def plausible(key: str):
    """Values of the key's own type, often valid, often just out of range."""
    d = FIELDS.get(key)
    if isinstance(d, bool):
        return st.booleans()
    if isinstance(d, int):
        return st.one_of(st.integers(-3, 3000), HUGE)
    if isinstance(d, float):
        return st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1e-5, 1.0, 0.999999, 1e-300, 1e300]),
                         st.floats())
    if isinstance(d, str):
        return st.one_of(st.sampled_from(["auto", "cpu", "none", "bf16", "whole", "chunked", "bce", "mse", "x", "log",
                                          "proxy1d", "optigan", "", *MODES]), st.text(max_size=10))
    if isinstance(d, list):
        if d and isinstance(d[0], float):  # true_params & co: 6 numbers near the default
            return st.lists(st.floats(-6, 6), min_size=5, max_size=7) | st.just(list(d))
        return st.lists(st.integers(-2, 4), max_size=3)
    if d is None:  # data_file
        return st.one_of(st.none(), st.text(max_size=20))
    return yaml_values


junk_keys = st.one_of(
    st.text(max_size=15),  # anything, with dots, '=', spaces, newlines
    st.builds(lambda k, s: k + s, st.sampled_from(REAL_KEYS), st.sampled_from(["x", ".x", ".", "..x", " ", "\n", "_"])),
    st.builds(lambda k: "." + k, st.sampled_from(REAL_KEYS)),
)
keys = st.one_of(st.sampled_from(REAL_KEYS), st.sampled_from(REAL_KEYS), junk_keys)


def _to_yaml(v) -> str:
    try:
        return yaml.safe_dump(v, default_flow_style=True, width=10 ** 6, sort_keys=False).strip().removesuffix(
            "\n...").strip()
    except Exception:
        return json.dumps(v, default=str)


@st.composite
def set_items(draw) -> str:
    key = draw(keys)
    choice = draw(st.integers(0, 4))
    if choice <= 1:
        raw = _to_yaml(draw(plausible(key)))
    elif choice == 2:
        raw = _to_yaml(draw(yaml_values))
    elif choice == 3:
        raw = draw(st.sampled_from(TRICKY))
    else:
        raw = draw(st.text(max_size=20))
    return f"{key}={raw}" if draw(st.integers(0, 20)) else draw(st.sampled_from([key, raw, f"{key}:{raw}"]))


flags = st.fixed_dictionaries({}, optional={
    "mode": st.sampled_from(MODES), "train.epochs": st.integers(), "seed": st.integers(),
    "output_dir": st.text(max_size=10), "ensemble.members": st.integers(), "train.progress": st.just(False)})


@st.composite
def nested_dicts(draw) -> dict:
    """A (partial) config dict: real keys with plausible or random values, plus junk keys of any YAML type."""
    raw: dict = {}
    for key in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=6)):
        node, parts = raw, key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[parts[-1]] = draw(st.one_of(plausible(key), yaml_values))
    for _ in range(draw(st.integers(0, 2))):
        section = draw(st.sampled_from([None, *SECTIONS]))
        target = raw if section is None else raw.setdefault(section, {})
        if isinstance(target, dict):
            target[draw(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()))] = draw(yaml_values)
    if draw(st.integers(0, 9)) == 0:  # a section replaced by a scalar or a list
        raw[draw(st.sampled_from(SECTIONS))] = draw(yaml_values)
    return raw


# ------------------------------------------------------------------------------------------------- the contract
@pytest.fixture(scope="module", autouse=True)
def cached_registry():
    """Scanning the entry points costs ~15 ms per load(); the registry does not change during these tests."""
    original = sagips.environment.available
    sagips.environment.available = functools.cache(original)
    yield
    sagips.environment.available = original


def check(fn, *args, **kwargs) -> Config | None:
    """Call the loader; a ConfigError must be one line; anything else that escapes fails the test."""
    try:
        cfg = fn(*args, **kwargs)
    except ConfigError as e:
        msg = str(e)
        assert msg.strip(), "empty error message"
        assert "\n" not in msg and "\r" not in msg, f"multi-line error message: {msg!r}"
        return None
    assert isinstance(cfg, Config)
    assert isinstance(cfg.environment.name, str) and cfg.environment.name in ("proxy1d", "optigan")
    # --resume rebuilds the config from run.json: the JSON form must load into the same config
    again = build_config(json.loads(json.dumps(config_to_dict(cfg), default=str)))
    assert config_to_dict(again) == config_to_dict(cfg)
    return cfg


@SETTINGS
@given(st.lists(set_items(), max_size=5), flags)
@example(["environment.name=[1]"], {})
@example(["environment.name={a: 1}"], {})
@example(["seed=2001-13-45"], {})
@example(["train.lr_g=1" + "0" * 400], {})
@example(["environment.true_params=[1" + "0" * 400 + ",1,1,1,1,1]"], {})
@example(["train.lr_gg\n=1"], {})
@example(["train.lr_g=1e-4", "comm.outer_every=3", "environment.true_params=[2,-0.5,3,1,-0.5,4]"], {"mode": "arar"})
def test_set_overrides_load_or_fail_in_one_line(sets, flag_values):
    check(load, None, sets, flag_values)


@SETTINGS
@given(nested_dicts(), st.lists(set_items(), max_size=2))
@example({"train": {1: 2, "a": 3}}, [])
@example({"environment": {"name": ["proxy1d"]}}, [])
@example({"train": {"lr_g": 10 ** 400}}, [])
@example({"comm": {"outer_every": 5}, "train": {"epochs": 7}}, [])
def test_base_dicts_load_or_fail_in_one_line(raw, sets):
    """`base` is the config saved in a run.json (what --resume continues with), possibly edited by hand."""
    check(load, None, sets, base=raw)


@SETTINGS
@given(st.one_of(nested_dicts().map(lambda d: _to_yaml(d)), st.text(max_size=60),
                 st.lists(st.sampled_from(TRICKY + [f"{k}:" for k in SECTIONS] + ["  epochs: 3", "  lr_g: x",
                                                                                   "- 1", "train: 2001-13-45"]),
                          max_size=5).map("\n".join)))
@example("train:\n  1: 2\n  a: 3\n")
@example("seed: 2001-13-45\n")
@example("environment:\n  name: [proxy1d]\n")
def test_config_files_load_or_fail_in_one_line(text):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.yaml")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write(text)
        check(load, path)


@pytest.mark.parametrize("sets", [["train.epochs=3", "comm.outer_every=2", "mode=rma-arar-arar"],
                                  ["environment.true_params=[2,-0.5,3,1,-0.5,4]", "train.lr_final=0.5"]])
def test_fuzz_harness_accepts_valid_configs(sets):
    """The harness itself: valid input loads (so a loader that refuses everything would not pass the fuzz)."""
    assert check(load, None, sets) is not None
