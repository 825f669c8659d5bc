"""compare/table.py: a dump.json read into columns, row for row what rows.record_rows makes of each record."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from msprobe_lite.compare import table as table_module
from msprobe_lite.compare.rows import INPUT, OUTPUT, record_rows
from msprobe_lite.compare.table import read_table, read_tables

import models  # noqa: E402
from helpers import C_ROUTES, c_route  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATS = ("Max", "Min", "Mean", "Norm")


def _dump(path, level, **settings):
    """A seeded transformer's two training steps (forward and backward) dumped in statistics mode."""
    from msprobe_lite.pytorch import PrecisionDebugger

    config = path.parent / f"{path.name}_config.json"
    config.write_text(json.dumps({"task": "statistics", "level": level, "dump_path": str(path), **settings}))
    models.train("transformer", steps=1, debugger=PrecisionDebugger(str(config)))
    return str(path / "step0" / "rank" / "dump.json")


@pytest.fixture(scope="module", params=["L1", "mix"])
def real_dump(request, tmp_path_factory):
    return _dump(tmp_path_factory.mktemp(f"dump_{request.param}"), request.param)


def assert_table_is_record_rows(table, path):
    """Every record's rows in the table are those rows.record_rows makes of the record json reads."""
    with open(path, "rb") as f:
        raw = f.read()
    content = json.loads(raw)
    data = content.pop("data")
    assert table is not None and table.path == path
    assert table.header == content
    assert table.names == list(data)
    assert table.first_row[0] == 0 and len(table.spans) == len(data) == len(table.parts)
    r, any_md5 = 0, False
    for i, name in enumerate(table.names):
        record = data[name]
        offset, length = table.spans[i]
        assert json.loads(raw[offset:offset + length]) == record, name
        bits = (1 * any(k in record for k in ("input_args", "input_kwargs", "input", "grad_output")) |
                2 * any(k in record for k in ("output", "grad_input")) | 4 * ("parameters" in record))
        assert table.parts[i] == bits, name
        rows = record_rows(name, record)
        assert (table.first_row[i], table.first_row[i + 1]) == (r, r + len(rows)), name
        for row in rows:
            assert name + table.suffixes[table.suffix[r]] == row.name
            assert table.role[r] == {INPUT: 0, OUTPUT: 1}[row.role]
            stats = [row.obj.get(k) for k in STATS]
            plain = row.is_tensor and all(type(s) is float for s in stats) and "md5" not in row.obj
            assert table.kind[r] == (0 if plain else 1 if row.is_tensor else 2), row
            assert table.dtypes[table.dtype[r]] == row.dtype
            assert table.shapes[table.shape[r]] == (None if row.shape is None else tuple(row.shape))
            if plain:  # bitwise, NaN included
                assert table.stats[r].tobytes() == np.array(stats, np.float64).tobytes(), row
                assert r not in table.objs
            else:
                assert np.isnan(table.stats[r]).all() and table.objs[r] == row.obj
            assert table.grad[r] == (row.obj.get("requires_grad") is True)
            any_md5 = any_md5 or (row.is_tensor and "md5" in row.obj)
            r += 1
    assert r == table.first_row[-1] == len(table.suffix) == len(table.role) == len(table.kind) == \
        len(table.dtype) == len(table.shape) == len(table.stats) == len(table.grad)
    assert table.md5 == any_md5
    return r


def _rewritten(path, folder, **dump_args):
    """The same dump written by json.dump (indent=1: the reference tool's layout; none: one line)."""
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "dump.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(content, f, **dump_args)
    return out


def test_a_real_dump_in_our_layout_is_read_line_by_line(real_dump, monkeypatch):
    def no_stream(*args):
        raise AssertionError("our dumper's layout went to the streaming route")
    monkeypatch.setattr(table_module, "_read_stream", no_stream)
    rows = assert_table_is_record_rows(read_table(real_dump), real_dump)
    assert rows > 100
    assert_table_is_record_rows(read_table(real_dump, fast_json=False), real_dump)
    table = read_table(real_dump)
    assert {0, 2} <= set(table.kind.tolist()), "the model's dump has float tensors and values"
    assert table.grad.any() and not table.grad.all()


@pytest.mark.parametrize("layout", [{"indent": 1}, {}], ids=["indented", "one_line"])
@pytest.mark.parametrize("chunk", [table_module._CHUNK, 97], ids=["chunks", "tiny_chunks"])
def test_a_real_dump_in_other_layouts_is_streamed(real_dump, tmp_path, monkeypatch, layout, chunk):
    monkeypatch.setattr(table_module, "_CHUNK", chunk)  # values cut at every chunk's end, and read again
    path = _rewritten(real_dump, str(tmp_path / "rewritten"), **layout)
    assert_table_is_record_rows(read_table(path), path)


