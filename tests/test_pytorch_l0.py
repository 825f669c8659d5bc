"""Module-level (L0) dumps of real PyTorch models, checked against values computed in the test."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from helpers import assert_stats, data, load
from models import make, train

from msprobe_lite.pytorch import PrecisionDebugger


def dbg(tmp_path, **kw):
    kw.setdefault("level", "L0")
    kw.setdefault("task", "statistics")
    return PrecisionDebugger(dump_path=str(tmp_path), **kw)


class Tapped(nn.Module):
    """An MLP that keeps its intermediate tensors (with retained gradients) so the test can check them."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        self.h1 = self.fc1(x)
        self.h1.retain_grad()
        self.a = self.act(self.h1)
        self.a.retain_grad()
        self.out = self.fc2(self.a)
        self.out.retain_grad()
        return self.out


def test_mlp_forward_backward_and_parameter_gradients(tmp_path):
    torch.manual_seed(0)
    model, x = Tapped(), torch.randn(4, 8, requires_grad=True)
    d = dbg(tmp_path)
    d.start(model=model)
    loss = (model(x) ** 2).mean()
    loss.backward()
    d.stop()
    d.step()
    dump = data(tmp_path)
    assert list(dump) == [
        "Module.fc1.Linear.forward.0", "Module.act.ReLU.forward.0", "Module.fc2.Linear.forward.0",
        "Module.fc2.Linear.backward.0", "Module.fc2.Linear.parameters_grad.0", "Module.act.ReLU.backward.0",
        "Module.fc1.Linear.backward.0", "Module.fc1.Linear.parameters_grad.0"]
    fc1 = dump["Module.fc1.Linear.forward.0"]
    assert_stats(fc1["input_args"][0], x)
    assert fc1["input_args"][0]["requires_grad"] is True
    assert fc1["input_kwargs"] == {}
    assert_stats(fc1["parameters"]["weight"], model.fc1.weight)
    assert_stats(fc1["parameters"]["bias"], model.fc1.bias)
    assert_stats(fc1["output"][0], model.h1)
    assert_stats(dump["Module.fc2.Linear.forward.0"]["output"][0], model.out)
    # backward: input = grads w.r.t. the outputs, output = grads w.r.t. the inputs (autograd's own values)
    assert_stats(dump["Module.fc2.Linear.backward.0"]["input"][0], model.out.grad)
    assert_stats(dump["Module.fc2.Linear.backward.0"]["output"][0], model.a.grad)
    assert_stats(dump["Module.act.ReLU.backward.0"]["input"][0], model.a.grad)
    assert_stats(dump["Module.act.ReLU.backward.0"]["output"][0], model.h1.grad)
    assert_stats(dump["Module.fc1.Linear.backward.0"]["output"][0], x.grad)
    for mod in ("fc1", "fc2"):
        grads = dump[f"Module.{mod}.Linear.parameters_grad.0"]
        assert set(grads) == {"weight", "bias"}
        assert_stats(grads["weight"][0], getattr(model, mod).weight.grad)
        assert_stats(grads["bias"][0], getattr(model, mod).bias.grad)


