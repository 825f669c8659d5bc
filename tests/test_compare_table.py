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
