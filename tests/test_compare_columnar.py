"""The columnar route of compare (compare/columnar.py) says what the call-by-call route says.

Each case compares one pair twice: as compare does (the columnar route where the pair is of its kind) and with
the columns turned off (sequence.walk, call by call), and requires the same summary, table and report, byte
for byte. The dumps are real (the seeded transformer of test_compare, at L1) and variants of them with planted
faults and with many random changes (noise of every size, NaN, shapes, dtypes, settings, calls left out).
"""
from __future__ import annotations

import copy
import json
import os
import random
import re

import pytest

from test_compare import dump_transformer

from msprobe_lite.compare import api, columnar, compare
from msprobe_lite.core.writer import dump_json_chunks


def _outputs(folder) -> dict:
    """The files compare wrote, with what names the run (its folder, its timestamp) taken out."""
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read().replace(str(folder), "OUT")
        out[re.sub(r"\d{14}", "T", name)] = re.sub(r"\d{14}", "T", text)
    return out


def both_routes(target, golden, tmp_path, monkeypatch, **kw) -> bool:
    """Compare through both routes; assert the same files; return whether the columnar route took the pair."""
    taken = []
    walk = columnar.walk

    def spy(*args, **kwargs):
        walked = walk(*args, **kwargs)
        taken.append(walked is not None)
        return walked
    with monkeypatch.context() as m:
        m.setattr(columnar, "walk", spy)
        compare(str(target), str(golden), str(tmp_path / "columns"), quiet=True, **kw)
    with monkeypatch.context() as m:
        m.setattr(api, "_tables", lambda *args: None)
        compare(str(target), str(golden), str(tmp_path / "calls"), quiet=True, **kw)
    columns, calls = _outputs(tmp_path / "columns"), _outputs(tmp_path / "calls")
    assert columns.keys() == calls.keys()
    for name in columns:
        assert columns[name] == calls[name], name
    return all(taken) and bool(taken)


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return dump_transformer(tmp_path_factory.mktemp("golden") / "d", level="L1")


def test_identical_runs(tmp_path, monkeypatch, golden):
    target = dump_transformer(tmp_path / "t", level="L1")
    assert both_routes(target, golden, tmp_path, monkeypatch)


@pytest.mark.parametrize("fault", ["gelu", "ln_eps", "scale", "overflow", "extra"])
def test_planted_faults(tmp_path, monkeypatch, fault):
    boost = 2e4 if fault == "overflow" else 1.0
    golden = dump_transformer(tmp_path / "g", level="L1", boost=boost)
    target = dump_transformer(tmp_path / "t", level="L1", fault=fault, boost=boost)
    taken = both_routes(target, golden, tmp_path, monkeypatch)
    # calls only in the target (the extra call; overflow's casts to fp16 and back): pairing is not one to one
    assert taken == (fault not in ("extra", "overflow"))


def _leaves(value):
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            yield value
        else:
            for v in value.values():
                yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)


def _mutated(data: dict, rng: random.Random, forward_only: bool, shapes: bool) -> dict:
    """The records with random changes, each of a kind that compare meets in real runs."""
    data = copy.deepcopy(data)
    if forward_only:
        data = {name: record for name, record in data.items() if ".backward" not in name}
    for record in data.values():
        for leaf in _leaves(record):
            if "Max" not in leaf or not isinstance(leaf.get("Max"), float):
                if "value" in leaf and rng.random() < 0.02:
                    leaf["value"] = leaf["value"] * 2 if isinstance(leaf["value"], (int, float)) else "other"
                continue
            roll = rng.random()
            if roll < 0.35:
                continue
            if roll < 0.75:  # noise of any size, on one or more statistics
                scale = 10.0 ** rng.uniform(-9, -2)
                for key in rng.sample(["Max", "Min", "Mean", "Norm"], rng.randint(1, 4)):
                    leaf[key] = leaf[key] * (1 + scale * rng.uniform(-1, 1))
            elif roll < 0.8:
                leaf["Mean"] = leaf["Mean"] * 1.5 + 0.1
            elif roll < 0.82:
                leaf["Max"] = float("nan") if rng.random() < 0.5 else float("inf")
            elif roll < 0.84 and shapes:  # the call's signature differs: pairing aligns the group by order
                leaf["shape"] = list(leaf["shape"]) + [1]
            elif roll < 0.87:
                leaf["dtype"] = "torch.bfloat16"
            elif roll < 0.88:
                leaf["Max"] = leaf["Min"] = 0.0
                leaf["Norm"] = 0.0
            elif roll < 0.89:
                leaf["Max"] = int(leaf["Max"])
    return data


def _write(folder, header: dict, data: dict, layout: str) -> None:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "dump.json")
    if layout == "lines":  # our dumper's: a record per line
        class Record:
            def __init__(self, name, value):
                self.name, self.data = name, value
        with open(path, "wb") as f:
            for piece in dump_json_chunks(header, [Record(n, v) for n, v in data.items()]):
                f.write(piece)
    else:
        with open(path, "w") as f:
            json.dump(dict(header, data=data), f, indent=1 if layout == "indented" else None)