def test_parameter_gradients_after_accumulation(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    d = dbg(tmp_path)
    d.start(model=model)
    for _ in range(3):  # gradient accumulation over three micro-batches
        model(torch.randn(5, 3)).sum().backward()
    d.stop()
    d.step()
    dump = data(tmp_path)
    assert_stats(dump["Module.0.Linear.parameters_grad.0"]["weight"][0], model[0].weight.grad)
    assert [n for n in dump if "forward" in n] == [f"Module.0.Linear.forward.{i}" for i in range(3)]


def test_a_module_returning_a_dataclass_keeps_its_backward_record(tmp_path):
    """The walker does not open a dataclass: no output tensor is seen, which is not "no output gets a
    gradient" (gradients do flow into its inputs)."""
    import dataclasses

    @dataclasses.dataclass
    class Out:
        hidden: torch.Tensor

    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return Out(torch.tanh(self.lin(x)))

    torch.manual_seed(0)
    net, x = nn.ModuleDict({"enc": Enc(), "head": nn.Linear(3, 1)}), torch.randn(4, 3, requires_grad=True)
    d = dbg(tmp_path)
    d.start(model=net)
    net["head"](net["enc"](x).hidden).sum().backward()
    d.stop()
    d.step()
    record = data(tmp_path)["Module.enc.Enc.backward.0"]
    assert_stats(record["output"][0], x.grad)


def test_inplace_relu_inputs_taken_before_mutation(tmp_path):
    torch.manual_seed(0)
    model, x, _ = make("mlp_inplace")
    h = model.fc1(x).detach().clone()  # what act receives, before ReLU(inplace=True) changes it
    d = dbg(tmp_path)
    d.start(model=model)
    model(x).sum().backward()
    d.stop()
    d.step()
    act = data(tmp_path)["Module.act.ReLU.forward.0"]
    assert_stats(act["input_args"][0], h)
    assert_stats(act["output"][0], h.relu())
    assert act["input_args"][0]["Min"] < 0 <= act["output"][0]["Min"]


def test_cnn_with_batchnorm_and_inplace_ops(tmp_path):
    d = dbg(tmp_path)
    losses, _, _ = train("cnn", steps=2, debugger=d)
    dump = data(tmp_path, step=1)
    forward = [n for n in dump if ".forward." in n]
    assert forward == ["Module.conv1.Conv2d.forward.0", "Module.bn1.BatchNorm2d.forward.0",
                       "Module.relu.ReLU.forward.0", "Module.conv2.Conv2d.forward.0",
                       "Module.bn2.BatchNorm2d.forward.0", "Module.pool.AdaptiveAvgPool2d.forward.0",
                       "Module.head.Linear.forward.0"]
    assert "Module.bn1.BatchNorm2d.parameters_grad.0" in dump
    assert "Module.relu.ReLU.backward.0" in dump
    assert all(torch.isfinite(l) for l in losses)


def test_transformer_reuse_kwargs_tuple_and_dict_outputs(tmp_path):
    d = dbg(tmp_path)
    train("transformer", steps=1, debugger=d)
    dump = data(tmp_path)
    names = list(dump)
    assert "Module.shared.Linear.forward.0" in names and "Module.shared.Linear.forward.1" in names
    assert "Module.shared.Linear.backward.1" in names
    assert "Module.blocks.0.attn.Attention.forward.0" in names
    assert "Module.blocks.1.attn.q.Linear.forward.0" in names
    # the reused module's second call is recorded after its first
    assert names.index("Module.shared.Linear.forward.0") < names.index("Module.shared.Linear.forward.1")
    scale = dump["Module.scale.Scale.forward.0"]
    assert scale["input_kwargs"] == {"factor": {"type": "float", "value": 0.5}}
    block = dump["Module.blocks.0.Block.forward.0"]
    assert block["input_kwargs"]["mask"]["dtype"] == "torch.bool"
    assert block["input_kwargs"]["mask"]["Max"] is True and block["input_kwargs"]["mask"]["Min"] is False
    # the root model is not a record
    assert not any(n.startswith("Module.TinyTransformer") for n in names)
    assert "Module.pos" not in " ".join(names)


def test_tuple_and_dict_outputs_are_encoded(tmp_path):
    class Pair(nn.Module):
        def forward(self, x):
            return x + 1, {"n": 3, "t": x * 2, "none": None}

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = Pair()

        def forward(self, x):
            return self.pair(x)

    x = torch.arange(6.0).reshape(2, 3)
    d = dbg(tmp_path)
    net = Net()
    d.start(model=net)
    Net()(x)  # another instance, never given to start(): not hooked, no record
    net(x)
    d.stop()
    d.step()
    assert list(data(tmp_path)) == ["Module.pair.Pair.forward.0"]
    out = data(tmp_path)["Module.pair.Pair.forward.0"]["output"]
    assert_stats(out[0], x + 1)
    assert out[1]["n"] == {"type": "int", "value": 3}
    assert_stats(out[1]["t"], x * 2)
    assert out[1]["none"] is None


def test_stack_and_construct(tmp_path):
    d = dbg(tmp_path)
    train("transformer", steps=1, debugger=d)
    construct = load(tmp_path, name="construct.json")
    assert construct["Module.blocks.0.Block.forward.0"] is None
    assert construct["Module.blocks.0.attn.Attention.forward.0"] == "Module.blocks.0.Block.forward.0"
    assert construct["Module.blocks.0.attn.q.Linear.forward.0"] == "Module.blocks.0.attn.Attention.forward.0"
    assert construct["Module.blocks.0.mlp.0.Linear.backward.0"] == "Module.blocks.0.mlp.Sequential.backward.0"
    stack = load(tmp_path, name="stack.json")
    names = [n for names, _ in stack.values() for n in names]
    assert sorted(names) == sorted(n for n in data(tmp_path) if ".forward." in n)
    assert len(stack) < len(names)  # identical stacks are stored once
    for _, frames in stack.values():
        assert frames, "every stack keeps the user's frames"
        for frame in frames:
            assert frame.startswith("File ") and ", line " in frame and ", in " in frame and ", \n " in frame
            assert "msprobe_lite" not in frame and "/torch/" not in frame
    # innermost frame of the q projection is the line in Attention.forward that calls it
    q_stack = next(frames for names, frames in stack.values() if "Module.blocks.0.attn.q.Linear.forward.0" in names)
    assert "in forward, \n q, k, v = split(self.q(x))" in q_stack[0]
    assert "models.py" in q_stack[0]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_checkpointing_dumps_the_same_records_as_without_it(tmp_path, level):
    """Activation checkpointing (use_reentrant=False) runs the checkpointed modules again in the backward
    pass. Those calls are not records, as API calls there are not: they took the next indices, so with
    micro-batches a checkpointed run's second micro-batch met the other run's recomputation (a new user's
    trial), and a recomputation that stops early left its children naming a parent without a record. A
    checkpointed run now dumps the records, names and parents of a run without checkpointing."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

        def forward(self, x):
            return x + self.fc(torch.relu(self.ln(x)))

    class Net(nn.Module):
        def __init__(self, checkpointed):
            super().__init__()
            self.blocks, self.checkpointed = nn.ModuleList([Block(), Block()]), checkpointed

        def forward(self, x):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
            return x

    dumps = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = Net(checkpointed)
        d = dbg(tmp_path / str(checkpointed), level=level)
        d.start(model=model)
        for x in (torch.randn(4, 8), torch.randn(4, 8)):  # two micro-batches
            model(x).sum().backward()
        d.stop()
        d.step()
        dumps.append((data(tmp_path / str(checkpointed)), load(tmp_path / str(checkpointed), name="construct.json")))
    (plain, plain_parents), (checked, checked_parents) = dumps
    assert sorted(checked) == sorted(plain)
    assert checked_parents == plain_parents
    for name in ("Module.blocks.1.ln.LayerNorm.forward.1", "Module.blocks.0.Block.forward.1"):
        assert checked[name] == plain[name]  # the same call of the same micro-batch: the same numbers


def test_list_of_models_prefixes_index(tmp_path):
    torch.manual_seed(0)
    a, b = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2))
    d = dbg(tmp_path)
    d.start(model=[a, b])
    b(a(torch.randn(1, 2)))
    d.stop()
    d.step()
    assert list(data(tmp_path))[:2] == ["Module.0.0.Linear.forward.0", "Module.1.0.Linear.forward.0"]


def test_start_every_step_hooks_once_and_hooks_gone_after_last_step(tmp_path, capsys):
    model, x, y = make("mlp")
    d = dbg(tmp_path, step=[0, 1])
    for _ in range(4):
        d.start(model=model)
        model(x).sum().backward()
        d.stop()
        d.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step0", "step1"]
    assert [n for n in data(tmp_path, 1) if ".forward." in n] == [
        "Module.fc1.Linear.forward.0", "Module.act.ReLU.forward.0", "Module.fc2.Linear.forward.0"]
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks
    for p in model.parameters():
        assert not p._post_accumulate_grad_hooks
    assert capsys.readouterr().err.count("last selected step dumped") == 1  # said once, not every step


def test_missing_model_at_module_level_is_a_clear_error(tmp_path):
    d = dbg(tmp_path)
    try:
        d.start()
    except ValueError as e:
        assert "start(model=" in str(e)
    else:
        raise AssertionError("expected ValueError")


def test_a_wrong_model_is_a_clear_error_and_a_leaf_model_is_said(tmp_path, caplog):
    """start(a function) raised inside the debugger and was logged as its own internal failure, then nothing
    was dumped; start(a leaf module such as a loss) dumped nothing, unsaid (a new user's trial)."""
    d = dbg(tmp_path)
    with pytest.raises(TypeError, match="expects a torch.nn.modules.module.Module .* got function"):
        d.start(model=lambda x: x)
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        d.start(model=nn.CrossEntropyLoss())
    d.stop()
    d.step()
    assert any("has no modules inside it" in r.getMessage() for r in caplog.records)


def test_stop_before_backward_then_step_collects_backward(tmp_path):
    model, x, _ = make("mlp")
    d = dbg(tmp_path)
    d.start(model=model)
    out = model(x).sum()
    d.stop()
    assert not any("backward" in n for n in data(tmp_path))
    out.backward()
    d.step()
    assert "Module.fc1.Linear.backward.0" in data(tmp_path)


def test_parameter_gradients_stay_when_backward_raises_or_a_hook_frees_them(tmp_path):
    """parameters_grad is read again when the backward pass ends (DDP averages .grad then); the value as
    accumulated stays when that end never comes (anomaly detection stops a backward that made NaN) and when
    a hook of the user's frees .grad (an optimizer step in backward). A review found both records lost."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = self.fc1(x)
            return self.fc2(torch.sqrt(h - h.detach()))  # 0 forward, NaN in the backward of the sqrt

    torch.manual_seed(0)
    net = Net()
    d = dbg(tmp_path / "anomaly")
    d.start(model=net)
    with pytest.raises(RuntimeError, match="nan"):
        with torch.autograd.detect_anomaly(check_nan=True):
            net(torch.randn(3, 4)).sum().backward()
    d.stop()
    d.step()
    assert_stats(data(tmp_path / "anomaly")["Module.fc2.Linear.parameters_grad.0"]["weight"][0], net.fc2.weight.grad)

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    d = dbg(tmp_path / "freed")
    d.start(model=mlp)
    seen = {}

    def step_in_backward(p):
        seen[p] = p.grad.clone()
        p.grad = None
    for p in mlp.parameters():
        p.register_post_accumulate_grad_hook(step_in_backward)
    mlp(torch.randn(3, 4)).sum().backward()
    d.stop()
    d.step()
    dump = data(tmp_path / "freed")
    assert_stats(dump["Module.2.Linear.parameters_grad.0"]["weight"][0], seen[mlp[2].weight])
    assert_stats(dump["Module.0.Linear.parameters_grad.0"]["bias"][0], seen[mlp[0].bias])


def test_a_filtered_out_call_that_raises_gives_its_kept_calls_its_parent(tmp_path):
    """A call left out by a `list` filter that raised: the kept calls inside it were written with no parent,
    where the unfiltered dump names the call above it (a review)."""
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            self.fc(x)
            raise ValueError("an early exit the caller catches")

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.head = Inner(), nn.Linear(4, 4)

        def forward(self, x):
            try:
                self.inner(x)
            except ValueError:
                pass
            return self.head(x)

    net = nn.Sequential(Outer())
    parents = []
    for name, selection in (("all", []), ("list", ["inner.fc"])):
        d = PrecisionDebugger(dump_path=str(tmp_path / name), task="statistics", level="L0")
        if selection:
            (tmp_path / "c.json").write_text(json.dumps({"task": "statistics", "level": "L0",
                                                         "dump_path": str(tmp_path / name),
                                                         "statistics": {"list": selection}}))
            d = PrecisionDebugger(str(tmp_path / "c.json"))
        d.start(model=net)
        net(torch.randn(2, 4))
        d.stop()
        d.step()
        parents.append(load(tmp_path / name, name="construct.json")["Module.0.inner.fc.Linear.forward.0"])
    assert parents == ["Module.0.Outer.forward.0"] * 2, parents