def test_md5_dumps_mark_their_tensors_as_others(tmp_path):
    path = _dump(tmp_path / "md5", "L1", statistics={"summary_mode": "md5"})
    table = read_table(path)
    assert table.md5 and assert_table_is_record_rows(table, path)
    assert 0 not in table.kind and 1 in table.kind  # every tensor has its md5


@pytest.mark.parametrize("layout", ["lines", "indented", "one_line"])
def test_non_ascii_text_keeps_byte_spans(tmp_path, monkeypatch, layout):
    monkeypatch.setattr(table_module, "_CHUNK", 64)
    tensor = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5, "Min": -2.0,
              "Mean": 0.25, "Norm": float("nan"), "requires_grad": False}
    data = {"Module.编码器.Linear.forward.0": {"input_args": [tensor], "input_kwargs": {"名前": {"type": "str",
                                                                                           "value": "日本語 ü"}},
                                               "output": [dict(tensor, Max=float("inf"))]},
            "Functional.relu.0.forward": {"input_args": [tensor], "output": [tensor]}}
    header = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None}
    path = str(tmp_path / "dump.json")
    if layout == "lines":  # our layout, its text unescaped (our dumper writes \\u escapes)
        body = ",\n".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                          for k, v in data.items())
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(header)[:-1] + ', "data": {\n' + body + "\n}}\n")
    else:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(header, data=data), f, ensure_ascii=False, indent=1 if layout == "indented" else None)
    with open(path, "rb") as f:
        assert not f.read().isascii()
    table = read_table(path)
    assert assert_table_is_record_rows(table, path) == 5
    assert math.isinf(table.stats[2, 0]) and math.isnan(table.stats[0, 3])


T = '{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": %s, "Min": 0.0, "Mean": 0.5, "Norm": 1.0}'
GOOD = '{"task": "statistics", "level": "L1", "data": {"F.add.0.forward": {"input_args": [%s], "output": [%s]}}}' % (
    T % "1.0", T % "1.0")


@pytest.mark.parametrize("text", [
    GOOD[:-7],                                                     # truncated
    GOOD.replace('"output":', '"output"'),                         # invalid JSON
    GOOD + " x",                                                   # text after the object
    '{"data": {"F.add.0.forward": [1, 2]}}',                       # a record that is a list
    GOOD.replace(T % "1.0", T % '"abc"', 1),                       # a tensor with "Max": "abc"
    GOOD.replace('"L1"', '"debug"'),                               # level debug
    '{"data": {"a": {}, "a": {}}}',                                # a name twice
    '{"data": {"": {}}}',                                          # an empty name
    '{"task": "statistics"}',                                      # no data
    '{"data": []}',                                                # data not an object
    '[1]',                                                         # not an object
    '',                                                            # empty file
    '\ufeff' + GOOD,                                               # a byte-order mark (json refuses it)
], ids=["truncated", "invalid", "trailing", "list_record", "max_abc", "debug", "duplicate", "empty_name",
        "no_data", "data_list", "array", "empty", "bom"])
def test_files_the_route_does_not_read_are_none(tmp_path, text):
    path = tmp_path / "dump.json"
    path.write_text(text, encoding="utf-8")
    assert read_table(str(path)) is None


def _lines(path, header: dict, data: dict) -> str:
    """`data` written by our dumper (one record per line)."""
    from msprobe_lite.core.writer import dump_json_chunks

    class Entry:
        def __init__(self, name, value):
            self.name, self.data = name, value
    with open(path, "wb") as f:
        f.writelines(dump_json_chunks(header, [Entry(k, v) for k, v in data.items()]))
    return str(path)


@pytest.mark.parametrize("case", ["truncated", "list_record", "max_abc", "debug", "duplicate",
                                  "record_after_close", "missing_comma"])
def test_our_layout_damaged_is_none(tmp_path, case):
    t = json.loads(T % "1.0")
    data = {f"F.add.{i}.forward": {"input_args": [t], "output": [t]} for i in range(3)}
    header = {"task": "statistics", "level": "debug" if case == "debug" else "L1"}
    if case == "list_record":
        data["F.add.1.forward"] = [t]
    if case == "max_abc":
        data["F.add.2.forward"]["output"] = [dict(t, Max="abc")]
    path = _lines(tmp_path / "dump.json", header, data)
    text = open(path).read()
    if case == "truncated":
        text = text[:-4]
    if case == "duplicate":
        text = text.replace("F.add.2", "F.add.0")
    if case == "record_after_close":
        text += '"F.add.9.forward": {}\n'
    if case == "missing_comma":
        text = text.replace("},\n", "}\n", 1)
    with open(path, "w") as f:
        f.write(text)
    assert read_table(path) is None


