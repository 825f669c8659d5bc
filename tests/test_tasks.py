"""Every task and summary mode: md5, tensor (+ tensor_list), async_dump, debug save(), structure, overflow_check."""
from __future__ import annotations

import json
import os
import zlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import assert_stats, data, load
from models import make, train

from msprobe_lite.pytorch import PrecisionDebugger
from msprobe_lite.pytorch.summary import crc32_hex


def debugger(tmp_path, **cfg):
    body = {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L1"}
    body.update(cfg)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(body))
    return PrecisionDebugger(str(tmp_path / "config.json"))


def once(d, fn, model=None):
    d.start(model=model)
    fn()
    d.stop()
    d.step()


def rank_dir(tmp_path, step=0):
    return tmp_path / "dump" / f"step{step}" / "rank"


def test_a_dump_path_holding_an_earlier_run_is_said(tmp_path, capsys):
    """A 2-step run into the folder of a 3-step run kept the old step2, and compare read it as the new run's
    (a new user's trial); nothing said so. The first start() that dumps says it, once."""
    for steps in (3, 2):
        d = debugger(tmp_path)
        for _ in range(steps):
            once(d, lambda: torch.ones(2) + 1)
    err = capsys.readouterr().err
    assert err.count("already holds") == 1
    assert "already holds step0, step1, step2 (rank/) of an earlier run" in err
    assert sorted(os.listdir(tmp_path / "dump")) == ["step0", "step1", "step2"]   # nothing removed


def test_start_again_without_step_is_said_once(tmp_path, capsys):
    """A loop that forgot debugger.step() put every iteration's calls into step 0, numbered on, with no word
    (a new user's trial). Micro-batches may do it on purpose: said once, and the calls are still recorded."""
    d = debugger(tmp_path)
    x = torch.ones(2)
    for _ in range(3):
        d.start()
        torch.tanh(x)
        d.stop()
    d.step()
    assert list(data(tmp_path / "dump")) == [f"Torch.tanh.{i}.forward" for i in range(3)]
    err = capsys.readouterr().err
    assert err.count("start() again after stop() without step()") == 1


# -- md5 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                                   torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64])
def test_crc_equals_zlib_of_the_raw_bytes(dtype):
    g = torch.Generator().manual_seed(1)
    t = (torch.randn(4, 5, generator=g) * 50).to(dtype)
    expected = zlib.crc32(t.contiguous().numpy().tobytes() if dtype != torch.bfloat16
                          else t.view(torch.int16).numpy().tobytes())
    assert crc32_hex(t) == f"{expected:08x}"
    nc = t.t()  # non-contiguous: hashed as its C-contiguous copy
    assert crc32_hex(nc) == f"{zlib.crc32(nc.contiguous().view(torch.uint8).numpy().tobytes()):08x}"


def test_md5_mode_hashes_the_value_at_that_moment(tmp_path):
    x = torch.randn(3, 4)
    d = debugger(tmp_path, statistics={"summary_mode": "md5"})

    def program():
        y = torch.exp(x)
        want = f"{zlib.crc32(y.numpy().tobytes()):08x}"
        y.mul_(0)            # an in-place change right after the call must not change the hash
        program.want = want

    once(d, program)
    out = data(tmp_path / "dump")["Torch.exp.0.forward"]["output"][0]
    assert out["md5"] == program.want and len(out["md5"]) == 8
    assert list(out)[-1] == "md5" and "Max" in out


# -- tensor ----------------------------------------------------------------------------------------------
def test_tensor_task_saves_every_tensor_equal_to_the_live_value(tmp_path):
    x = torch.randn(3, 4)
    w = torch.randn(2, 4, dtype=torch.bfloat16)
    live = {}

    def program():
        y = F.linear(x, w.float())
        live["y"] = y.clone()
        y.add_(100)          # after the call: the saved file must hold the value at the call
        live["z"] = torch.tanh(w)

    d = debugger(tmp_path, task="tensor")
    once(d, program)
    folder = rank_dir(tmp_path)
    dump = load(tmp_path / "dump")
    assert dump["dump_data_dir"] == str(folder / "dump_tensor_data")
    lin = dump["data"]["Functional.linear.0.forward"]
    assert lin["input_args"][0]["data_name"] == "Functional.linear.0.forward.input.0.pt"
    assert lin["output"][0]["data_name"] == "Functional.linear.0.forward.output.0.pt"
    files = folder / "dump_tensor_data"
    saved_y = torch.load(files / lin["output"][0]["data_name"], weights_only=True)
    assert torch.equal(saved_y, live["y"])
    assert torch.equal(torch.load(files / lin["input_args"][0]["data_name"], weights_only=True), x)
    tanh = dump["data"]["Torch.tanh.0.forward"]
    saved_w = torch.load(files / tanh["input_args"][0]["data_name"], weights_only=True)
    assert saved_w.dtype == torch.bfloat16 and torch.equal(saved_w, w)
    assert all(os.stat(files / f).st_mode & 0o777 == 0o640 for f in os.listdir(files))


