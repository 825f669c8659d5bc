"""Tests of msprobe_lite.config and the ``msprobe-lite config`` commands (spec: shared/spec/config.md)."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msprobe_lite.cli import main
from msprobe_lite.config import DEFAULT_CONFIG_PATH, ConfigError, DebuggerConfig, IndexSet, config_schema, load_config

REPO = Path(__file__).resolve().parents[1]
TOP_KEYS = ["task", "dump_path", "rank", "step", "level", "extra_info", "async_dump", "statistics", "tensor",
            "overflow_check"]


def write(folder: Path, data, name: str = "config.json") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def error_of(folder: Path, data, **overrides) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(write(folder, data), **overrides)
    return caught.value


# ------------------------------------------------------------------------------------------ default config

def test_default_config_is_the_spec_sample():
    config = load_config()
    assert config == DebuggerConfig()
    assert config.model_dump(mode="json") == {
        "task": "statistics", "dump_path": os.path.join(os.getcwd(), "dump_path"),  # resolved when read
        "rank": [], "step": [], "level": "L1",
        "extra_info": True, "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics",
                       "tensor_list": []},
        "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
        "overflow_check": {"overflow_nums": 1},
    }
    assert config.step.everything and config.rank.everything and config.step.last is None


def test_packaged_and_root_config_json_are_identical():
    assert DEFAULT_CONFIG_PATH == REPO / "msprobe_lite" / "config.json"
    assert DEFAULT_CONFIG_PATH.read_bytes() == (REPO / "config.json").read_bytes()


def test_empty_object_gives_the_defaults(tmp_path):
    assert load_config(write(tmp_path, {})) == DebuggerConfig()


# ------------------------------------------------------------------------------------------ one test per rule

RULES = {
    "task": ({"task": "dump"}, "task: got 'dump'"),
    "level": ({"level": "L2"}, "level: got 'L2'"),
    "dump_path empty": ({"dump_path": ""}, "dump_path: got ''"),
    "dump_path not a string": ({"dump_path": 5}, "dump_path: got 5"),
    "extra_info is a bool, not a string": ({"extra_info": "true"}, "extra_info: got 'true'; expected true or false"),
    "async_dump is a bool, not an int": ({"async_dump": 1}, "async_dump: got 1; expected true or false"),
    "rank is a list": ({"rank": "0"}, "rank: got '0'"),
    "rank element": ({"rank": [0, -1]}, "rank[1]: got -1"),
    "scope has one name": ({"statistics": {"scope": ["a"]}}, "statistics.scope: got ['a']"),
    "scope has three names": ({"tensor": {"scope": ["a", "b", "c"]}}, "tensor.scope: got ['a', 'b', 'c']"),
    "scope name empty": ({"tensor": {"scope": ["", "b"]}}, "tensor.scope[0]: got ''"),
    # a range opens when its first call starts: a backward record's never did, and nothing was dumped
    "scope opens at a backward record": ({"statistics": {"scope": ["Module.fc2.Linear.backward.0", "b"]}},
                                         "statistics.scope[0]: got 'Module.fc2.Linear.backward.0'; expected the "
                                         "name of a forward record"),
    "scope opens at parameter gradients": ({"statistics": {"scope": ["Module.fc.Linear.parameters_grad.0", "b"]}},
                                           "statistics.scope[0]: got 'Module.fc.Linear.parameters_grad.0'"),
    "list item blank": ({"tensor": {"list": ["  "]}}, "tensor.list[0]: got '  '"),
    "list item not a string": ({"statistics": {"list": ["linear", 3]}}, "statistics.list[1]: got 3"),
    "list is a list": ({"statistics": {"list": "linear"}}, "statistics.list: got 'linear'; expected a list"),
    "data_mode item": ({"statistics": {"data_mode": ["forward", "fwd"]}},
                       "statistics.data_mode[1]: got 'fwd'; expected one of 'all', 'forward', 'backward', 'input', "
                       "'output'"),
    "data_mode empty": ({"tensor": {"data_mode": []}}, "tensor.data_mode: got []"),
    "data_mode duplicate": ({"tensor": {"data_mode": ["forward", "input", "forward"]}},
                            "tensor.data_mode[2]: got 'forward'"),
    "data_mode all not alone": ({"statistics": {"data_mode": ["all", "input"]}},
                                "statistics.data_mode: got ['all', 'input']"),
    "summary_mode": ({"statistics": {"summary_mode": "md4"}},
                     "statistics.summary_mode: got 'md4'; expected one of 'statistics', 'md5'"),
    "tensor_list item": ({"statistics": {"tensor_list": ["conv", ""]}}, "statistics.tensor_list[1]: got ''"),
    "tensor_list is a list": ({"statistics": {"tensor_list": "conv"}}, "statistics.tensor_list: got 'conv'"),
    "overflow_nums zero": ({"overflow_check": {"overflow_nums": 0}}, "overflow_check.overflow_nums: got 0"),
    "overflow_nums below -1": ({"overflow_check": {"overflow_nums": -2}}, "overflow_check.overflow_nums: got -2"),
    "overflow_nums bool": ({"overflow_check": {"overflow_nums": True}},
                           "overflow_check.overflow_nums: got True; expected an integer"),
    "overflow_nums float": ({"overflow_check": {"overflow_nums": 1.5}}, "overflow_check.overflow_nums: got 1.5"),
    "block is an object": ({"tensor": ["all"]}, "tensor: got ['all']; expected an object"),
    "async tensor needs a list": ({"task": "tensor", "async_dump": True}, "tensor.list: got []"),
}


@pytest.mark.parametrize("data, line", RULES.values(), ids=RULES.keys())
def test_each_rule_names_the_field_and_value(tmp_path, data, line):
    error = error_of(tmp_path, data)
    assert line in str(error)
    assert len(error.problems) == 1
    assert str(tmp_path / "config.json") in str(error).splitlines()[0]


def test_async_dump_is_fine_with_a_tensor_list_or_another_task(tmp_path):
    assert load_config(write(tmp_path, {"task": "tensor", "async_dump": True, "tensor": {"list": ["linear"]}}))
    assert load_config(write(tmp_path, {"task": "statistics", "async_dump": True}))


def test_a_key_given_twice_is_an_error(tmp_path):
    """JSON keeps the last value of a repeated key: an edit of the first one would do nothing, silently."""
    path = tmp_path / "twice.json"
    path.write_text('{"task": "statistics", "step": [0], "statistics": {"list": ["a"], "list": ["b"]}, "step": [1]}')
    text = str(pytest.raises(ConfigError, load_config, path).value)
    assert "step: got [[0], [1]]; expected the key once in its object" in text
    assert "statistics.list: got [['a'], ['b']]" in text  # with its object's path


def test_dump_path_that_is_a_file_is_an_error(tmp_path):
    existing = write(tmp_path, "x", name="a_file")
    assert f"dump_path: got {str(existing)!r}; expected a folder path" in str(
        error_of(tmp_path, {"dump_path": str(existing)}))
    assert load_config(write(tmp_path, {"dump_path": str(tmp_path)})).dump_path == str(tmp_path)
    # below a file no folder can be made: refused here, not an internal failure at the first step's write
    below = existing / "sub" / "dir"
    assert f"expected a folder path, but {str(existing)!r} on the way to it is a file" in str(
        error_of(tmp_path, {"dump_path": str(below)}))
    assert load_config(write(tmp_path, {"dump_path": str(tmp_path / "new" / "deeper")})).dump_path


def test_problem_fields(tmp_path):
    (problem,) = error_of(tmp_path, {"statistics": {"data_mode": ["all", "fwd"]}}).problems
    assert (problem.path, problem.value) == ("statistics.data_mode[1]", "fwd")
    assert "'forward'" in problem.expected


def test_messages_carry_no_pydantic_jargon(tmp_path):
    text = str(error_of(tmp_path, {"task": 1, "stpe": [], "tensor": 3, "statistics": {"scope": "a"}}))
    for jargon in ("pydantic", "http", "Input should", "extra_forbidden", "Value error"):
        assert jargon not in text


# ------------------------------------------------------------------------------------------ unknown keys

def test_unknown_top_level_key(tmp_path):
    (problem,) = error_of(tmp_path, {"stpe": [1]}).problems
    assert problem.path == "stpe"
    assert all(repr(key) in problem.expected for key in TOP_KEYS)
    assert "did you mean 'step'" in problem.expected


def test_unknown_nested_key(tmp_path):
    (problem,) = error_of(tmp_path, {"statistics": {"scop": []}}).problems
    assert problem.path == "statistics.scop"
    assert "'summary_mode'" in problem.expected and "did you mean 'scope'" in problem.expected
    (problem,) = error_of(tmp_path, {"tensor": {"summary_mode": "md5"}}).problems  # only statistics has it
    assert problem.path == "tensor.summary_mode"


@pytest.mark.parametrize("key,block", [("summary_mode", "'statistics'"), ("overflow_nums", "'overflow_check'"),
                                       ("tensor_list", "'statistics'"), ("scope", "'statistics' and 'tensor'")])
def test_a_block_setting_written_at_the_top_says_its_block(tmp_path, key, block):
    """`summary_mode` at the top level: the known keys were listed with no word of where it belongs (a trial);
    `overflow_nums` got "did you mean 'overflow_check'?", which leads to a type error (a review)."""
    (problem,) = error_of(tmp_path, {key: 1}).problems
    assert problem.path == key
    assert problem.expected.endswith(f"; {key!r} is a setting of {block}: write it inside that block")


@pytest.mark.parametrize("config,path,meant", [({"level": "l1"}, "level", "L1"), ({"level": "MIX"}, "level", "mix"),
                                               ({"task": "statistic"}, "task", "statistics"),
                                               ({"statistics": {"data_mode": ["Forward"]}}, "statistics.data_mode[0]",
                                                "forward")])
def test_a_misspelt_value_gets_the_closest_one(tmp_path, config, path, meant):
    """Misspelt keys got "did you mean", misspelt values ('l1', 'MIX', 'statistic') did not (a trial)."""
    (problem,) = error_of(tmp_path, config).problems
    assert problem.path == path and problem.expected.endswith(f"; did you mean {meant!r}?")


def test_a_value_close_to_none_gets_no_guess(tmp_path):
    (problem,) = error_of(tmp_path, {"level": "L3"}).problems
    assert problem.expected == "one of 'L0', 'L1', 'mix', 'debug'"


def test_unknown_key_that_is_not_a_name_is_quoted(tmp_path):
    error = error_of(tmp_path, {"": 1, "statistics": {"data mode": []}})
    assert [p.path for p in error.problems] == ['statistics["data mode"]', '[""]']


def test_every_problem_is_reported_together(tmp_path):
    error = error_of(tmp_path, {"stpe": [1], "level": "L3", "step": [0, "6-4", "x"],
                                "statistics": {"data_mode": ["fwd"], "scop": []},
                                "overflow_check": {"overflow_nums": 0}})
    paths = {p.path for p in error.problems}
    assert paths == {"stpe", "level", "step[1]", "step[2]", "statistics.data_mode[0]", "statistics.scop",
                     "overflow_check.overflow_nums"}
    lines = str(error).splitlines()
    assert lines[0].endswith("(7 problems):") and len(lines) == 8
    assert all(line.startswith("  ") for line in lines[1:])


# ------------------------------------------------------------------------------------------ rank / step

def test_ranges():
    assert IndexSet(["4-6"]).to_list() == ["4-6"]
    steps = IndexSet([0, "4-6"])
    assert [n for n in range(9) if n in steps] == [0, 4, 5, 6]
    assert steps.last == 6 and not steps.everything


def test_duplicates_and_overlaps_collapse():
    steps = IndexSet([5, "4-6", 5, "7", " 9 - 10 ", 0, "1"])
    assert steps.to_list() == ["0-1", "4-7", "9-10"]
    assert steps == IndexSet(["0-1", "4-7", "9-10"]) and hash(steps) == hash(IndexSet([0, 1, "4-7", 9, 10]))


def test_empty_means_everything():
    steps = IndexSet()
    assert steps.everything and steps.last is None and 123456 in steps and steps.to_list() == []


@pytest.mark.parametrize("bad", ["6-4", -1, True, False, 1.5, "x", "-3", "1-", "", None, [1]])
def test_bad_range_elements_are_named(tmp_path, bad):
    (problem,) = error_of(tmp_path, {"step": [0, bad]}).problems
    assert problem.path == "step[1]" and problem.value == bad
    assert "non-negative integer" in problem.expected


def test_huge_range_is_cheap():
    started = time.perf_counter()
    steps = IndexSet(["0-1000000000", 2000000000])
    assert 999_999_999 in steps and 1_000_000_001 not in steps and 2_000_000_000 in steps
    assert steps.spans == ((0, 1_000_000_000), (2_000_000_000, 2_000_000_000))
    assert time.perf_counter() - started < 0.1


def test_index_set_is_immutable():
    with pytest.raises(AttributeError):
        IndexSet([1]).spans = ()


def test_config_steps_round_trip(tmp_path):
    config = load_config(write(tmp_path, {"step": [3, "0-1", 2], "rank": ["4-6"]}))
    assert config.step.to_list() == ["0-3"] and config.step.last == 3 and 5 in config.rank
    assert config.model_dump(mode="json")["step"] == ["0-3"]


# ------------------------------------------------------------------------------------------ selection

@pytest.mark.parametrize("task, modes, directions, parts", [
    ("statistics", ["all"], {"forward", "backward"}, {"input", "output"}),
    ("statistics", ["forward", "input"], {"forward"}, {"input"}),
    ("tensor", ["backward"], {"backward"}, {"input", "output"}),
    ("tensor", ["output"], {"forward", "backward"}, {"output"}),
])
def test_directions_and_parts(tmp_path, task, modes, directions, parts):
    config = load_config(write(tmp_path, {"task": task, task: {"data_mode": modes}}))
    assert config.selection is getattr(config, task)
    assert (config.directions, config.parts) == (directions, parts)


@pytest.mark.parametrize("task", ["overflow_check", "structure"])
def test_tasks_without_a_block_select_everything(tmp_path, task):
    config = load_config(write(tmp_path, {"task": task, "statistics": {"list": ["linear"], "data_mode": ["input"]}}))
    assert config.selection.list == [] and config.selection.scope == []
    assert config.parts == {"input", "output"}


# ------------------------------------------------------------------------------------------ overrides

def test_overrides_replace_file_values(tmp_path):
    path = write(tmp_path, {"task": "tensor", "level": "L0", "step": [1], "tensor": {"list": ["a"]}})
    config = load_config(path, task="overflow_check", dump_path=tmp_path / "out", level="mix", step=[2, "5-6"])
    assert (config.task, config.dump_path, config.level) == ("overflow_check", str(tmp_path / "out"), "mix")
    assert config.step.to_list() == [2, "5-6"]
    assert load_config(path, task=None, step=None).step.to_list() == [1]  # None keeps the file's value


def test_override_errors_name_the_argument(tmp_path):
    error = error_of(tmp_path, {"level": "L5"}, step=[0, -1], task="dump")
    paths = {p.path for p in error.problems}
    assert paths == {"step[1] (argument)", "task (argument)", "level"}
    assert "step[1] (argument): got -1" in str(error)
    with pytest.raises(ConfigError) as caught:  # no file of the user's: the arguments are the source said
        load_config(level="L9", dump_path=str(tmp_path))
    assert str(caught.value).startswith("Invalid msprobe_lite config from the arguments (over the defaults of ")


# ------------------------------------------------------------------------------------------ files

def test_load_config_creates_no_folder(tmp_path):
    target = tmp_path / "a" / "b"
    load_config(write(tmp_path, {"dump_path": str(target)}))
    load_config(dump_path=target)
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, {"dump_path": str(target), "stpe": []}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_invalid_json_names_line_and_column(tmp_path):
    (problem,) = error_of(tmp_path, '{\n  "task": "tensor",\n  "step": [1 2]\n}').problems
    assert problem.path == "line 3, column 14" and problem.value == '"step": [1 2]'
    assert "valid JSON" in problem.expected


@pytest.mark.parametrize("text", ["", "{", '{"task": "tensor",}'])
def test_truncated_json_is_a_config_error(tmp_path, text):
    assert error_of(tmp_path, text).problems[0].path.startswith("line ")


def test_top_level_must_be_an_object(tmp_path):
    (problem,) = error_of(tmp_path, [1, 2]).problems
    assert problem.path == "(top level)" and "JSON object" in problem.expected


def test_missing_and_unreadable_files(tmp_path):
    for path, words in ((tmp_path / "nope.json", "not found"), (tmp_path, "readable")):
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert str(path) in str(caught.value).splitlines()[0] and words in str(caught.value)


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"task": "tensor"}).encode())
    assert load_config(path).task == "tensor"


def test_config_error_is_a_value_error_and_pickles(tmp_path):
    error = error_of(tmp_path, {"task": "x"})
    assert isinstance(error, ValueError)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from(TOP_KEYS + ["stpe", "scope"]) | st.text(max_size=5),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                 | st.text(max_size=12) | st.sampled_from(["all", "forward", "tensor", "L0", "0-3", "./d"]),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                     st.sampled_from(["scope", "list", "data_mode", "summary_mode", "tensor_list", "overflow_nums"])
                     | st.text(max_size=5), inner, max_size=4),
                 max_leaves=12)))
def test_any_json_object_gives_a_config_or_a_config_error(tmp_path_factory, data):
    path = write(tmp_path_factory.mktemp("any"), data)
    try:
        assert isinstance(load_config(path), DebuggerConfig)
    except ConfigError as error:
        assert error.problems and all(p.path and p.expected for p in error.problems)


# ------------------------------------------------------------------------------------------ schema and CLI

def test_schema_describes_every_field():
    schema = config_schema()
    assert list(schema["properties"]) == TOP_KEYS
    assert schema["additionalProperties"] is False and "$ref" not in json.dumps(schema)
    assert set(schema["properties"]["statistics"]["properties"]) == {
        "scope", "list", "data_mode", "summary_mode", "tensor_list"}
    blocks = [schema] + [schema["properties"][k] for k in ("statistics", "tensor", "overflow_check")]
    assert all(field.get("description") for block in blocks for field in block["properties"].values())


def test_cli_check_valid(capsys):
    assert main(["config", "check", str(DEFAULT_CONFIG_PATH)]) == 0
    assert capsys.readouterr().out.strip() == f"{DEFAULT_CONFIG_PATH}: valid (task=statistics, level=L1)"


def test_cli_check_invalid(tmp_path, capsys):
    path = write(tmp_path, {"stpe": [1], "statistics": {"data_mode": ["fwd"]}})
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(path) in captured.err and "stpe: got [1]" in captured.err
    assert "statistics.data_mode[0]: got 'fwd'" in captured.err


def test_cli_schema(capsys):
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == config_schema()


def test_cli_bad_arguments_return_2(capsys):
    assert main([]) == 2 and main(["config"]) == 2 and main(["config", "check"]) == 2
    assert "usage" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    done = subprocess.run([sys.executable, "-m", "msprobe_lite", "config", "check", str(DEFAULT_CONFIG_PATH)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and "valid" in done.stdout


# ------------------------------------------------------------------------------------------ dump_path resolution

def _one_step(debugger) -> None:
    """One real step of a small seeded torch model under `debugger` (the dump it writes is what is checked)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    debugger.start(model=model)
    model(torch.ones(2, 4)).sum().backward()
    debugger.stop()
    debugger.step()