def test_our_layout_with_a_record_over_two_lines_is_streamed(tmp_path):
    t = json.loads(T % "1.0")
    path = _lines(tmp_path / "dump.json", {"task": "statistics"},
                  {f"F.add.{i}.forward": {"input_args": [t], "output": [t]} for i in range(3)})
    with open(path) as f:
        text = f.read().replace('"output": [', '"output":\n [', 1)
    with open(path, "w") as f:
        f.write(text)
    assert assert_table_is_record_rows(read_table(path), path) == 6


def test_the_good_file_and_a_missing_one(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text(GOOD)
    assert assert_table_is_record_rows(read_table(str(path)), str(path)) == 2
    assert read_table(str(tmp_path / "absent.json")) is None
    assert read_table(str(tmp_path)) is None  # a folder


def test_unusual_records_go_through_record_rows(tmp_path):
    t = json.loads(T % "1.0")
    data = {
        "Module.fc.Linear.parameters_grad.0": {"weight": t, "bias": [t, t]},
        "save.x.0": {"a": [[t, t], {"type": "int", "value": 3}]},
        "F.f.0.forward": {"input_args": [[t, {"k": t}], None, {"type": "int", "value": 1}],
                          "input_kwargs": {"opts": {"inner": t}}, "parameters": {"w": t}, "output": t},
        "F.g.0.forward": {"input_args": [dict(t, Max=1, Min=True, Mean=None)], "output": []},
        "F.h.0.forward": {"input": [dict(t, shape=None, dtype=None)], "grad_input": [dict(t, md5="abcd1234")]},
        "F.k.0.forward": {"input_args": [{"type": "float", "value": 2.0, "requires_grad": True}, {"type": "int"}],
                          "input_kwargs": {"a": {"type": "torch.Size", "dtype": "x", "value": [2]}}, "output": [t]},
        "F.k.1.forward": {"input_args": [{"type": "float", "value": 2.0, "requires_grad": False}], "output": None},
    }
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "mix", "data": data}, indent=1))
    table = read_table(str(path))
    assert assert_table_is_record_rows(table, str(path)) > 10
    assert table.md5 and table.parts.tolist() == [0, 0, 7, 3, 3, 3, 3]
    assert table.grad[table.first_row[5]] and not table.grad[table.first_row[6]]


def test_read_tables_in_processes_is_read_table(real_dump, tmp_path):
    other = _rewritten(real_dump, str(tmp_path / "indented"), indent=1)
    apart = read_tables([real_dump, other], parallel=True)
    for one, path in zip(apart, [real_dump, other]):
        assert_table_is_record_rows(one, path)
    alone = read_tables([real_dump, other], parallel=False)
    assert [t.names for t in apart] == [t.names for t in alone]
    assert all((a.stats.tobytes() == b.stats.tobytes()) for a, b in zip(apart, alone))