def test_tensor_task_module_level_names(tmp_path):
    model, x, y = make("mlp")
    d = debugger(tmp_path, task="tensor", level="L0")
    once(d, lambda: F.cross_entropy(model(x), y).backward(), model)
    names = set(os.listdir(rank_dir(tmp_path) / "dump_tensor_data"))
    for expected in ["Module.fc1.Linear.forward.0.input.0.pt", "Module.fc1.Linear.forward.0.parameters.weight.pt",
                     "Module.fc1.Linear.forward.0.output.0.pt", "Module.fc2.Linear.backward.0.input.0.pt",
                     "Module.fc2.Linear.backward.0.output.0.pt", "Module.fc1.Linear.parameters_grad.0.weight.pt"]:
        assert expected in names, expected
    grad = torch.load(rank_dir(tmp_path) / "dump_tensor_data" / "Module.fc1.Linear.parameters_grad.0.weight.pt",
                      weights_only=True)
    assert torch.equal(grad, model.fc1.weight.grad)


def _named_files(dump) -> set:
    """The data_name of every saved tensor in a dump.json's records."""
    names = set()

    def walk(v):
        if isinstance(v, dict):
            if "data_name" in v:
                names.add(v["data_name"])
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)
    walk(dump["data"])
    return names


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_calls_that_raise_leave_no_tensor_files(tmp_path, level):
    """A module call that raises has no record: its input files were left in the tensor folder, named by no
    record (a new user's trial, where activation checkpointing's recomputation stops calls early). Every file
    in the folder is now one that dump.json names."""
    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("caught by the user")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fails, self.lin = Fails(), nn.Linear(4, 4)
            self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))

        def forward(self, x):
            try:
                self.fails(x)
            except ValueError:
                pass
            h = torch.utils.checkpoint.checkpoint(self.block, self.lin(x), use_reentrant=False)
            return h.sum()

    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 4)
    d = debugger(tmp_path, task="tensor", level=level)
    once(d, lambda: model(x).backward(), model)
    files = set(os.listdir(rank_dir(tmp_path) / "dump_tensor_data"))
    named = _named_files(load(tmp_path / "dump"))
    assert files == named, (sorted(files - named), sorted(named - files))
    assert not any(f.startswith("Module.fails.") for f in files)


def test_a_call_that_raises_alone_in_a_window_leaves_no_tensor_files(tmp_path):
    """The only thing a second start()/stop() window of a step did was a call that raised: the step had
    nothing new to write, so its flush never came to remove the call's files (a review)."""
    a = torch.randn(3, 4)
    d = debugger(tmp_path, task="tensor", level="L1")
    d.start()
    torch.relu(a)
    d.stop()
    d.start()
    try:
        torch.matmul(a, torch.randn(5, 2))
    except RuntimeError:
        pass
    d.stop()
    d.step()
    files = set(os.listdir(rank_dir(tmp_path) / "dump_tensor_data"))
    assert files == _named_files(load(tmp_path / "dump")) and files, files


def test_statistics_tensor_list_saves_only_named_records(tmp_path):
    x = torch.randn(5)
    d = debugger(tmp_path, statistics={"tensor_list": ["Torch.exp"]})
    once(d, lambda: torch.sin(torch.exp(x)))
    dump = data(tmp_path / "dump")
    assert "data_name" in dump["Torch.exp.0.forward"]["output"][0]
    assert "data_name" not in dump["Torch.sin.0.forward"]["output"][0]
    assert sorted(os.listdir(rank_dir(tmp_path) / "dump_tensor_data")) == [
        "Torch.exp.0.forward.input.0.pt", "Torch.exp.0.forward.output.0.pt"]