def test_dump_path_with_tilde_is_below_the_home_folder(tmp_path, monkeypatch):
    """`"~/x"` made a folder named `~` in the working folder (a trial): `~` is the user's home, as in a shell."""
    from msprobe_lite.pytorch import PrecisionDebugger

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert load_config(dump_path="~/dumps").dump_path == str(tmp_path / "home" / "dumps")
    _one_step(PrecisionDebugger(dump_path="~/dumps", task="statistics", level="L0"))
    assert (tmp_path / "home" / "dumps" / "step0" / "rank" / "dump.json").is_file()
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.parametrize("way, why", [("a/missing/../d", "'a/missing' does not exist"),
                                      ("a_file/../d", "'a_file' is a file")])
def test_dump_path_stepping_out_of_what_is_not_a_folder_is_refused(tmp_path, monkeypatch, way, why):
    """`a/missing/../d` made `a/missing` as well as `a/d`; `a_file/../d` passed the check and failed at the first
    write. Both are refused when the config is read, naming the field and the value."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a_file").write_text("x")
    (problem,) = error_of(tmp_path, {"dump_path": way}).problems
    assert (problem.path, problem.value) == ("dump_path", way)
    assert why in problem.expected and "'..'" in problem.expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "a_file", "config.json"]


def test_dump_path_stepping_out_of_an_existing_folder_is_fine(tmp_path, monkeypatch):
    from msprobe_lite.pytorch import PrecisionDebugger

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    _one_step(PrecisionDebugger(dump_path="a/../d", task="statistics", level="L0"))
    assert (tmp_path / "d" / "step0" / "rank" / "dump.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "d"]


def test_a_relative_dump_path_is_where_the_debugger_was_made(tmp_path, monkeypatch):
    """A script that changes its working folder after making the debugger still dumps where it said."""
    from msprobe_lite.pytorch import PrecisionDebugger

    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    config = write(tmp_path, {"dump_path": "./out", "level": "L0"})
    debugger = PrecisionDebugger(config_path=str(config))
    assert debugger.config.dump_path == str(tmp_path / "first" / "out")
    monkeypatch.chdir(tmp_path / "second")
    _one_step(debugger)
    assert (tmp_path / "first" / "out" / "step0" / "rank" / "dump.json").is_file()
    assert list((tmp_path / "second").iterdir()) == []


# ------------------------------------------------------------------------------------------ what a reader reads

def test_every_config_reader_refuses_a_device(tmp_path, capsys):
    """`config check /dev/zero` read gigabytes into memory (a trial); the config, compare's mapping and the
    checkpoint name map are read by one reader that takes regular files only."""
    from msprobe_lite.pytorch import PrecisionDebugger

    assert main(["config", "check", "/dev/zero"]) == 2
    assert "config_path: got '/dev/zero'; expected a readable regular file, but this is a character device" in \
        capsys.readouterr().err
    with pytest.raises(ConfigError, match="character device"):
        PrecisionDebugger(config_path="/dev/zero")
    assert main(["compare", "-tp", str(tmp_path), "-gp", str(tmp_path), "-dm", "/dev/zero"]) == 2
    assert "/dev/zero: expected a readable regular file, but this is a character device" in capsys.readouterr().err
    assert main(["config", "check", str(tmp_path)]) == 2
    assert "but this is a folder" in capsys.readouterr().err


def test_a_fifo_is_refused_without_blocking(tmp_path):
    """`open()` of a FIFO waits for a writer forever: run in a child with a timeout so a regression fails."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "msprobe_lite", "config", "check", str(fifo)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "a FIFO (named pipe)" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 2


