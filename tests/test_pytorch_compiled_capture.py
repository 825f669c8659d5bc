"""API calls inside torch.compile'd code (pytorch/compiled_capture.py): recorded at L1 and mix with the names of
the same code in eager mode, their statistics computed by the compiled program, training bitwise as the same
compiled run without the debugger, and a compiled dump compared against an eager one.

Small models, seeded; inductor on CPU compiles in seconds, so each test compiles once or twice.
"""
from __future__ import annotations

import math
import operator
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from helpers import assert_stats, data, deterministic_compiled_runs, load

from lm import Net, batch

from msprobe_lite.compare import compare
from msprobe_lite.pytorch import PrecisionDebugger, compiled_stats


@pytest.fixture(autouse=True)
def deterministic():
    yield from deterministic_compiled_runs()


def train(path=None, level=None, backend="inductor", make=Net, steps=1):
    """Seeded AdamW training of `make()`, compiled with `backend` (None: eager), dumped at `level` into `path`
    (None: no debugger). Returns (losses, grads per step, params, dynamo's graph counters)."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    net = make()
    model = net if backend is None else torch.compile(net, backend=backend)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level=level) if level else None
    tokens, target = batch()
    losses, grads = [], []
    for _ in range(steps):
        if dbg is not None:
            dbg.start(model=model)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        loss.backward()
        if dbg is not None:  # forward and backward: the optimizer's calls are no compiled code
            dbg.stop()
        grads.append({n: p.grad.clone() for n, p in net.named_parameters()})
        opt.step()
        opt.zero_grad()
        if dbg is not None:
            dbg.step()
        losses.append(loss.detach().clone())
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    graphs = (counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"],
              sum(counters["graph_break"].values()))
    return losses, grads, params, graphs


def assert_bitwise(a, b):
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    for ga, gb in zip(a[1], b[1]):
        assert ga.keys() == gb.keys() and all(torch.equal(ga[n], gb[n]) for n in ga)
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


def forward_apis(dump):
    return [n for n in dump if not n.startswith("Module.") and n.endswith(".forward")]


def summary(target, golden, out):
    (pair,) = compare(str(target), str(golden), str(out), quiet=True).to_json()["pairs"]
    return pair


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_calls_inside_compiled_code_are_recorded_as_in_eager_mode(tmp_path, level):
    train(tmp_path / "compiled", level)
    train(tmp_path / "eager", level, backend=None)
    compiled, eager = data(tmp_path / "compiled"), data(tmp_path / "eager")
    # the same forward API records, in the same order, with the same numbers
    assert forward_apis(compiled) == forward_apis(eager)
    assert "Functional.linear.8.forward" in compiled and "Tensor.add.3.forward" in compiled
    assert not [n for n in compiled if n.startswith("Unmapped.")]
    # their statistics, computed here from the seeded model's own modules
    tokens, _ = batch()
    with torch.no_grad():
        torch.manual_seed(0)
        ref = Net()
        x = ref.embed(tokens)
        block = ref.blocks[0]
        h = block.ln(x)
        q, k, v = block.qkv(h).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(16), dim=-1)
        attn = block.proj(scores @ v)
        logits = ref(tokens)
    assert_stats(compiled["Functional.embedding.0.forward"]["output"][0], x)
    assert compiled["Functional.embedding.0.forward"]["input_args"][0]["Max"] == int(tokens.max())
    assert_stats(compiled["Functional.layer_norm.0.forward"]["output"][0], h)
    assert_stats(compiled["Functional.linear.0.forward"]["input_args"][1], block.qkv.weight)
    for i, part in enumerate((q, k, v)):
        assert_stats(compiled["Tensor.chunk.0.forward"]["output"][i], part)
    assert_stats(compiled["Torch.softmax.0.forward"]["output"][0], scores)
    assert_stats(compiled["Tensor.add.0.forward"]["input_args"][1], attn)
    assert_stats(compiled["Tensor.add.0.forward"]["output"][0], x + attn)
    assert_stats(compiled["Functional.linear.8.forward"]["output"][0], logits)
    # the arguments as eager mode records them (F.layer_norm's weight, bias and eps by keyword)
    for name in ("Functional.layer_norm.0.forward", "Tensor.chunk.0.forward", "Tensor.transpose.0.forward"):
        assert compiled[name]["input_kwargs"].keys() == eager[name]["input_kwargs"].keys(), name
        assert len(compiled[name]["input_args"]) == len(eager[name]["input_args"]), name
    if level == "mix":  # each call's parent is the module that made it, named as in the eager dump
        c_construct = load(tmp_path / "compiled", name="construct.json")
        e_construct = load(tmp_path / "eager", name="construct.json")
        for name in forward_apis(compiled):
            assert c_construct[name] == e_construct[name], name
    # eager vs compiled: nearly every record of the compiled dump pairs, and a healthy fp32 compile departs nowhere
    pair = summary(tmp_path / "compiled", tmp_path / "eager", tmp_path / "compare")
    counts = pair["counts"]
    assert (counts["pass"] + counts["warning"] + counts["error"]) / pair["records"]["target"] >= 0.9
    assert counts["error"] == 0 and pair["first_divergence"] is None, pair


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_compiled_training_stays_bitwise_with_the_capture(tmp_path, level):
    base = train(steps=2)
    run = train(tmp_path, level, steps=2)
    assert_bitwise(base, run)
    assert run[3] == base[3] and base[3][2] == 0  # the same graphs, no graph break
    names = list(data(tmp_path, 1))
    assert ("Functional.linear.8.forward" in names) == (level != "L0")


def backward_apis(dump):
    return [n for n in dump if not n.startswith("Module.") and n.endswith(".backward")]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_backward_of_compiled_code_is_recorded_as_in_eager_mode(tmp_path, backend):
    """Each API call's backward record: the gradients of its outputs (`input`) and of its inputs (`output`),
    named as in eager mode and equal to autograd's own gradients; training bitwise as without the debugger.
    aot_eager runs the traced backward with its taps; inductor's backward is replayed beside it."""
    base = train(backend=backend)
    assert_bitwise(base, train(tmp_path / "compiled", "mix", backend=backend))
    train(tmp_path / "eager", "mix", backend=None)
    compiled, eager = data(tmp_path / "compiled"), data(tmp_path / "eager")
    assert set(backward_apis(compiled)) == set(backward_apis(eager))
    assert len(backward_apis(compiled)) >= 30
    # the gradients, computed here by autograd on the seeded model
    tokens, target = batch()
    torch.manual_seed(0)
    ref = Net()
    h = ref.norm(ref.blocks[1](ref.blocks[0](ref.embed(tokens))))
    h.retain_grad()
    logits = ref.head(h)
    logits.retain_grad()
    F.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    head = compiled["Functional.linear.8.backward"]
    assert_stats(head["input"][0], logits.grad)  # the graph returns logits: its gradient comes from outside
    assert_stats(head["output"][0], h.grad)
    assert_stats(head["output"][1], ref.head.weight.grad)
    assert_stats(head["output"][2], ref.head.bias.grad)
    assert_stats(compiled["Functional.embedding.0.backward"]["output"][1], ref.embed.weight.grad)
    # every gradient the eager dump has, the compiled dump has too, with the same statistics
    checked = 0
    for name in backward_apis(eager):
        for part in ("input", "output"):
            for got, want in zip(compiled[name][part], eager[name][part]):
                assert (got is None) == (want is None), (name, part)
                if got is not None and want.get("Norm") is not None:
                    for key in ("Max", "Min", "Mean", "Norm"):
                        assert math.isclose(got[key], want[key], rel_tol=1e-4, abs_tol=1e-6), (name, part, key)
                    checked += 1
    assert checked >= 60
    c_construct = load(tmp_path / "compiled", name="construct.json")
    e_construct = load(tmp_path / "eager", name="construct.json")
    for name in backward_apis(compiled):  # parents: the modules' backward records, as in eager mode
        assert c_construct[name] == e_construct[name], name