def test_a_large_dump_is_read_in_memory_of_its_columns(tmp_path):
    """100k records (72 MB of JSON) read in a child process: its peak memory grows by the columns, not by the
    file's tree (json.load of it takes about 260 MB)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        from bench_compare import write_dump
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    path = write_dump(str(tmp_path / "big"), 100_000, seed=1, noise=0.0)
    child = textwrap.dedent(f"""
        import resource
        from msprobe_lite.compare.table import read_table
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        table = read_table({path!r})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(len(table.names), len(table.suffix), (after - before) / 1024)
    """)
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, check=True)
    records, rows, grown_mb = out.stdout.split()
    assert (int(records), int(rows)) == (100_000, 350_000)
    assert float(grown_mb) < 60, grown_mb


_MUTATIONS = [("Max", 3), ("Max", None), ("Max", "abc"), ("Min", True), ("Mean", [1.0]), ("shape", [2.0, 3]),
              ("shape", [-1]), ("shape", "2x3"), ("shape", None), ("shape", [[2]]), ("dtype", "torch.float99"),
              ("dtype", None), ("dtype", 7), ("type", None), ("type", 3), ("md5", "00ff00ff"),
              ("data_name", "../x.npy"), ("data_name", "x.npy"), ("requires_grad", "yes"), ("Norm", float("nan"))]


@pytest.mark.parametrize("seed", range(6))
def test_a_damaged_leaf_is_read_as_record_rows_or_refused_as_load_dump_does(real_dump, tmp_path, seed):
    """A leaf of a real dump changed: the table is record_rows' rows where load_dump and record_rows accept the
    file, and None where they refuse it."""
    import random

    from msprobe_lite.compare.read import DumpError, load_dump
    rng = random.Random(seed)
    with open(real_dump, encoding="utf-8") as f:
        content = json.load(f)
    leaves = [leaf for record in content["data"].values() for part in record.values() if isinstance(part, list)
              for leaf in part if isinstance(leaf, dict)]
    for leaf in rng.sample(leaves, 4):
        key, value = rng.choice(_MUTATIONS)
        leaf[key] = value
    path = tmp_path / "dump.json"
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in content.pop("data").items())
    path.write_text(json.dumps(content)[:-1] + ', "data": {\n' + body + "\n}}\n")
    try:
        dump = load_dump(str(path))
        for name in dump.records:
            dump.rows(name)
        accepted = True
    except DumpError:
        accepted = False
    table = read_table(str(path))
    if not accepted:
        assert table is None
    else:
        assert_table_is_record_rows(table, str(path))


@pytest.mark.parametrize("first", ['{"task": "statistics" "data": {', '{, "data": {',
                                   '{"task": "statistics",, "data": {', '{"data": {"data": {'])
def test_a_header_line_that_is_not_json_is_none(tmp_path, first):
    path = tmp_path / "dump.json"
    path.write_text(first + "\n" + '"F.add.0.forward": {"output": []}' + "\n}}\n")
    assert read_table(str(path)) is None


def test_a_header_line_without_keys_is_read(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text('{"data": {\n"F.add.0.forward": {"output": []}\n}}\n')
    table = read_table(str(path))
    assert table.header == {} and table.names == ["F.add.0.forward"] and table.parts.tolist() == [2]
    assert assert_table_is_record_rows(table, str(path)) == 0


@pytest.mark.parametrize("fast_json", [True, False])
def test_lines_with_nan_and_infinity_are_read_by_json(tmp_path, fast_json):
    t = json.loads(T % "1.0")
    data = {"F.add.0.forward": {"input_args": [t], "output": [t]},
            "F.add.1.forward": {"input_args": [dict(t, Max=float("nan"))], "output": [dict(t, Min=float("-inf"))]},
            "F.add.2.forward": {"input_args": [dict(t, Mean=0.75)], "output": [t]}}
    path = _lines(tmp_path / "dump.json", {"task": "statistics"}, data)
    table = read_table(path, fast_json=fast_json)
    assert assert_table_is_record_rows(table, path) == 6
    assert np.isnan(table.stats[2, 0]) and table.stats[3, 1] == -np.inf and table.stats[4, 2] == 0.75


def test_equal_values_share_one_object_and_signed_zeros_do_not(tmp_path):
    t = json.loads(T % "1.0")
    values = [{"type": "float", "value": 0.0}, {"type": "float", "value": -0.0}, {"type": "float", "value": 0.0},
              {"type": "int", "value": 0}, {"type": "bool", "value": False}, {"type": "float", "value": 0.0}]
    data = {f"F.mul.{i}.forward": {"input_args": [t, v], "output": [t]} for i, v in enumerate(values)}
    data["F.mul.9.forward"] = {"input_args": [[t], {"type": "int", "value": 0}], "output": [t]}  # record_rows'
    path = _lines(tmp_path / "dump.json", {"task": "statistics"}, data)
    table = read_table(path)
    assert assert_table_is_record_rows(table, path) == 21
    objs = [table.objs[table.first_row[i] + 1] for i in range(len(values))]
    assert [math.copysign(1, o["value"]) for o in objs[:3]] == [1, -1, 1]
    assert objs[0] is objs[2] is objs[5] and objs[1] is not objs[0] and type(objs[3]["value"]) is int
    assert type(objs[4]["value"]) is bool and sorted(table.objs) == [1, 4, 7, 10, 13, 16, 19]



# --- the C route of _Builder._usual (_fast_table.c) against the Python one -----------------------------------

def _sharing(objs: dict) -> list:
    """Which rows' objects are one object: each row's index of the first row holding the same object."""
    first = {}
    return [first.setdefault(id(obj), row) for row, obj in objs.items()]


def assert_same_tables(a, b):
    """Two tables alike in every column, list and object, NaN statistics bit for bit."""
    assert (a is None) == (b is None)
    if a is None:
        return
    for field in table_module.Table.__dataclass_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), field
        elif field == "objs":
            assert list(x) == list(y) and repr(list(x.values())) == repr(list(y.values()))
            assert _sharing(x) == _sharing(y)
        else:
            assert x == y, field


def _table_by(route: str, path, monkeypatch, **kwargs):
    """read_table through the C route or the Python one of _Builder._usual."""
    with monkeypatch.context() as m:
        if route == "Python":
            m.setattr(table_module, "_Rows", None)
        return read_table(path, **kwargs)


@c_route
def test_the_c_route_is_built_and_used():
    build = table_module._Builder()
    assert type(build._usual).__name__ == "Rows" and C_ROUTES


@c_route
@pytest.mark.parametrize("layout", ["lines", "indented"])
def test_a_real_dump_reads_the_same_through_c_and_python(real_dump, tmp_path, monkeypatch, layout):
    path = real_dump if layout == "lines" else _rewritten(real_dump, str(tmp_path / "indented"), indent=1)
    c, python = _table_by("C", path, monkeypatch), _table_by("Python", path, monkeypatch)
    assert_table_is_record_rows(c, path) > 100
    assert_same_tables(c, python)


@c_route
def test_an_md5_dump_and_unusual_records_read_the_same_through_c_and_python(tmp_path, monkeypatch):
    md5 = _dump(tmp_path / "md5", "L1", statistics={"summary_mode": "md5"})
    assert_same_tables(_table_by("C", md5, monkeypatch), _table_by("Python", md5, monkeypatch))
    t = json.loads(T % "1.0")
    data = {"F.f.0.forward": {"input_args": [[t, {"k": t}], None, {"type": "int", "value": 1}],
                              "input_kwargs": {"opts": {"inner": t}}, "parameters": {"w": t}, "output": t},
            "F.k.0.forward": {"input_args": [{"type": "float", "value": 2.0, "requires_grad": True}, {"type": "int"}],
                              "input_kwargs": {"a": {"type": "torch.Size", "dtype": "x", "value": [2]}},
                              "output": [dict(t, data_name="F.k.0.forward.output.0.npy")]},
            "F.k.1.forward": {"input_args": [t] * 20, "output": [dict(t, dtype="numpy.float32", type="numpy.ndarray")]}}
    path = _lines(tmp_path / "dump.json", {"task": "statistics"}, data)
    c = _table_by("C", path, monkeypatch)
    assert_table_is_record_rows(c, path) == 30
    assert_same_tables(c, _table_by("Python", path, monkeypatch))


class _Text(str):
    pass


class _Size(int):
    pass


class _Float(float):
    pass


class _Object(dict):
    pass


def _nested(depth: int):
    value = [2]
    for _ in range(depth):
        value = [value]
    return value


# what a damaged place may hold instead: JSON's types (and a few subclasses of them no parser makes)
_HOSTILE = [lambda old: [old], lambda old: {"0": old}, lambda old: list(old.values()) if isinstance(old, dict) else old,
            lambda old: 3, lambda old: -1, lambda old: 0, lambda old: True, lambda old: False, lambda old: None,
            lambda old: "abc", lambda old: "", lambda old: 1.5, lambda old: float("nan"), lambda old: 2 ** 70,
            lambda old: [[2]], lambda old: [1.0, 2], lambda old: ["x"], lambda old: {}, lambda old: [],
            lambda old: _nested(120), lambda old: [2, 3], lambda old: [True, 3], lambda old: "torch.float16",
            lambda old: {"type": "int", "value": 1}, lambda old: json.loads(T % "2.0"),
            lambda old: _Text("x.npy"), lambda old: _Text("a/b"), lambda old: [_Size(2)], lambda old: _Float(1.0),
            lambda old: _Object(old) if isinstance(old, dict) else old, lambda old: "../x.npy", lambda old: "x\0y",
            lambda old: "..", lambda old: ".", lambda old: "x\\y", lambda old: {"dtype": "torch.float32"},
            lambda old: [float(v) for v in old] if isinstance(old, list) and all(type(v) is int for v in old) else old]
_ADDED_KEYS = ["md5", "data_name", "dtype", "shape", "type", "requires_grad", "Max", "Norm", "value"]


def _damaged(rng, record):
    """A deep copy of `record` with one to three places changed anywhere in its tree: a key removed, a key
    added, or a value replaced by another type."""
    import copy

    record = copy.deepcopy(record)
    for _ in range(rng.randint(1, 3)):
        places = [(None, None)]

        def walk(node):
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, value in items:
                places.append((node, key))
                walk(value)
        walk(record)
        node, key = rng.choice(places)
        action = rng.randrange(4)
        if node is None:  # the record itself
            record = rng.choice(_HOSTILE)(record)
        elif action == 0 and isinstance(node, dict):
            del node[key]
        elif action == 1 and isinstance(node, dict):
            node[rng.choice(_ADDED_KEYS)] = rng.choice(_HOSTILE)(None)
        else:
            node[key] = rng.choice(_HOSTILE)(node[key])
    return record


def _build(records: list, route: str, monkeypatch):
    """The records through a _Builder of `route`: each one's outcome and _usual's answers, the builder."""
    with monkeypatch.context() as m:
        if route == "Python":
            m.setattr(table_module, "_Rows", None)
        build = table_module._Builder()
    usual, answers, outcomes = build._usual, [], []
    assert (type(usual).__name__ == "Rows") == (route == "C")

    def recorded(record, parts):
        answers.append(usual(record, parts))
        return answers[-1]
    build._usual = recorded
    for i, (name, record) in enumerate(records):
        try:
            build.add(name, record, i, 1)
            outcomes.append("read")
        except table_module._Refused:
            outcomes.append("refused")
        except Exception as e:  # noqa: BLE001 - both routes must raise the same
            outcomes.append(type(e).__name__)
    return answers, outcomes, build


def _edges() -> list:
    """Records at each edge of _usual: each turn it takes, and the types it meets there."""
    t = json.loads(T % "1.0")
    value = {"type": "int", "value": 1}
    outputs = [t, 3, None, "x", [t], dict(t, shape=[2.0]), dict(t, shape=[_Size(2)]), dict(t, shape=[True]),
               dict(t, shape=[2, "x"]), dict(t, shape=[-1]), dict(t, shape=[2 ** 40, 2 ** 40]), dict(t, shape=None),
               dict(t, shape=(2,)), dict(t, data_name=_Text("x.npy")), dict(t, data_name=_Text("a/b")),
               dict(t, data_name=5), dict(t, data_name=""), dict(t, data_name="x.npy"), dict(t, data_name=None),
               dict(t, Max=_Float(1.0)), dict(t, Max=1), _Object(t), dict(t, dtype=["torch.float32"]),
               dict(t, dtype={"a": 1}), dict(t, dtype=float("nan")), dict(t, dtype=None), dict(t, requires_grad=1),
               dict(t, requires_grad=True), dict(t, md5=None), {k: v for k, v in t.items() if k != "Norm"},
               dict(t, type="numpy.ndarray", dtype="<U5"), dict(t, type=_Text("torch.Tensor")),
               {"type": "float", "dtype": [1], "value": 1.0}, {"type": "float", "shape": [1], "value": 1.0},
               {"type": "float", "value": [[1]]}, {"type": "float", "value": float("nan")}, {"type": None}]
    records = [{"output": [leaf]} for leaf in outputs] + [{"output": leaf} for leaf in outputs]
    records += [{"input_args": [t] * 30, "output": [t] * 9}, {"input_args": None, "output": [t]}, {"input_args": 3},
                {"input_kwargs": {"shape": value}}, {"input_kwargs": {"dtype": "torch.float32", "x": t}},
                {"input_kwargs": {"dtype": 3, "x": t}}, {"input_kwargs": {"type": 3, "a": t}},
                {"input_kwargs": {1: t, _Text("k"): value, "v": value}}, {"output": {"0": t, "1": value}},
                {"input": [t], "grad_output": (t,), "parameters": {"w": t}}, {"grad_input": [t, [t]]},
                {"output": [{"type": "float", "dtype": _nested(2 * sys.getrecursionlimit())}]}, {"output": [t], "other": 1}]
    return [(f"Functional.edge.{i}.forward", record) for i, record in enumerate(records)]


@c_route
def test_records_at_every_edge_get_the_same_rows_through_c_and_python(monkeypatch):
    records = _edges()
    c_answers, c_outcomes, c = _build(records, "C", monkeypatch)
    p_answers, p_outcomes, python = _build(records, "Python", monkeypatch)
    assert c_outcomes == p_outcomes and c_answers == p_answers
    assert {"read", "refused", "RecursionError"} <= set(c_outcomes) and {True, False} <= set(c_answers)
    assert_same_builders(c, python)


def assert_same_builders(c, python):
    for field in ("names", "suffix_codes", "dtype_codes", "shape_codes", "classes", "tensor_classes",
                  "value_classes", "list_codes", "plans", "md5", "done"):
        assert getattr(c, field) == getattr(python, field), field
    assert list(c.values) == list(python.values)
    for field in ("spans", "parts", "first_row"):
        assert getattr(c, field) == getattr(python, field), field
    c._flush(), python._flush()
    for field in ("suffix_done", "row_class_done", "stats_done"):
        assert getattr(c, field).tobytes() == getattr(python, field).tobytes(), field
    assert list(c.objs) == list(python.objs)
    assert all(c.objs[r] is python.objs[r] for r in c.objs)  # the same record objects went into both


@c_route
@pytest.mark.parametrize("seed", range(4))
def test_randomly_damaged_records_get_the_same_rows_through_c_and_python(real_dump, monkeypatch, seed):
    """A real dump's records and records shaped as the benchmark's, interleaved with 100 damaged copies of them:
    the C route answers as the Python one, record by record, and leaves the builder in the same state."""
    import random

    rng = random.Random(seed)
    with open(real_dump, encoding="utf-8") as f:
        real = list(json.load(f)["data"].items())
    t = json.loads(T % "1.0")
    alpha = {"alpha": {"type": "float", "value": 1.0}}
    usual = [{"input_args": [t, dict(t, requires_grad=True)], "input_kwargs": alpha,
              "output": [dict(t, shape=[8, 128])]}, {"input": [t], "output": [t, t]}]
    good = real + [(f"Functional.op.{i}.forward", usual[i % 2]) for i in range(20)]
    records = []
    for i in range(100):
        name, record = good[rng.randrange(len(good))]
        records.append((f"{name}.good{i}", record))
        name, record = good[rng.randrange(len(good))]
        records.append((f"{name}.damaged{i}", _damaged(rng, record)))
    c_answers, c_outcomes, c = _build(records, "C", monkeypatch)
    p_answers, p_outcomes, python = _build(records, "Python", monkeypatch)
    assert c_outcomes == p_outcomes and c_answers == p_answers
    assert "refused" in c_outcomes and True in c_answers and False in c_answers
    assert_same_builders(c, python)


# --- the C route of _Lines.line (Rows.lines) against the Python one ---------------------------------------------

def _line_variants(t: str) -> list:
    """Record lines at each edge of Rows.lines: what it reads itself and each kind it hands to _Lines.line."""
    record = '{"input_args": [%s], "input_kwargs": {"alpha": {"type": "float", "value": 1.0}}, "output": [%s]}' % (t, t)
    return [
        '"F.a.{i}.forward": %s' % record,                                   # usual
        '"F.\\u00e9.{i}.forward": %s' % record,                             # an escape in the name
        '"F.\u00e9.{i}.forward": %s' % record,                              # a name that is not ASCII
        '"F.a.{i}.forward": %s' % record.replace("1.0}", "NaN}", 1),       # NaN: json reads it
        '"F.a.{i}.forward": %s' % record.replace("1.0}", "Infinity}", 1),
        '"F.a.{i}.forward": %s' % record.replace('"float", "value": 1.0', '"int", "value": 123456789012345678901'),
        '"F.a.{i}.forward": %s' % record.replace('"float", "value": 1.0', '"float", "value": -123456789012345678901'),
        '"F.a.{i}.forward": %s' % record.replace('"float", "value": 1.0', '"int", "value": 1234567890123456789'),
        '"F.a.{i}.forward": %s' % record.replace('"float", "value": 1.0', '"int", "value": -9223372036854775809'),
        '"F.a.{i}.forward": %s' % record.replace('"float", "value": 1.0', '"int", "value": 18446744073709551615'),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 123456789012345678901', 1),
        '"F.a.{i}.forward": %s' % record.replace('"shape": [2]', '"shape": [123456789012345678901]', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 1.0000000000000000000001', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 0.00012345678901234567', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 1234567890123456789012.5', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 1234567890123456789012e-3', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 1e-0000000000000000000005', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Max": 1.0', '"Max": 1E+0000000000000000000005', 1),
        '"F.a.{i}.forward": %s' % record.replace('"Min": 0.0', '"Min": -1234567890123456789012', 1),
        '"F.a.{i}.forward":%s' % record,                                    # no space after the colon
        '"F.a.{i}.forward" : %s' % record,
        '"F.a.{i}.forward": %s   ' % record,                                # spaces after the record
        '"F.a.{i}.forward": %s\r' % record,                                 # a CRLF line
        '"F.a.{i}.forward": null',
        '"F.a.{i}.forward": [1, 2]',
        '"F.a.{i}.forward": ',
        '"": %s' % record,                                                  # an empty name
        '"F.a.{i}\tforward": %s' % record,                                  # a control character in the name
        '"F.a.{i}.forward": %s}' % record,                                   # a brace too many
        '"F.a.{i}.forward": {"output": [%s]' % t,                           # one too few
        '"F.a.{i}.forward": {"output": [%s], "input_args": [1, {"k": [%s]}]}' % (t, t),  # record_rows' kind
        '"F.a.{i}.forward": {"output": [%s]}' % t.replace('"Max": 1.0', '"Max": 1'),
        '"F.a.{i}.forward": {"output": [%s]}' % t.replace('"dtype": "torch.float32", ', ""),
        '"F.a.{i}.forward": {"output": [%s]}' % t.replace('"torch.float32"', '"torch.\u00e9"'),
        '"F.a.0.forward": %s' % record,                                     # a name met before
        '"F.a.{i}.forward\\"": %s' % record,
        '"F.a.{i}.forward": %s' % record.replace("1.0}", "1e400}", 1),     # beyond a float: json says inf
    ]


def _damaged_lines(rng, t: str) -> str:
    """A dump in our layout of 3 to 40 records, each a random variant of _line_variants; now and then a
    line's end, comma or the closing braces changed."""
    variants = _line_variants(t)
    lines = [(variants[0] if rng.random() < 0.85 else rng.choice(variants)).replace("{i}", str(i))
             for i in range(rng.randint(3, 40))]
    text = '{"task": "statistics", "level": "L1", "data": {\n' + ",\n".join(lines) + "\n}}\n"
    for _ in range(rng.choice([0, 0, 1, 2])):
        at = rng.randrange(len(text))
        text = text[:at] + rng.choice(["", "\n", ",", "\r\n", "}}\n", " ", "\u00e9"]) + text[at + rng.randrange(2):]
    return text