def test_a_huge_config_file_is_refused_before_it_is_read(tmp_path, capsys):
    from msprobe_lite.core.small_file import MAX_BYTES

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: the size is what the reader goes by
    assert main(["config", "check", str(big)]) == 2
    assert "expected a file of at most 4 MiB, but this one holds 4,194,305 bytes" in capsys.readouterr().err
    fine = write(tmp_path, " " * (MAX_BYTES - 2) + "{}")
    assert load_config(fine) == DebuggerConfig()


# ------------------------------------------------------------------------------------------ msprobe's own configs

# The layout of the config.json packaged with msprobe (mindstudio-probe 26.2): our blocks plus its acc_check block.
MSPROBE_PACKAGED = {
    "task": "statistics", "dump_path": "./dump_path", "rank": [], "step": [], "level": "L1", "extra_info": True,
    "async_dump": False,
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"},
}
# The layout of the full config of its earlier releases (its config guide's complete example): switches at the
# top, settings of its other tasks inside our blocks, and the blocks of tasks msprobe_lite does not have.
MSPROBE_EARLIER = {
    "task": "tensor", "dump_path": "./dump_path", "rank": [], "step": [0], "level": "L1", "seed": 1234,
    "is_deterministic": False, "enable_dataloader": False, "acl_config": "", "precision": "low",
    "tensor": {"scope": [], "list": ["linear"], "data_mode": ["all"], "backward_input": [], "file_format": "npy"},
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    "overflow_check": {"overflow_nums": 1, "check_mode": "all"},
    "run_ut": {"white_list": [], "black_list": [], "error_data_path": "./"},
    "grad_probe": {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]},
    "free_benchmark": {"scope": [], "list": [], "fuzz_device": "npu", "pert_mode": "improve_precision",
                       "handler_type": "check", "fuzz_level": "L1", "fuzz_stage": "forward", "if_preheat": False,
                       "preheat_step": 15, "max_sample": 20},
}