def test_inductor_compiles_the_backward_as_without_the_debugger(tmp_path, monkeypatch):
    """Inductor decides what the forward saves and how it fuses the backward from the graph it is given:
    the statistics and the gradient taps are kept out of those decisions, so the split is the same node for
    node, and the backward's kernels are the same, character for character (the replay of the backward,
    compiled_replay.py, is one op ahead of them, reading the program's inputs, and compiled on its own)."""
    from torch._inductor import compile_fx
    from torch._inductor.utils import run_and_get_code

    splits = []
    split = compile_fx.min_cut_rematerialization_partition

    def recorded(*args, **kwargs):
        fw, bw = split(*args, **kwargs)
        splits.append(plain(bw))  # as split: the replay's op is added after
        return fw, bw

    monkeypatch.setattr(compile_fx, "min_cut_rematerialization_partition", recorded)
    with torch._inductor.config.patch(force_disable_caches=True):  # both runs split, none read back
        base, (_, base_backward) = run_and_get_code(lambda: train(make=GeluNet))
        run, (_, backward, replay) = run_and_get_code(lambda: train(tmp_path, "mix", make=GeluNet))
    assert_bitwise(base, run)
    (without, with_debugger) = splits
    assert with_debugger == without
    assert kernels(backward) == kernels(base_backward) and len(kernels(backward)) >= 4
    assert "replay_backward" in backward and "replay_backward" not in base_backward
    assert len(kernels(replay)) >= 4  # the replay, compiled by inductor at its first run
    dump = data(tmp_path)
    assert "Torch.tanh.1.forward" in dump and "Torch.tanh.1.backward" in dump