def test_a_misspelt_tensor_list_entry_is_said(tmp_path, caplog):
    """A tensor_list entry that matched no record saved nothing and said nothing, unlike `list` and `scope`
    (a new user's trial)."""
    x = torch.randn(5)
    d = debugger(tmp_path, statistics={"tensor_list": ["Torch.exp", "Torch.expp"]})
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        once(d, lambda: torch.sin(torch.exp(x)))
    assert "tensor_list entries ['Torch.expp'] matched no dumped record name: no tensor of theirs was saved" \
        in caplog.text
    assert "'Torch.exp'" not in caplog.text.split("tensor_list entries")[1].split("matched")[0]


def test_a_block_the_task_does_not_read_is_said(tmp_path, caplog, capsys):
    """`statistics.list` with task tensor filtered nothing: all 202 tensors were saved, and `config check`
    said "valid" (a new user's trial). Both now say which settings the task does not read."""
    from msprobe_lite.cli import main

    with caplog.at_level("WARNING", logger="msprobe_lite"):
        debugger(tmp_path, task="tensor", statistics={"list": ["Torch.exp"]})
    assert "statistics.list is set but task tensor does not read it" in caplog.text
    assert main(["config", "check", str(tmp_path / "config.json")]) == 0
    assert "note: statistics.list is set but task tensor does not read it" in capsys.readouterr().out


def test_async_dump_files_identical_to_sync(tmp_path):
    def run(sub, **cfg):
        d = debugger(tmp_path / sub, task="tensor", level="mix", tensor={"list": ["Linear", "linear"]}, **cfg)
        train("mlp_inplace", steps=2, debugger=d)
        return tmp_path / sub / "dump"

    sync, asynchronous = run("sync"), run("async", async_dump=True)
    for step in ("step0", "step1"):
        a, b = sync / step / "rank", asynchronous / step / "rank"
        da, db = json.loads((a / "dump.json").read_text()), json.loads((b / "dump.json").read_text())
        assert da["data"] == db["data"] and da["data"]
        files = sorted(os.listdir(a / "dump_tensor_data"))
        assert files == sorted(os.listdir(b / "dump_tensor_data")) and files
        for f in files:
            assert torch.equal(torch.load(a / "dump_tensor_data" / f, weights_only=True),
                               torch.load(b / "dump_tensor_data" / f, weights_only=True)), f


# -- debug / save() -------------------------------------------------------------------------------------
def test_save_at_debug_level_with_gradients(tmp_path):
    x = torch.randn(3, requires_grad=True)
    d = debugger(tmp_path, level="debug")
    kept = {}

    def program():
        h = x * 2
        h.retain_grad()
        kept["h"] = h
        d.save(h, "h")
        d.save({"pair": [h, 3], "s": "text"}, "nested")
        (h ** 2).sum().backward()

    once(d, program)
    folder = rank_dir(tmp_path)
    assert sorted(os.listdir(folder)) == ["debug.json"]
    dump = load(tmp_path / "dump", name="debug.json")["data"]
    assert set(dump) == {"h.0.debug", "nested.0.debug", "h_grad.0.debug", "nested_grad.0.debug"}
    assert list(dump)[:2] == ["h.0.debug", "nested.0.debug"]
    assert_stats(dump["h.0.debug"], kept["h"])
    assert dump["nested.0.debug"]["pair"][1] == {"type": "int", "value": 3}
    assert dump["nested.0.debug"]["s"] == {"type": "str", "value": "text"}
    assert_stats(dump["h_grad.0.debug"], kept["h"].grad)
    assert_stats(dump["nested_grad.0.debug"]["pair"][0], kept["h"].grad)
    assert dump["nested_grad.0.debug"]["pair"][1] is None
    # compare finds debug.json in a rank folder, a step folder and the dump root, as it does dump.json
    from msprobe_lite.compare.api import compare
    for where in (folder, folder.parent, tmp_path / "dump"):
        (pair,) = compare(str(where), str(where), str(tmp_path / "cmp"), quiet=True, html=False).pairs
        assert pair["counts"]["pass"] == 4, where