def test_msprobes_packaged_config_is_accepted_with_one_note(tmp_path, capsys):
    """A user's config of msprobe was refused (`acc_check: ... expected a known key`): it loads as it is, and
    the one note names what msprobe_lite does not act on."""
    path = write(tmp_path, MSPROBE_PACKAGED)
    config = load_config(path)
    assert (config.task, config.level, config.statistics.summary_mode) == ("statistics", "L1", "statistics")
    assert config.not_acted_on == ("acc_check",)
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: valid (task=statistics, level=L1)"
    assert out[1:] == ["note: msprobe's acc_check is accepted and not acted on by msprobe_lite"]


def test_msprobes_earlier_full_config_is_accepted(tmp_path, capsys):
    config = load_config(write(tmp_path, MSPROBE_EARLIER))
    assert (config.task, config.tensor.list, config.step.to_list()) == ("tensor", ["linear"], [0])
    assert config.not_acted_on == ("seed", "is_deterministic", "enable_dataloader", "acl_config", "precision",
                                   "tensor.backward_input", "tensor.file_format", "overflow_check.check_mode",
                                   "run_ut", "grad_probe", "free_benchmark")
    assert main(["config", "check", str(tmp_path / "config.json")]) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: msprobe's")]
    assert "seed, is_deterministic" in note and "seed_all(" in note  # where seeding is done in msprobe_lite
    assert len(note) <= 160 - len("[msprobe_lite] WARNING: ") + len("note: ") and "more are accepted" in note, note