class DropoutNet(Net):
    """The test transformer with dropout after each MLP: random numbers drawn inside the compiled graph."""

    def __init__(self):
        super().__init__()
        for block in self.blocks:
            block.mlp.append(nn.Dropout(0.25))


def test_dropout_inside_inductors_graph_draws_the_same_numbers(tmp_path):
    """The replay of inductor's backward draws no random numbers: two steps train bitwise, the generator ends
    where it ends without the debugger, and the dropout's backward is recorded (its mask saved by the forward)."""
    def run(path, level):
        result = train(path, level, make=DropoutNet, steps=2)
        return result, torch.get_rng_state()

    (base, base_state), (got, state) = run(None, None), run(tmp_path, "mix")
    assert_bitwise(base, got)
    assert torch.equal(base_state, state)
    dump = data(tmp_path, 1)
    assert "Functional.dropout.1.backward" in dump and dump["Functional.dropout.1.backward"]["output"][0]


def kernels(code):
    """The kernels' sources in inductor's code for a graph (their names, numbered per process, left out)."""
    return [re.sub(r"cpp_fused_\w+", "kernel", k) for k in re.findall(r"'''(.*?)'''", code, re.S)]


class GeluNet(Net):
    """The test transformer with GPT-2's tanh GELU written out: a chain of small calls, each recorded."""

    def __init__(self):
        super().__init__()
        for block in self.blocks:
            block.mlp[1] = TanhGelu()