def test_debug_dumps_compare_with_list_records_and_values_saved_on_one_side(tmp_path):
    """save() of a list is a list record (the reader refused it), and a value one run saved more of is a
    difference (a review found it read as a data_mode filter's part, and passed)."""
    from msprobe_lite.compare.api import compare

    def dump(path, extra):
        d = debugger(path, level="debug")
        values = {"a": torch.ones(2), "b": torch.zeros(2)}
        if extra:
            values["c"] = torch.ones(3)
        once(d, lambda: (d.save([torch.ones(2), 3], "pair"), d.save(values, "dict")))
        return path / "dump"

    (pair,) = compare(str(dump(tmp_path / "t", True)), str(dump(tmp_path / "g", False)), str(tmp_path / "cmp"),
                      quiet=True, html=False).pairs
    assert pair["counts"] == {"pass": 1, "warning": 1, "error": 0, "unmatched_target": 0, "unmatched_golden": 0}


def test_save_in_tensor_task_writes_files(tmp_path):
    d = debugger(tmp_path, level="debug", task="tensor", tensor={"list": ["v"]}, async_dump=False)
    v = torch.arange(4.0)
    once(d, lambda: d.save([v, v * 2], "v"))
    files = sorted(os.listdir(rank_dir(tmp_path) / "dump_tensor_data"))
    assert files == ["v.0.debug.0.pt", "v.0.debug.1.pt"]


def test_save_before_start_is_said_once(tmp_path, capsys):
    """save() records from start() until step(); one made before start() was dropped without a word. A rank
    the config leaves out says nothing of its save() calls."""
    d = debugger(tmp_path, level="debug")
    for _ in range(2):
        d.save(torch.ones(1), "early")
    once(d, lambda: d.save(torch.ones(1), "x"))
    err = capsys.readouterr().err
    assert err.count("save('early') outside start() ... step(): not recorded") == 1
    assert set(load(tmp_path / "dump", name="debug.json")["data"]) == {"x.0.debug"}
    other = debugger(tmp_path / "other", level="debug", rank=[1])  # this process counts as rank 0
    once(other, lambda: other.save(torch.ones(1), "x"))
    assert "outside start()" not in capsys.readouterr().err


def test_a_debug_step_without_save_is_said_once(tmp_path, capsys):
    """Level debug records only save(): a loop that never calls it left an empty dump folder without a word
    (a new user's trial), and compare then said only "no dump found"."""
    d = debugger(tmp_path, level="debug")
    for _ in range(2):
        once(d, lambda: torch.ones(2).sum())
    err = capsys.readouterr().err
    assert err.count("step 0: level debug recorded nothing: it records only what save(value, name) is given") == 1
    once(d, lambda: d.save(torch.ones(1), "x"))
    assert "recorded nothing" not in capsys.readouterr().err


def test_save_at_other_levels_warns(tmp_path, capsys):
    d = debugger(tmp_path, level="L1")
    once(d, lambda: d.save(torch.ones(1), "x"))
    assert "save() records only at level 'debug'" in capsys.readouterr().err


# -- structure ------------------------------------------------------------------------------------------
def test_structure_task_names_stacks_hierarchy_no_numbers(tmp_path):
    model, x, y = make("mlp")
    d = debugger(tmp_path, task="structure", level="mix")
    once(d, lambda: F.cross_entropy(model(x), y).backward(), model)
    dump = data(tmp_path / "dump")
    assert "Module.fc1.Linear.forward.0" in dump and "Functional.linear.0.backward" in dump
    assert all(v == {} for v in dump.values())
    assert load(tmp_path / "dump", name="construct.json")["Functional.linear.0.forward"] == \
        "Module.fc1.Linear.forward.0"
    assert load(tmp_path / "dump", name="stack.json")


# -- overflow_check --------------------------------------------------------------------------------------
class Overflowing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        r = torch.sqrt(h - 10.0)          # the known call: sqrt of negatives gives NaN
        return (h + r).sum()