def test_the_debugger_says_the_note_once(tmp_path, caplog):
    from msprobe_lite.pytorch import PrecisionDebugger

    path = write(tmp_path, {**MSPROBE_PACKAGED, "dump_path": str(tmp_path / "dump"), "level": "L0"})
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        debugger = PrecisionDebugger(config_path=str(path))
        _one_step(debugger)
    assert caplog.text.count("msprobe's acc_check is accepted and not acted on") == 1
    assert (tmp_path / "dump" / "step0" / "rank" / "dump.json").is_file()


@pytest.mark.parametrize("data, path, meant", [({"acc_chek": {}}, "acc_chek", "acc_check"),
                                               ({"is_determinstic": True}, "is_determinstic", "is_deterministic"),
                                               ({"tensor": {"file_fromat": "npy"}}, "tensor.file_fromat",
                                                "file_format"),
                                               ({"statistics": {"check_mode": "all"}}, "statistics.check_mode",
                                                None)])
def test_keys_nobody_defines_stay_errors(tmp_path, data, path, meant):
    """Only msprobe's own keys, in the object msprobe reads them from, are set aside: a typo is still an error,
    and the closest key (msprobe's too) is offered."""
    (problem,) = error_of(tmp_path, data).problems
    assert problem.path == path
    if meant:
        assert problem.expected.endswith(f"; did you mean {meant!r}?")