@pytest.mark.parametrize("seed", range(12))
def test_random_changes(tmp_path, monkeypatch, golden, seed):
    """Variants of the real dump: at step 0 or a later one, one process or a rank of several, with and without
    backward records, in the three layouts a dump.json comes in."""
    rng = random.Random(seed)
    with open(os.path.join(golden, "step0", "rank", "dump.json")) as f:
        content = json.load(f)
    header = {k: v for k, v in content.items() if k != "data"}
    forward_only, shapes = seed % 4 == 3, seed % 4 == 1
    step, rank = ("step1" if seed % 2 else "step0"), ("rank1" if seed % 3 == 2 else "rank")
    layout = ("lines", "indented", "line")[seed % 3]
    base = content["data"] if not forward_only else {n: r for n, r in content["data"].items() if ".backward" not in n}
    _write(tmp_path / "g" / step / rank, header, base, layout)
    _write(tmp_path / "t" / step / rank, header, _mutated(content["data"], rng, forward_only, shapes), layout)
    taken = both_routes(tmp_path / "t" / step / rank, tmp_path / "g" / step / rank, tmp_path, monkeypatch)
    assert taken == (not shapes)


def test_floats_are_spelled_as_python_spells_them(monkeypatch):
    """The table's numbers, formatted by polars, read as the csv module writes them (repr): the shortest
    digits, Python's exponents (1e-05, 2.5e-07, 1e+16), inf and nan as cell() spells them."""
    import numpy as np

    from msprobe_lite.compare import report
    from msprobe_lite.compare.report import _spelled, cell, spelled

    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.random(20000) * np.exp(rng.uniform(-745, 709, 20000)),            # every magnitude
        rng.random(20000) * 10.0 ** rng.integers(-10, 18, 20000),             # around the spellings' borders
        np.frombuffer(rng.bytes(8 * 20000), dtype=np.float64),                # any bits: subnormals, NaN payloads
        [1e-05, 1e-04, 9.999999999999999e-05, 1e-09, 9.99999999999e-10, 1e16, 9999999999999998.0, 5e-324,
         1.7976931348623157e308, 0.1, 0.0, -0.0, np.inf, -np.inf, np.nan, -1e-05, -2.5e-07]])
    values = np.concatenate([values, -values])
    expected = [str(cell(v)) for v in values.tolist()]
    assert _spelled(values).to_list() == expected  # polars' own digits, respelled: the fast way
    assert spelled(values).to_list() == expected
    # a polars that spells a probe otherwise (its versions do): repr itself, the same text
    monkeypatch.setattr(report, "_SPELLS_RIGHT", False)
    assert spelled(values[:2000]).to_list() == expected[:2000]


@pytest.mark.parametrize("seed", range(3))
def test_table_blocks_render_as_the_csv_module_writes_them(monkeypatch, seed):
    """A block of the table (names, numbers of every magnitude, NaN, empty and odd cells) rendered by polars,
    its float columns written as floats where polars writes them as repr does and as text elsewhere, is the
    csv module's text; so is it with every column as text (a polars that writes a probe otherwise)."""
    import numpy as np
    import polars as pl

    from msprobe_lite.compare import report

    rng = np.random.default_rng(seed)
    lines, number_columns = 3000, [f"n{j}" for j in range(8)]
    scales = [1.0, 1e-7, 1e-5, 1e20, 1e-300]  # columns of usual values, and of values polars spells otherwise
    numbers = np.stack([rng.standard_normal(lines) * scales[j % len(scales)] for j in range(8)], axis=1)
    numbers[rng.random(numbers.shape) < 0.01] = np.nan
    numbers[rng.random(numbers.shape) < 0.001] = np.inf
    numbers[:, 0] = rng.integers(-5, 5, lines)  # whole floats: 3.0
    numbers[:, 1] = 0.0
    numbers[::97, 6] = 3e-6  # a rare value polars spells otherwise, in a column of usual ones
    empty = rng.random(numbers.shape) < 0.05
    empty[:, 7] = False
    cells = {"n2": {5: "text, with a comma", 9: 7}, "n7": {0: True}}
    names = [f'F.op{i % 7}.{i}.forward, "quoted"' if i % 50 == 0 else f"F.op{i % 7}.{i}.forward" for i in range(lines)]
    texts = {"name": pl.Series(names, dtype=pl.Utf8), "result": pl.Series(["pass"] * lines, dtype=pl.Utf8)}
    columns = ["name", *number_columns, "result"]
    block = report.Block(texts, numbers, number_columns, empty, cells)
    expected = report._render_block_python(columns, block)
    monkeypatch.setattr(report, "_WRITES_RIGHT", None)
    assert report._render_block(columns, block) == expected
    written = report._written_as_floats(numbers, empty)
    assert written[1] and not written[6] and report._WRITES_RIGHT  # the probe passed: some columns stay floats
    monkeypatch.setattr(report, "_WRITES_RIGHT", False)
    assert report._render_block(columns, block) == expected