def test_overflow_check_leaves_nothing_for_steps_without_an_overflow(tmp_path):
    """Steps with no overflow got a folder with an empty dump.json and a stack.json of every call, and the
    overflowing step's stack.json and construct.json listed calls that are not in its dump (a trial)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    d = debugger(tmp_path, task="overflow_check", level="mix")
    for scale in (1.0, 1.0, 1e30):
        once(d, lambda: (torch.exp(model(x) * scale) + 1).sum().backward(), model)
    assert sorted(os.listdir(tmp_path / "dump")) == ["step2"]
    dump = data(tmp_path / "dump", step=2)
    assert list(dump) == ["Torch.exp.0.forward"]
    stacks = load(tmp_path / "dump", step=2, name="stack.json")
    assert [names for names, _ in stacks.values()] == [["Torch.exp.0.forward"]]
    assert list(load(tmp_path / "dump", step=2, name="construct.json")) == ["Torch.exp.0.forward"]


def test_overflow_check_keeps_the_place_of_a_backward_overflow(tmp_path):
    """A gradient overflow's record is a backward one, located by its forward call's stack: stack.json kept
    only the written names and lost it (a review)."""
    x = torch.zeros(3, requires_grad=True)
    d = debugger(tmp_path, task="overflow_check")
    once(d, lambda: torch.sqrt(x).sum().backward())   # sqrt(0) is 0, its gradient infinite
    assert list(data(tmp_path / "dump")) == ["Torch.sqrt.0.backward"]
    stacks = load(tmp_path / "dump", name="stack.json")
    assert [names for names, _ in stacks.values()] == [["Torch.sqrt.0.forward"]]


class _MaskedScores(nn.Module):
    """Causal attention scores, masked with -inf as every GPT does; `overflow` makes a later fp16 product
    overflow for real."""

    def __init__(self, overflow: bool):
        super().__init__()
        self.qk, self.overflow = nn.Linear(8, 16), overflow

    def forward(self, x):
        q, k = self.qk(x).chunk(2, -1)
        att = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        h = torch.softmax(att, -1) @ q
        if self.overflow:
            h = h.half() * 1e6  # past float16's 65504
        return h.float().sum()


@pytest.mark.parametrize("overflow", [False, True])
def test_overflow_check_does_not_count_a_minus_inf_mask(tmp_path, capsys, overflow):
    """`masked_fill(mask, -inf)` puts infinities in its output from its argument: counted, the causal mask
    took the one overflow of the default overflow_nums at every step and hid a real overflow after it, and
    the offline analysis named the mask as the first overflow (a new user's trial). It is written (its
    output holds -inf) but not counted or logged; the real overflow is."""
    from msprobe_lite.compare.overflow import analyse

    torch.manual_seed(0)
    model, x = _MaskedScores(overflow), torch.randn(5, 8)
    d = debugger(tmp_path, task="overflow_check", level="L1")
    once(d, lambda: model(x), model)
    err = capsys.readouterr().err
    names = list(data(tmp_path / "dump"))
    assert names[0] == "Tensor.masked_fill.0.forward"
    result = analyse(str(tmp_path / "dump" / "step0"), str(tmp_path / "out"), quiet=True)["ranks"][0]
    assert result["first_nonfinite"]["name"] == "Tensor.masked_fill.0.forward"
    if overflow:
        assert err.count("overflow 1: Tensor.mul.0.forward produced NaN/Inf") == 1 and "overflow 2" not in err
        assert result["first_overflow"]["name"] == "Tensor.mul.0.forward" and "Tensor.mul.0.forward" in names
    else:
        assert "produced NaN/Inf" not in err and result["first_overflow"] is None


class _ExpBetweenLayers(nn.Module):
    """`torch.exp` between two layers makes Inf in the forward pass, outside any module: at L0 no module
    made it, and backward carries NaN/Inf into every gradient after."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.fc2(torch.exp(self.fc1(x) * 1e3)).sum()


def test_overflow_check_at_L0_does_not_name_gradients_that_came_in_with_their_backward(tmp_path, capsys):
    """Parameter gradients have no inputs of their own, so every one holding NaN/Inf counted as made from
    finite inputs: at L0 the first layer that backward reached (`fc2`'s gradients) was logged as overflow 1
    and named by the analysis, though the Inf came from the forward pass (a new user's trial)."""
    from msprobe_lite.compare.overflow import analyse

    torch.manual_seed(0)
    model, x = _ExpBetweenLayers(), torch.randn(3, 4)
    d = debugger(tmp_path, task="overflow_check", level="L0", overflow_check={"overflow_nums": -1})
    once(d, lambda: model(x).backward(), model)
    dump = data(tmp_path / "dump")
    # a parameter gradient is written with what it is made of: its call's forward and backward records
    assert list(dump) == ["Module.fc1.Linear.forward.0", "Module.fc2.Linear.forward.0",
                          "Module.fc2.Linear.backward.0", "Module.fc2.Linear.parameters_grad.0",
                          "Module.fc1.Linear.backward.0", "Module.fc1.Linear.parameters_grad.0"]
    assert dump["Module.fc1.Linear.backward.0"]["input"][0]["Max"] == float("inf")
    assert "produced NaN/Inf" not in capsys.readouterr().err
    result = analyse(str(tmp_path / "dump" / "step0"), str(tmp_path / "out"), quiet=True)["ranks"][0]
    assert result["first_overflow"] is None
    assert result["first_nonfinite"]["name"] == "Module.fc2.Linear.forward.0"