def test_a_task_of_msprobe_that_msprobe_lite_does_not_have_is_still_an_error(tmp_path):
    """Running task statistics when the user asked for acc_check would hand them the wrong data."""
    (problem,) = error_of(tmp_path, {**MSPROBE_PACKAGED, "task": "acc_check"}).problems
    assert problem.path == "task" and problem.value == "acc_check"


DEFERRED = """
import json, os, sys
import mindspore, torch
import msprobe_lite
first, second = sys.argv[1], sys.argv[2]
os.chdir(first)
with open("cfg.json", "w") as f:
    json.dump({"dump_path": "./out", "level": "L0"}, f)
debugger = msprobe_lite.PrecisionDebugger(config_path="cfg.json")  # both imported: the adapter comes at start()
os.chdir(second)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 2))
debugger.start(model=model)
model(torch.ones(1, 4)).sum().backward()
debugger.stop()
debugger.step()
print(sorted(os.listdir(os.path.join(first, "out", "step0", "rank"))), os.listdir(second))
"""


def test_the_framework_picking_debugger_keeps_its_paths_across_a_chdir(tmp_path):
    """msprobe_lite.PrecisionDebugger with both frameworks imported reads the config again at start(): the
    file and the dump are where they were when it was made, not below the folder of the moment."""
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    done = subprocess.run([sys.executable, "-c", DEFERRED, str(tmp_path / "first"), str(tmp_path / "second")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['construct.json', 'dump.json', 'stack.json'] []"
