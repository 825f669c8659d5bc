"""Compare: older layouts of the reference tool's dumps, unreadable files, tensor mode in processes, the
streamed result table and the progress bar."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msprobe_lite.compare import CompareError, compare, report, tensors
from msprobe_lite.compare import metrics
from msprobe_lite.compare.read import load_dump
from msprobe_lite.compare.rows import INPUT, OUTPUT

DATA = os.path.join(os.path.dirname(__file__), "data")
CURRENT = os.path.join(DATA, "msprobe_L0", "step0")          # mindstudio-probe 26.x
V1_0 = os.path.join(DATA, "msprobe_v1.0_L0", "step0")        # see data/make_old_layouts.py
V1_2 = os.path.join(DATA, "msprobe_v1.2_L0", "step0")


def run(target, golden, out, **kw):
    return compare(str(target), str(golden), str(out), quiet=True, **kw)


def rows_of(pair):
    with open(pair["result_file"], newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# -- older layouts of the reference tool ------------------------------------------------------------------
def test_version_1_0_backward_records_grad_input_and_grad_output(tmp_path):
    dump = load_dump(os.path.join(V1_0, "rank", "dump.json"))
    assert dump.framework == "" and dump.stacks["Module.fc1.Linear.forward.0"]
    rows = dump.rows("Module.fc2.Linear.backward.0")
    # grad_output (what flows into the backward) is its input, grad_input (what it produces) its output
    assert [(r.name.rsplit(".", 2)[-2], r.role) for r in rows] == [("input", INPUT), ("output", OUTPUT)]
    (pair,) = run(CURRENT, V1_0, tmp_path / "out").pairs
    assert pair["first_divergence"] is None and pair["counts"]["error"] == 0
    # 1.0 wrote no parameter gradients: the current dump's two are unmatched, everything else pairs
    assert pair["counts"]["unmatched_target"] == 2 and pair["counts"]["unmatched_golden"] == 0
    by_name = {r["NPU Name"]: r for r in rows_of(pair)}
    assert by_name["Module.fc2.Linear.backward.0.output.0"]["Bench Name"] == "Module.fc2.Linear.backward.0.output.0"
    assert by_name["Module.fc2.Linear.backward.0.output.0"]["Result"] == "pass"
    assert by_name["Module.fc1.Linear.forward.0.parameters.weight"]["Result"] == "unmatched"


def test_parameter_gradients_without_a_call_index_pair_with_current_ones(tmp_path):
    (pair,) = run(CURRENT, V1_2, tmp_path / "out").pairs
    assert pair["counts"] == {"pass": 8, "warning": 0, "error": 0, "unmatched_target": 0, "unmatched_golden": 0}
    by_name = {r["NPU Name"]: r for r in rows_of(pair)}
    row = by_name["Module.fc1.Linear.parameters_grad.0.weight"]
    assert row["Bench Name"] == "Module.fc1.Linear.parameters_grad.weight" and row["Result"] == "pass"
    (pair,) = run(V1_2, CURRENT, tmp_path / "out2").pairs   # and the other way round
    assert pair["counts"]["pass"] == 8 and pair["counts"]["unmatched_golden"] == 0
    (pair,) = run(V1_0, V1_2, tmp_path / "out3").pairs      # two old layouts
    assert pair["counts"]["error"] == 0 and pair["counts"]["unmatched_golden"] == 2
    assert pair["counts"]["unmatched_target"] == 0


def test_integers_of_another_width_are_compared_by_value(tmp_path):
    """MindSpore's CrossEntropyLoss takes Int32 labels, PyTorch's int64: every clean port's compare named the
    loss "dtype differs: Int32 vs torch.int64" (a trial). Integers of other widths compare by value; an
    integer against a float is still another call (it does not pair)."""
    def dump(folder, dtype):
        labels = {"type": "torch.Tensor", "dtype": dtype, "shape": [4], "Max": 3, "Min": 0, "Mean": 1.5,
                  "Norm": 3.74}
        os.makedirs(folder)
        with open(os.path.join(folder, "dump.json"), "w") as f:
            json.dump({"task": "statistics", "level": "L1", "dump_data_dir": None,
                       "data": {"Functional.cross_entropy.0.forward": {"input_args": [labels], "output": []}}}, f)
        return folder

    (pair,) = run(dump(tmp_path / "t" / "rank0", "Int32"), dump(tmp_path / "g" / "rank0", "torch.int64"),
                  tmp_path / "out").pairs
    assert pair["counts"]["pass"] == 1
    (pair,) = run(dump(tmp_path / "t2" / "rank0", "torch.float32"), dump(tmp_path / "g2" / "rank0", "torch.int64"),
                  tmp_path / "out2").pairs
    assert pair["counts"]["unmatched_target"] == pair["counts"]["unmatched_golden"] == 1  # another call


def test_a_process_group_is_a_row_compared_by_its_ranks(tmp_path):
    """So are a reduce op and a memory format (as the reference tool writes them too)."""
    def dump(folder, ranks):
        op, memory = ("SUM", "contiguous_format") if ranks == [0, 1] else ("MAX", "channels_last")
        record = {"input_args": [{"type": "torch.ProcessGroup", "group_ranks": ranks, "group_id": "1"}],
                  "input_kwargs": {"op": {"type": "torch.distributed.ReduceOp", "value": f"RedOpType.{op}"},
                                   "memory_format": {"type": "torch.memory_format", "format": memory}},
                  "output": []}
        os.makedirs(folder)
        with open(os.path.join(folder, "dump.json"), "w") as f:
            json.dump({"task": "statistics", "level": "L1", "dump_data_dir": None,
                       "data": {"Distributed.barrier.0.forward": record}}, f)
        return folder

    (pair,) = run(dump(tmp_path / "t" / "rank0", [0, 1]), dump(tmp_path / "g" / "rank0", [0, 2]),
                  tmp_path / "out").pairs
    group, op, memory = rows_of(pair)
    assert group["NPU Name"] == "Distributed.barrier.0.forward.input.0" and group["NPU Dtype"] == "torch.ProcessGroup"
    assert group["Result"] == "warning" and "differs: target [0, 1], golden [0, 2]" in group["Err_message"]
    assert "differs: target 'RedOpType.SUM', golden 'RedOpType.MAX'" in op["Err_message"]
    assert "differs: target 'contiguous_format', golden 'channels_last'" in memory["Err_message"]


# -- unreadable files: one DumpError naming the file, never a traceback from deep inside ------------------
def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("file,content,expected", [
    ("dump.json", '{"task": "statistics", "data": {"a": {"output": [{"type": "torch.Tensor", "dtype": '
     '"torch.float32", "shape": "2x3"}]}}}', "record 'a': row a.output.0: the tensor's \"shape\" is '2x3'"),
    ("dump.json", '{"data": {}, "dump_data_dir": 3}', '"dump_data_dir" is 3, expected a folder path or null'),
    ("stack.json", '{"0": [["Module.fc1.Linear.forward.0"], [1, 2]]}', "entry '0': expected [[record names]"),
    ("stack.json", '[1]', "expected an object of call stacks"),
    ("construct.json", '{"Module.fc1.Linear.forward.0": ["x"]}', "the parent of 'Module.fc1.Linear.forward.0'"),
    ("construct.json", '', "not valid JSON"),
])
def test_malformed_files_are_named_with_what_was_expected(tmp_path, file, content, expected):
    folder = _copy(os.path.join(V1_2, "rank"), tmp_path / "d" / "step0" / "rank")
    (folder / file).write_text(content)
    with pytest.raises(CompareError) as info:
        run(folder, V1_2, tmp_path / "out")
    assert str(folder / file) in str(info.value) and expected in str(info.value)


def test_a_rank_folder_without_its_dump_json_is_named(tmp_path):
    """A dump root whose rank folder holds no dump.json (a run that recorded nothing, or one still writing)
    read only the generic "no dump found"; the folder is now named."""
    (tmp_path / "d" / "step0" / "rank").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match=r"d: no dump found: step0/rank holds no dump.json \(a run that recorded "
                                           r"nothing there, or one still writing\); expected a dump.json"):
        run(tmp_path / "d", V1_2, tmp_path / "out")
    with pytest.raises(CompareError, match=r"empty: no dump found: expected a dump.json"):
        run(tmp_path / "empty", V1_2, tmp_path / "out")


_JUNK = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
                         ["type", "dtype", "shape", "Max", "value", "x"]), inner, max_size=4), max_leaves=6)


def _paths(value, path=()):
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, path + (key,))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(file=st.sampled_from(["dump.json", "dump.json", "stack.json", "construct.json"]), data=st.data())
def test_any_damaged_dump_compares_or_fails_with_a_compare_error(tmp_path_factory, file, data):
    folder = _copy(os.path.join(V1_2, "rank"), tmp_path_factory.mktemp("fuzz") / "step0" / "rank")
    with open(folder / file) as f:
        content = json.load(f)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(content))[1:]))
        parent = content
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = data.draw(_JUNK)
    (folder / file).write_text(json.dumps(content))
    for target, golden in ((folder, V1_2), (V1_2, folder)):
        try:
            run(target, golden, folder.parent / "out")
        except CompareError as exc:
            assert str(folder) in str(exc)


# -- tensor mode in processes -------------------------------------------------------------------------------
def _tensor_dump(folder, arrays):
    """A tensor-mode dump (MindSpore style .npy files) with one record per array."""
    data_dir = folder / "dump_tensor_data"
    data_dir.mkdir(parents=True)
    data = {}
    for i, array in enumerate(arrays):
        name = f"Functional.op.{i}.forward"
        np.save(data_dir / f"{name}.output.0.npy", array)
        data[name] = {"input_args": [], "input_kwargs": {}, "output": [
            {"type": "mindspore.Tensor", "dtype": "Float32", "shape": list(array.shape), "Max": float(array.max()),
             "Min": float(array.min()), "Mean": float(array.mean()), "Norm": float(np.linalg.norm(array)),
             "data_name": f"{name}.output.0.npy"}]}
    with open(folder / "dump.json", "w") as f:
        json.dump({"task": "tensor", "level": "L1", "framework": "mindspore", "dump_data_dir": str(data_dir),
                   "data": data}, f)
    return folder


def test_tensor_pairs_in_processes_give_the_same_table(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    golden = [rng.standard_normal(500).astype(np.float32) for _ in range(12)]
    target = [g + (1e-2 if i == 5 else 0) for i, g in enumerate(golden)]
    t = _tensor_dump(tmp_path / "t" / "rank0", target)
    g = _tensor_dump(tmp_path / "g" / "rank0", golden)
    serial = run(t, g, tmp_path / "serial", workers=1).pairs[0]
    started = []
    import concurrent.futures as cf

    class Pool(cf.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            started.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cf, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(tensors, "PARALLEL_MIN_ELEMENTS", 0)
    parallel = run(t, g, tmp_path / "parallel", workers=2).pairs[0]
    assert started and started[0][0] == 2
    assert open(parallel["result_file"]).read() == open(serial["result_file"]).read()
    assert parallel["first_divergence"]["name"] == "Functional.op.5.forward"
    monkeypatch.setattr(tensors, "PARALLEL_MIN_ELEMENTS", 10 ** 9)   # small work: no processes
    started.clear()
    run(t, g, tmp_path / "small", workers=2)
    assert not started


def test_measuring_a_tensor_pair_holds_chunks_not_tensors(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(metrics, "CHUNK", 1 << 16)
    n = 1 << 22   # 32 MB per float64 copy of a whole tensor, 0.5 MB per chunk
    a = np.linspace(-1, 1, n, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a * np.float32(1.001))
    del a
    tracemalloc.start()
    try:
        m = tensors.measure((str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "t", "g", 1.2e-7))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert math.isclose(m["Cosine"], 1.0, abs_tol=1e-9) and m["MaxRelativeErr"] < 2e-3
    assert peak < n * 8 / 8   # chunk temporaries only: the files are memory-mapped, never copied whole


def test_missing_tensor_file_is_its_records_error_naming_it(tmp_path):
    """Issue 29: a missing file errs its record, named, and the rest is compared (it stopped the compare)."""
    t = _tensor_dump(tmp_path / "t" / "rank0", [np.ones(3, np.float32), np.ones(3, np.float32)])
    g = _tensor_dump(tmp_path / "g" / "rank0", [np.ones(3, np.float32), np.ones(3, np.float32)])
    os.remove(t / "dump_tensor_data" / "Functional.op.0.forward.output.0.npy")
    pair = run(t, g, tmp_path / "out").pairs[0]
    assert pair["counts"]["error"] == 1 and pair["counts"]["pass"] == 1
    assert "Functional.op.0.forward.output.0.npy: missing" in pair["tensor_files_not_read"][0]


# -- the result table and the progress bar ----------------------------------------------------------------
def test_streamed_table_in_a_second_process_is_the_same_file(tmp_path, monkeypatch):
    columns = ["NPU Name", "Max diff", "NPU Tensor Shape", "Err_message"]
    rows = [{"NPU Name": f"=op{i}" if i % 7 == 0 else f"op{i}", "Max diff": [math.inf, math.nan, 0.1 * i, None][i % 4],
             "NPU Tensor Shape": [i, 2], "Err_message": "a, \"b\"\nc" if i % 5 == 0 else ""} for i in range(95)]
    report.write_csv(tmp_path / "whole.csv", columns, rows)
    monkeypatch.setattr(report.CsvSink, "CHUNK", 10)
    for background in (False, True):
        sink = report.CsvSink(str(tmp_path / f"streamed{background}.csv"), columns, background=background)
        for i in range(0, len(rows), 3):
            sink.add(rows[i:i + 3])
        sink.close()
        assert (tmp_path / f"streamed{background}.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()


def test_progress_bar_only_on_a_terminal(tmp_path, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = tensors.Progress("measuring tensors", stream)
    bar(5, 10)
    bar(10, 10)
    bar.close()
    assert "measuring tensors [###############...............] 5/10" in stream.getvalue()
    assert stream.getvalue().endswith("\r\033[K")
    compare(CURRENT, V1_2, str(tmp_path / "out"))     # stderr is not a terminal under pytest: nothing drawn
    assert capsys.readouterr().err == ""


def test_a_bar_over_many_step_rank_pairs_is_cleared_before_each_answer(tmp_path, monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    rank = next(os.path.join(CURRENT, d) for d in sorted(os.listdir(CURRENT)))
    for side in ("t", "g"):
        for r in (0, 1, 2):
            shutil.copytree(rank, tmp_path / side / "step0" / f"rank{r}")
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    compare(str(tmp_path / "t"), str(tmp_path / "g"), str(tmp_path / "out"), workers=1)
    drawn = err.getvalue()
    assert "comparing step/rank pairs [" in drawn and "] 3/3" in drawn and drawn.endswith("\r\033[K")
    assert capsys.readouterr().out.startswith("[step 0 ranks 0-2] ")  # the three agree: one block


def test_cli_workers_must_be_positive(capsys):
    from msprobe_lite.cli import main

    assert main(["compare", "-tp", "a", "-gp", "b", "-n", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_the_package_is_the_function(tmp_path):
    """`msprobe_lite.compare(target, golden, output_dir)` as the docs show (it is also the subpackage)."""
    import msprobe_lite
    from msprobe_lite.compare import compare as function

    with pytest.raises(msprobe_lite.compare.CompareError, match="no such"):
        msprobe_lite.compare(str(tmp_path / "missing"), str(tmp_path / "missing"), str(tmp_path / "out"))
    assert callable(msprobe_lite.compare) and function is msprobe_lite.compare.compare
