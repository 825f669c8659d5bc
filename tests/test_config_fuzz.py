"""Property-based fuzzing of config files: whatever a file holds, the outcome is a valid config or a ConfigError
that names what was wrong; never another exception, never a traceback from deep inside."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from msprobe_lite.config import ConfigError, DebuggerConfig, load_config

TOP = ["task", "dump_path", "rank", "step", "level", "extra_info", "async_dump", "statistics", "tensor",
       "overflow_check"]
SELECTION = ["scope", "list", "data_mode"]
STATISTICS = SELECTION + ["summary_mode", "tensor_list"]

scalars = (st.none() | st.booleans() | st.integers(min_value=-10**20, max_value=10**20)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
index_items = (st.integers(min_value=-5, max_value=10**19) | st.from_regex(r"\s?[0-9]{1,20}\s?(-\s?[0-9]{1,20})?",
                                                                        fullmatch=True)
               | st.sampled_from(["", "-", "3-1", "a-b", "1-", "-1", "0x10", "1.5", "1e3", "٣"]) | json_values)
near_values = {
    "task": st.sampled_from(["statistics", "tensor", "overflow_check", "structure", "Statistics", "", "md5"])
    | json_values,
    "level": st.sampled_from(["L0", "L1", "mix", "debug", "l1", "L2"]) | json_values,
    "dump_path": st.sampled_from(["./dump_path", "", " ", "out/x", "a\0b"]) | json_values,
    "rank": st.lists(index_items, max_size=4) | json_values,
    "step": st.lists(index_items, max_size=4) | json_values,
    "extra_info": st.booleans() | json_values,
    "async_dump": st.booleans() | json_values,
    "statistics": st.dictionaries(st.sampled_from(STATISTICS + ["summary", "lst"]), json_values
                                  | st.lists(st.sampled_from(["all", "forward", "backward", "input", "output",
                                                              "statistics", "md5", "x", ""]), max_size=3),
                                  max_size=4) | json_values,
    "tensor": st.dictionaries(st.sampled_from(SELECTION + ["tensor_list"]), json_values, max_size=3) | json_values,
    "overflow_check": st.dictionaries(st.sampled_from(["overflow_nums", "nums"]),
                                      st.integers(min_value=-3, max_value=3) | json_values, max_size=2)
    | json_values,
}
near_configs = st.fixed_dictionaries({}, optional={**near_values, "stpe": json_values, "": json_values})


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "config.json"


def outcome(path, **overrides):
    """Load; the only allowed outcomes are a config or a ConfigError that explains itself."""
    try:
        config = load_config(path, **overrides)
    except ConfigError as error:
        text = str(error)
        assert error.problems and text.startswith("Invalid msprobe_lite config from ")
        assert all(f"{p.path}: got " in text and p.expected for p in error.problems)
        return None
    assert isinstance(config, DebuggerConfig)
    return config


# MSPROBE_FUZZ_EXAMPLES=20000 for a longer hunt; the suite's default keeps it to a few seconds
FUZZ = settings(max_examples=int(os.environ.get("MSPROBE_FUZZ_EXAMPLES", 150)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(json_values)
def test_any_json_value_as_the_file(config_file, value):
    config_file.write_text(json.dumps(value))
    outcome(config_file)


@FUZZ
@given(near_configs)
@example({"step": [0, "3-1"]})
@example({"step": [10**19]})
@example({"rank": ["  7 - 9 "], "step": [-1]})
@example({"overflow_check": {"overflow_nums": 0}, "task": "overflow_check"})
@example({"async_dump": True, "task": "tensor"})
@example({"statistics": {"data_mode": ["all", "all"]}})
def test_configs_near_the_valid_ones(config_file, value):
    config_file.write_text(json.dumps(value))
    config = outcome(config_file)
    if config is not None:   # a valid config survives its own round trip
        config_file.write_text(json.dumps(config.model_dump(mode="json")))
        assert load_config(config_file) == config
    unknown = {"stpe", ""} & set(value)
    if unknown:
        assert config is None


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@example(b"\xef\xbb\xbf{}")           # a byte-order mark
@example(b"\xff\xfe{\x00}\x00")        # UTF-16
@example(b"[" * 100_000)               # deeper than the JSON parser goes
@example(b'{"step": [NaN, Infinity]}')
@example(b'{"task": "statistics", "task": 5}')
def test_any_bytes_as_the_file(config_file, raw):
    config_file.write_bytes(raw)
    outcome(config_file)


@FUZZ
@given(near_values["task"], near_values["level"], near_values["dump_path"], near_values["step"])
def test_any_arguments_over_a_valid_file(config_file, task, level, dump_path, step):
    config_file.write_text("{}")
    overrides = {"task": task, "level": level, "dump_path": dump_path, "step": step}
    config = outcome(config_file, **{k: v for k, v in overrides.items() if v is not None})
    if config is not None:
        assert config.task == (task or "statistics") and config.level == (level or "L1")


def test_a_missing_file_or_a_folder_is_a_config_error(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(ConfigError, match="config_path"):
            load_config(path)