class TanhGelu(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def plain(gm):
    """A graph as (op, target, arguments by position): equal for graphs that compute the same way. The token
    of the taps' side effects, passed through the backward program, is left out."""
    index = {}

    def arg(value):
        if isinstance(value, torch.fx.Node):
            return index[value]
        if isinstance(value, (tuple, list)):
            return tuple(arg(v) for v in value if not (isinstance(v, torch.fx.Node) and v.name in token))
        return repr(value)

    found = []
    token = {n.name for n in gm.graph.nodes if n.name.startswith("tangents_token")}
    for node in gm.graph.nodes:
        if node.name in token:
            continue
        found.append((node.op, "" if node.op == "placeholder" else str(node.target), arg(node.args),
                      tuple((k, arg(v)) for k, v in sorted(node.kwargs.items()))))
        index[node] = len(index)
    return found


def test_the_aot_eager_backend_is_captured_too(tmp_path):
    base = train(backend="aot_eager")
    run = train(tmp_path, "L1", backend="aot_eager")
    assert_bitwise(base, run)
    assert "Torch.softmax.1.forward" in data(tmp_path)


def faulty(gm, example_inputs):
    """A compiler-only fault: the third `+` of the graph gives 1.001 times its value, then inductor."""
    from torch._inductor.compile_fx import compile_fx

    adds = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.add]
    with gm.graph.inserting_after(adds[2]):
        scaled = gm.graph.call_function(operator.mul, (adds[2], 1.001))
    adds[2].replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
    gm.recompile()
    return compile_fx(gm, example_inputs)


def test_a_compiler_only_fault_is_named_as_the_first_divergence(tmp_path):
    train(tmp_path / "faulty", "mix", backend=faulty)
    train(tmp_path / "eager", "mix", backend=None)
    pair = summary(tmp_path / "faulty", tmp_path / "eager", tmp_path / "compare")
    assert pair["first_divergence"]["name"] == "Tensor.add.2.forward", pair
    assert pair["counts"]["error"] == 1


class Layers(nn.Module):
    """An embedding and two linears, for forwards that use them in odd ways."""

    def __init__(self, vocab=32, d=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, vocab)


class Broken(Layers):
    """A graph break in the middle of forward, and a call of an aten operator, no API of the list."""

    def forward(self, tokens):
        x = torch.tanh(self.a(self.embed(tokens)))
        torch._dynamo.graph_break()
        x = x + torch.ops.aten.mul.Tensor(x, x)
        return self.b(x)


def test_a_graph_break_and_an_unmapped_call(tmp_path):
    base = train(make=Broken, steps=2)
    run = train(tmp_path / "compiled", "mix", make=Broken, steps=2)
    assert_bitwise(base, run)
    assert run[3] == base[3] and base[3][0] >= 2 and base[3][2] >= 1  # two graphs, a graph break
    train(tmp_path / "eager", "mix", backend=None, make=Broken)
    compiled, eager = data(tmp_path / "compiled"), data(tmp_path / "eager")
    # both graphs' calls, numbered across the break as in eager mode; the aten call is recorded, named so
    assert [n for n in forward_apis(compiled) if not n.startswith("Unmapped.")] == forward_apis(eager)
    assert "Tensor.add.0.forward" in compiled and "Torch.tanh.0.forward" in compiled
    unmapped = [n for n in compiled if n.startswith("Unmapped.")]
    assert unmapped == ["Unmapped.mul.Tensor.0.forward", "Unmapped.mul.Tensor.0.backward"]
    tokens, _ = batch()
    with torch.no_grad():
        torch.manual_seed(0)
        ref = Broken()
        x = torch.tanh(ref.a(ref.embed(tokens)))
    assert_stats(compiled[unmapped[0]]["output"][0], x * x)
    assert_stats(compiled["Tensor.add.0.forward"]["output"][0], x + x * x)


class InPlace(Layers):
    """Writes in place inside the compiled graph: `z[:, 0] = 0`, `z.add_(1)`."""

    def forward(self, tokens):
        z = self.a(self.embed(tokens)).clone()
        z[:, 0] = 0.0
        z.add_(1.0)
        return self.b(z * 2)


def test_tensors_written_in_place_are_read_when_each_call_runs(tmp_path):
    """Each call's inputs as they are when it runs and its outputs as it leaves them, as eager mode records."""
    base = train(make=InPlace)
    assert_bitwise(base, train(tmp_path / "compiled", "L1", make=InPlace))
    train(tmp_path / "eager", "L1", backend=None, make=InPlace)
    compiled, eager = data(tmp_path / "compiled"), data(tmp_path / "eager")
    assert forward_apis(compiled) == forward_apis(eager)
    assert "Tensor.__setitem__.0.forward" in compiled and "Tensor.add_.0.forward" in compiled
    checked = 0
    for name in forward_apis(compiled):
        for part in ("input_args", "output"):
            for got, want in zip(compiled[name][part], eager[name][part]):
                if isinstance(got, dict) and "Norm" in got:
                    for key in ("Max", "Min", "Mean", "Norm"):
                        assert math.isclose(got[key], want[key], rel_tol=1e-5, abs_tol=1e-6), (name, part, key)
                    checked += 1
    assert checked >= 12