def _ranks(tmp_path, golden, target_fault="ln_eps"):
    """A dump root of two ranks of one step each side (the same run's dump in each rank folder)."""
    import shutil

    target = dump_transformer(tmp_path / "one", level="L1", fault=target_fault)
    for side, source in (("t", target), ("g", golden)):
        for rank in ("rank0", "rank1"):
            shutil.copytree(os.path.join(source, "step0", "rank"), tmp_path / side / "step0" / rank)
    return tmp_path / "t", tmp_path / "g"


def test_pairs_compared_in_forked_workers_after_polars_ran_here(tmp_path, golden):
    """Step/rank pairs go to forked processes; polars would wait for ever in one forked after its threads ran
    in the parent (an earlier compare in the same process): the workers then write the table with the csv
    module, the same text. Run in a child interpreter with a time limit, so a hang fails instead of stopping
    the suite."""
    import signal
    import subprocess
    import sys

    target, gold = _ranks(tmp_path, golden)
    script = (f"from msprobe_lite.compare import compare\n"
              f"compare({str(target / 'step0' / 'rank0')!r}, {str(gold / 'step0' / 'rank0')!r}, "
              f"{str(tmp_path / 'first')!r}, quiet=True)\n"
              f"compare({str(target)!r}, {str(gold)!r}, {str(tmp_path / 'workers')!r}, quiet=True, workers=2)\n")
    # its own process group: a hang is ended with every worker it forked, not only the interpreter
    child = subprocess.Popen([sys.executable, "-c", script], cwd=os.path.dirname(__file__) + "/..",
                             start_new_session=True)
    try:
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    compare(str(target), str(gold), str(tmp_path / "here"), quiet=True, workers=1)
    assert _outputs(tmp_path / "workers") == _outputs(tmp_path / "here")


def _edited(golden, tmp_path, edit, layout="lines"):
    """Target and golden from the real L1 dump, `edit(data, side)` applied to each side's records."""
    with open(os.path.join(golden, "step0", "rank", "dump.json")) as f:
        content = json.load(f)
    header = {k: v for k, v in content.items() if k != "data"}
    for side in ("t", "g"):
        data = copy.deepcopy(content["data"])
        edit(data, side)
        _write(tmp_path / side / "step0" / "rank", header, data, layout)
    return tmp_path / "t" / "step0" / "rank", tmp_path / "g" / "step0" / "rank"


def test_an_integer_beyond_64_bits_is_read_exactly(tmp_path, monkeypatch, golden):
    """orjson reads an integer beyond 64 bits as a float (2**70 and 2**70 + 1 alike): such a line is read by
    json, and the argument that differs is said by both routes."""
    def edit(data, side):
        record = data[next(iter(data))]
        record.setdefault("input_kwargs", {})["zz"] = {"type": "int", "value": 2 ** 70 + (side == "g")}
    target, gold = _edited(golden, tmp_path, edit)
    assert both_routes(target, gold, tmp_path, monkeypatch)
    with open(tmp_path / "columns" / "summary.json") as f:
        warning = json.load(f)["pairs"][0]["first_warning"]
    assert "argument input.zz differs: target 1180591620717411303424, golden 1180591620717411303425" in \
        warning["reason"]


def test_names_a_spreadsheet_would_run_are_neutralised_in_the_table_only(tmp_path, monkeypatch, golden):
    """A record named like a formula (`=...`): the table writes `'=...`, report.html the name itself."""
    def edit(data, side):
        name = next(n for n in data if n.startswith("Tensor.") or n.startswith("Functional."))
        record = data.pop(name)
        if side == "t":
            record["output"][0]["Mean"] *= 1.5
        data["=" + name] = record
    target, gold = _edited(golden, tmp_path, edit)
    assert both_routes(target, gold, tmp_path, monkeypatch)


def test_a_construct_json_that_is_a_fifo_is_said_not_waited_for(tmp_path, golden):
    import shutil

    folder = tmp_path / "t" / "step0" / "rank"
    shutil.copytree(os.path.join(golden, "step0", "rank"), folder)
    os.remove(folder / "construct.json")
    os.mkfifo(folder / "construct.json")
    from msprobe_lite.compare import CompareError
    with pytest.raises(CompareError, match="construct.json"):
        compare(str(folder), os.path.join(golden, "step0", "rank"), str(tmp_path / "out"), quiet=True)


def test_call_indexes_in_other_digits_compare_alike_and_do_not_fail(tmp_path, monkeypatch, golden):
    """A call index that str.isdigit() takes and int() does not (a superscript two) is no index, one in another
    script's decimal digits (Arabic-Indic one) is: both routes read them so, where the index used to raise."""
    with open(os.path.join(golden, "step0", "rank", "dump.json"), encoding="utf-8") as f:
        content = json.load(f)
    data = content.pop("data")
    names = list(data)
    odd = {names[3]: "Functional.odd.\u00b2.forward", names[5]: "Functional.odd.\u0661.forward",
           names[7]: "Functional.odd.\u0661.backward"}
    data = {odd.get(name, name): record for name, record in data.items()}
    for side in ("t", "g"):
        _write(tmp_path / side / "step0" / "rank", content, data, "lines")
    assert both_routes(tmp_path / "t" / "step0" / "rank", tmp_path / "g" / "step0" / "rank", tmp_path, monkeypatch)