@c_route
@pytest.mark.parametrize("seed", range(6))
def test_record_lines_read_the_same_through_c_and_python(tmp_path, monkeypatch, seed):
    """Files of line variants, some damaged, read in chunks of 1 byte to a whole file: the C route gives the
    same table (or None) as the Python one, and the table json's reading of the file."""
    import random

    rng = random.Random(seed)
    t = T % "1.0"
    path = str(tmp_path / "dump.json")
    kinds = set()
    for i in range(60):
        text = _damaged_lines(rng, t)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        python = _table_by("Python", path, monkeypatch)
        with monkeypatch.context() as m:
            m.setattr(table_module, "_LINES", rng.choice([1, 7, 100, 1 << 20]))
            c = _table_by("C", path, monkeypatch)
        assert_same_tables(c, python)
        if c is not None:
            assert_table_is_record_rows(c, path)
        kinds.add(c is None)
    assert kinds == {True, False}


@c_route
def test_each_line_variant_reads_the_same_through_c_and_python(tmp_path, monkeypatch):
    t = T % "1.0"
    path = str(tmp_path / "dump.json")
    read = 0
    for k, variant in enumerate(_line_variants(t)):
        lines = ['"F.b.0.forward": {"output": [%s]}' % t, variant.replace("{i}", "1"), '"F.b.1.forward": {}']
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write('{"task": "statistics", "data": {\n' + ",\n".join(lines) + "\n}}")  # no end of line at the end
        c, python = _table_by("C", path, monkeypatch), _table_by("Python", path, monkeypatch)
        assert_same_tables(c, python)
        read += c is not None
    assert 10 < read < len(_line_variants(t))


@c_route
@pytest.mark.parametrize("depth", [1005, 1015])
def test_a_record_too_deep_for_its_rows_is_refused_by_both_routes(tmp_path, monkeypatch, depth):
    """A value's dtype nested a thousand deep: orjson reads the line, making its row's text (str) runs out of
    recursion; both routes refuse the file (the C route used to lose that error and raise SystemError)."""
    path = tmp_path / "dump.json"
    dtype = "[" * depth + "]" * depth
    path.write_text('{"data": {\n"F.f.0.forward": {"output": [{"type": "x", "dtype": %s}]}\n}}\n' % dtype)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default (importing mindspore raises it); orjson reads 1,024 levels
    try:
        assert _table_by("C", str(path), monkeypatch) is None
        assert _table_by("Python", str(path), monkeypatch) is None
    finally:
        sys.setrecursionlimit(limit)