class _ReusedLayer(nn.Module):
    """`fc` called twice, the second time on a tensor that holds Inf (made between modules)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.fc(x)
        h = h.masked_fill(h > 0.5, float("inf"))
        return self.head(self.fc(h)).sum()


def test_overflow_check_judges_a_reused_layers_gradients_by_all_its_calls(tmp_path, capsys):
    """Parameter gradients are summed over a module's calls: judged by call 0's forward and backward only,
    the Inf that call 1's input brought was counted as the gradients' own (a review)."""
    from msprobe_lite.compare.overflow import analyse

    torch.manual_seed(0)
    model, x = _ReusedLayer(), torch.randn(3, 4)
    d = debugger(tmp_path, task="overflow_check", level="L0", overflow_check={"overflow_nums": -1})
    once(d, lambda: model(x).backward(), model)
    assert "produced NaN/Inf" not in capsys.readouterr().err
    assert "Module.fc.Linear.forward.1" in data(tmp_path / "dump")   # written with the gradients it made
    result = analyse(str(tmp_path / "dump" / "step0"), str(tmp_path / "out"), quiet=True)["ranks"][0]
    assert result["first_overflow"] is None


def test_overflow_check_names_a_weight_gradient_that_overflows_from_finite_gradients(tmp_path, capsys):
    """The loss scaling case: a weight's gradient (grad_out^T x) passes float32's range while the gradients
    flowing in and out stay finite; the parameter-gradient record is then the overflow."""
    from msprobe_lite.compare.overflow import analyse

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2))
    x = torch.full((8, 4), 1e30)
    expected = torch.full((8, 2), 1e10).T @ x               # the weight's gradient, computed apart
    assert torch.isinf(expected).all()
    d = debugger(tmp_path, task="overflow_check", level="L0")
    once(d, lambda: (model(x) * 1e-20).sum().mul(1e30).backward(), model)
    assert torch.isinf(model[0].weight.grad).all() and torch.isfinite(model[0].bias.grad).all()
    assert "overflow 1: Module.0.Linear.parameters_grad.0 produced NaN/Inf" in capsys.readouterr().err
    result = analyse(str(tmp_path / "dump" / "step0"), str(tmp_path / "out"), quiet=True)["ranks"][0]
    assert result["first_overflow"]["name"] == "Module.0.Linear.parameters_grad.0"
    assert result["first_overflow"]["outputs"] == ["Module.0.Linear.parameters_grad.0.weight"]


def test_overflow_analysis_of_a_step_that_did_not_overflow_says_why_it_is_missing(tmp_path):
    from msprobe_lite.compare.overflow import analyse
    from msprobe_lite.compare.read import DumpError

    (tmp_path / "dump").mkdir()
    with pytest.raises(DumpError, match="has a step folder only for a step that overflowed"):
        analyse(str(tmp_path / "dump" / "step0"), str(tmp_path / "out"), quiet=True)


@pytest.mark.parametrize("limit,expected", [(1, 1), (-1, None)])
def test_overflow_check_writes_only_overflowing_calls(tmp_path, capsys, limit, expected):
    torch.manual_seed(0)
    model = Overflowing()
    x = torch.randn(2, 4)
    d = debugger(tmp_path, task="overflow_check", overflow_check={"overflow_nums": limit})
    for _ in range(2):
        once(d, lambda: model(x).backward(), model)
    dump = data(tmp_path / "dump")
    names = list(dump)
    assert names[0] == "Torch.sqrt.0.forward"
    assert dump["Torch.sqrt.0.forward"]["input_args"][0]["Max"] < 0        # its inputs are written too
    if expected == 1:
        assert names == ["Torch.sqrt.0.forward"]
        assert not (tmp_path / "dump" / "step1").exists()                 # limit reached: stopped
    else:
        assert len(names) > 1 and (tmp_path / "dump" / "step1").exists()
    err = capsys.readouterr().err
    assert "overflow 1: Torch.sqrt.0.forward produced NaN/Inf at File" in err and "torch.sqrt(h - 10.0)" in err