def test_dynamic_shapes_have_their_sizes_and_statistics(tmp_path):
    """A sequence length that changes from step to step: dynamo recompiles with a dynamic size; each record
    (the backward's too, replayed with the sizes inductor's backward is given) has the step's own shape and
    statistics, and training is as without the debugger."""
    def run(dbg):
        torch._dynamo.reset()
        torch.manual_seed(0)
        net = Net()
        model = torch.compile(net)
        gen = torch.Generator().manual_seed(3)
        outs = []
        for length in (6, 7, 9):
            tokens = torch.randint(0, 32, (2, length), generator=gen)
            if dbg is not None:
                dbg.start(model=model)
            out = model(tokens)
            out.sum().backward()
            if dbg is not None:
                dbg.stop()
                dbg.step()
            outs.append((tokens, out.detach().clone(), [p.grad.clone() for p in net.parameters()]))
        return outs

    base = run(None)
    got = run(PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1"))
    for (_, a, ga), (tokens, b, gb) in zip(base, got):
        assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ga, gb))
    for step, (tokens, out, _) in enumerate(got):
        dump = data(tmp_path, step)
        assert_stats(dump["Functional.linear.8.forward"]["output"][0], out)
        assert dump["Functional.embedding.0.forward"]["input_args"][0]["shape"] == list(tokens.shape)
        head = dump["Functional.linear.8.backward"]["input"][0]  # the gradient of out.sum(): ones
        assert head["shape"] == list(out.shape) and head["Max"] == head["Min"] == head["Mean"] == 1.0


def test_compiled_records_have_the_users_source_lines(tmp_path):
    """stack.json of a compiled dump: the line inside the compiled code (from the compiler's metadata), then the
    training loop's line that called the compiled model, as in an eager dump."""
    train(tmp_path, "L1")
    stacks = load(tmp_path, name="stack.json")
    frames = {name: entry[1] for entry in stacks.values() for name in entry[0]}
    softmax = frames["Torch.softmax.0.forward"]
    assert "lm.py" in softmax[0] and "scores = torch.softmax(" in softmax[0], softmax
    assert any("test_pytorch_compiled_capture.py" in f and "model(tokens)" in f for f in softmax[1:]), softmax
    assert not any("/torch/" in f or "msprobe_lite" in f for f in softmax), softmax
    assert "x = self.embed(tokens)" in frames["Functional.embedding.0.forward"][0]


def test_graphs_compiled_before_the_debugger_are_said(tmp_path, caplog):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.compile(Net())
    tokens, _ = batch()
    model(tokens)  # compiled now, without statistics
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        dbg.start(model=model)
        model(tokens)
        dbg.stop()
        dbg.step()
    said = [r.getMessage() for r in caplog.records if "before the debugger started" in r.getMessage()]
    assert said == ["1 function(s) compiled by torch.compile before the debugger started: calls inside them are "
                    "not recorded. Start the debugger before the first compiled call"], said


def test_statistics_left_on_the_device_give_the_same_dump(tmp_path, monkeypatch):
    """On a GPU the compiled statistics stay on the device until the step is written (no synchronisation per
    graph run): that route, taken here on CPU, writes the same dump as reading them at once."""
    train(tmp_path / "now", "mix")
    monkeypatch.setattr(compiled_stats, "reads_now", lambda rows, dynamic: dynamic)
    train(tmp_path / "pending", "mix")
    assert data(tmp_path / "pending") == data(tmp_path / "now")
