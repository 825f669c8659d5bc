"""NetDifferenceFinder: twin networks written in PyTorch and in MindSpore (an MLP with LayerNorm and GELU, a CNN
with BatchNorm, an attention block), the PyTorch weights random. A clean port agrees everywhere; each porting
bug planted in the MindSpore twin is named at its call, in its cell, at its line. Also renamed attributes (a
name map, get_weight_map's file), several input sets, training mode, and the user's networks left as they were."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
import torch  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from msprobe_lite.mindspore import NetDifferenceFinder, get_weight_map  # noqa: E402
from msprobe_lite.mindspore.net_difference import NetDifferenceError  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)


# -- the twins ----------------------------------------------------------------------------------------------------
class PtMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32)
        self.act, self.fc2 = torch.nn.GELU(), torch.nn.Linear(32, 32)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.fc2(self.drop(self.act(self.norm(self.fc1(x)))))


class TransposedDense(nn.Dense):
    """The porting bug: x @ W where nn.Dense computes x @ W.T (PyTorch's layout, which the port keeps)."""

    def construct(self, x):
        return ops.matmul(x, self.weight) + self.bias


class MsMLP(nn.Cell):
    def __init__(self, eps=1e-5, approximate=False, transposed=False, names=("fc1", "norm"), shifted=False):
        super().__init__()
        self.names = names   # the port may call fc1 and norm otherwise
        self.shifted = shifted   # the porting bug of an op the original does not have
        setattr(self, names[0], nn.Dense(16, 32))
        setattr(self, names[1], nn.LayerNorm((32,), epsilon=eps))
        self.act = nn.GELU(approximate=approximate)   # MindSpore's default is the tanh approximation
        self.fc2 = (TransposedDense if transposed else nn.Dense)(32, 32)
        self.drop = nn.Dropout(p=0.5)

    def construct(self, x):
        first, norm = (getattr(self, name) for name in self.names)
        h = self.act(norm(first(x)))
        if self.shifted:
            h = ops.relu(h - 0.05)
        return self.fc2(self.drop(h))


class PtCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn, self.relu, self.head = torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        h = self.relu(self.bn(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1))


class MsCNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn, self.relu, self.head = nn.BatchNorm2d(8), nn.ReLU(), nn.Dense(8 * 6 * 6, 5)

    def construct(self, x):
        h = self.relu(self.bn(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1))


class PtAttention(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.qkv, self.proj, self.d = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), d

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d), dim=-1)
        return self.proj(att @ v)


class MsAttention(nn.Cell):
    def __init__(self, d=16, scaled=True, axis=-1):
        super().__init__()
        self.qkv, self.proj, self.d = nn.Dense(d, 3 * d), nn.Dense(d, d), d
        self.scaled, self.axis = scaled, axis

    def construct(self, x):
        q, k, v = ops.chunk(self.qkv(x), 3, -1)
        scores = ops.matmul(q, k.swapaxes(-2, -1))
        if self.scaled:
            scores = scores / math.sqrt(self.d)
        return self.proj(ops.matmul(ops.softmax(scores, axis=self.axis), v))


class PtBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.norm, self.head = PtAttention(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(x + self.attn(x)))


class MsBlock(nn.Cell):
    def __init__(self, norm_eps=1e-5, **attention):
        super().__init__()
        # MindSpore's LayerNorm epsilon defaults to 1e-7, PyTorch's to 1e-5: a port states it
        self.attn, self.norm = MsAttention(**attention), nn.LayerNorm((16,), epsilon=norm_eps)
        self.head = nn.Dense(16, 4)

    def construct(self, x):
        return self.head(self.norm(x + self.attn(x)))


TWINS = {"mlp": (PtMLP, MsMLP, (4, 16)), "cnn": (PtCNN, MsCNN, (2, 3, 6, 6)),
         "attention": (PtBlock, MsBlock, (2, 5, 16))}


def twins(kind, **ms_kwargs):
    pt_cls, ms_cls, shape = TWINS[kind]
    torch.manual_seed(0)
    pt_net = pt_cls()
    for p in pt_net.parameters():       # random weights, norm layers' included (their defaults are 1 and 0)
        torch.nn.init.normal_(p, std=0.3)
    for name, b in pt_net.named_buffers():
        if "running_var" in name:
            b.copy_(torch.rand_like(b) + 0.5)
        elif "running_mean" in name:
            b.copy_(torch.randn_like(b) * 0.1)
    return pt_net, ms_cls(**ms_kwargs), shape


def ms_output(ms_net, x):
    ms_net.set_train(False)
    return ms_net(ms.Tensor(x)).asnumpy()


# -- a clean port ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["mlp", "cnn", "attention"])
def test_a_clean_port_agrees_and_its_outputs_are_allclose(kind, capsys):
    pt_net, ms_net, shape = twins(kind)
    result = NetDifferenceFinder(pt_net=pt_net, ms_net=ms_net).compare(auto_inputs=((shape, np.float32),))
    assert result["first_divergence"] is None and result["first_only_in_target"] is None, result
    assert result["first_only_in_golden"] is None and result["agree"] and result["allclose"]
    assert result["counts"]["pass"] >= 6 and result["counts"]["error"] == result["counts"]["warning"] == 0, result
    assert result["dropout_removed"] and result["mode"] == "eval" and result["level"] == "mix"
    assert result["weights"]["converted"] == len(list(ms_net.get_parameters())) and not result["weights"]["missing"]
    # the weights are PyTorch's: the MindSpore net now computes what the PyTorch net does, on the same input
    x = np.random.RandomState(1234).standard_normal(shape).astype(np.float32)
    pt_net.eval()
    with torch.no_grad():
        expected = pt_net(torch.from_numpy(x)).numpy()
    got = ms_output(ms_net, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    (row,) = result["outputs"]
    assert row["allclose"] and row["max_abs"] == pytest.approx(float(np.abs(got - expected).max()), rel=1e-6)
    a, b = got.ravel().astype(np.float64), expected.ravel().astype(np.float64)
    cosine = float(a @ b / np.sqrt((a @ a) * (b @ b)))
    assert row["cosine"] == pytest.approx(cosine, abs=1e-9)
    out = capsys.readouterr().out
    assert "[net difference] MindSpore port (target) against PyTorch (golden): 1 input set, eval mode, level mix" in out
    assert "dropout removed" in out and "the port agrees with PyTorch" in out
    assert max(len(line) for line in out.splitlines()) <= 160


# -- porting bugs, each named ------------------------------------------------------------------------------------
BUGS = [  # (twin, MindSpore twin's arguments, key, named call, its cell, text of the line named)
    ("mlp", {"eps": 1e-2}, "first_divergence", "Primitive.LayerNorm.0.forward", "Cell.norm.LayerNorm.forward.0",
     "self.act(norm(first(x)))"),
    ("mlp", {"approximate": True}, "first_divergence", "Functional.gelu.0.forward", "Cell.act.GELU.forward.0",
     "self.act(norm(first(x)))"),
    ("mlp", {"transposed": True}, "first_divergence", "Functional.matmul.0.forward",
     "Cell.fc2.TransposedDense.forward.0", "ops.matmul(x, self.weight)"),
    ("attention", {"scaled": False}, "first_only_in_golden", "Tensor.div.0.forward",
     "Module.attn.PtAttention.forward.0",
     "/ math.sqrt(self.d)"),
    ("attention", {"axis": -2}, "first_divergence", "Functional.softmax.0.forward", "Cell.attn.MsAttention.forward.0",
     "ops.softmax(scores, axis=self.axis)"),
    ("mlp", {"shifted": True}, "first_only_in_target", "Tensor.sub.0.forward", None, "ops.relu(h - 0.05)"),
]


@pytest.mark.parametrize("kind,ms_kwargs,key,name,cell,line", BUGS, ids=["layernorm_eps", "gelu_approximation",
                                                                         "transposed_dense", "attention_scale",
                                                                         "softmax_axis", "extra_op"])
def test_each_porting_bug_is_named_at_its_call_in_its_cell(kind, ms_kwargs, key, name, cell, line, capsys):
    pt_net, ms_net, shape = twins(kind, **ms_kwargs)
    result = NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=((shape, np.float32),))
    found = result[key]
    assert found is not None and found["name"] == name, (key, found, result["first_divergence"])
    assert (found["parents"][-1] if cell else found["parents"]) == (cell or []) and found["input_set"] == 0
    assert line in found["stack"][0]
    assert not result["agree"] and not result["allclose"]
    if key == "first_divergence":   # nothing before it: it is the first
        assert result["first_only_in_target"] is None and result["first_only_in_golden"] is None
    # the output rows say what the test measures itself
    x = np.random.RandomState(1234).standard_normal(shape).astype(np.float32)
    pt_net.eval()
    with torch.no_grad():
        expected = pt_net(torch.from_numpy(x)).numpy()
    got = ms_output(ms_net, x)
    assert not np.allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert result["outputs"][0]["max_abs"] == pytest.approx(float(np.abs(got - expected).max()), rel=1e-6)
    out = capsys.readouterr().out
    assert "the port departs from PyTorch" in out and "not allclose" in out


def test_mindspores_default_layernorm_epsilon_in_a_port_is_named():
    """nn.LayerNorm((16,)) as a port writes it: epsilon 1e-7 where PyTorch's is 1e-5. Its outputs differ by about
    1e-5 of their magnitude, which an allclose at 1e-4 lets through and compare names."""
    pt_net, ms_net, _ = twins("attention", norm_eps=1e-7)
    result = NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=(((8, 64, 16), np.float32),))
    found = result["first_divergence"]
    assert found["name"] == "Primitive.LayerNorm.0.forward" and found["parents"] == ["Cell.norm.LayerNorm.forward.0"]
    assert result["allclose"] and not result["agree"]


def test_the_argument_that_differs_is_said():
    pt_net, ms_net, shape = twins("attention", axis=-2)
    found = NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=((shape, np.float32),))["first_divergence"]
    assert "argument input.dim differs: target -2, golden -1" in found["reason"]
    pt_net, ms_net, shape = twins("mlp", approximate=True)
    found = NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=((shape, np.float32),))["first_divergence"]
    assert "argument input.approximate differs" in found["reason"]


# -- renamed attributes ---------------------------------------------------------------------------------------------
def test_renamed_attributes_need_a_name_map_and_work_with_one(tmp_path):
    pt_net, ms_net, shape = twins("mlp", names=("dense1", "ln"))
    with pytest.raises(NetDifferenceError, match=r"weights: 4 MindSpore parameters without a PyTorch source of "
                                                 r"their shape: dense1\.weight \(no PyTorch source\), "
                                                 r"dense1\.bias .*name_map="):
        NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=((shape, np.float32),))
    result = NetDifferenceFinder(pt_net, ms_net, name_map={"fc1": "dense1", "norm": "ln"}).compare(
        auto_inputs=((shape, np.float32),))
    assert result["agree"] and result["counts"]["unmatched_target"] <= 2, result["counts"]  # the dropouts' records
    # get_weight_map's file, edited where the port named otherwise, does the same
    path = tmp_path / "map.json"
    written = get_weight_map(pt_net, str(path))
    assert written["norm.weight"] == "norm.gamma" and written["fc1.weight"] == "fc1.weight"
    edited = {k: v.replace("fc1.", "dense1.").replace("norm.", "ln.") for k, v in json.load(open(path)).items()}
    path.write_text(json.dumps(edited))
    pt_net, ms_net, shape = twins("mlp", names=("dense1", "ln"), eps=1e-2)
    result = NetDifferenceFinder(pt_net, ms_net, name_map=str(path)).compare(auto_inputs=((shape, np.float32),))
    found = result["first_divergence"]
    assert found["name"] == "Primitive.LayerNorm.0.forward" and found["parents"] == ["Cell.ln.LayerNorm.forward.0"]


def test_get_weight_map_names_norm_parameters_as_mindspore_does(tmp_path):
    pt_net, ms_net, _ = twins("cnn")
    guessed = get_weight_map(pt_net, str(tmp_path / "map.json"))
    assert guessed == {"conv.weight": "conv.weight", "bn.weight": "bn.gamma", "bn.bias": "bn.beta",
                       "bn.running_mean": "bn.moving_mean", "bn.running_var": "bn.moving_variance",
                       "head.weight": "head.weight", "head.bias": "head.bias"}
    assert json.load(open(tmp_path / "map.json")) == guessed
    exact = get_weight_map(pt_net, str(tmp_path / "exact.json"), ms_net=ms_net)
    assert exact == guessed
    before = ms_net.bn.gamma.asnumpy().copy()
    assert np.array_equal(ms_net.bn.gamma.asnumpy(), before)   # reading the names wrote nothing


def test_get_weight_map_says_which_names_found_no_parameter(tmp_path, caplog):
    pt_net, ms_net, _ = twins("mlp", names=("dense1", "norm"))   # the port calls fc1 dense1
    written = get_weight_map(pt_net, str(tmp_path / "map.json"), ms_net=ms_net)
    assert written["fc1.weight"] == "fc1.weight" and written["norm.weight"] == "norm.gamma"
    said = [r.getMessage() for r in caplog.records if "get_weight_map" in r.getMessage()]
    assert len(said) == 1 and "2 PyTorch names found no MindSpore parameter" in said[0]
    assert "fc1.weight, fc1.bias" in said[0]


# -- inputs, modes, dumps -----------------------------------------------------------------------------------------
def test_several_input_sets_given_or_generated_are_each_compared(tmp_path):
    pt_net, ms_net, _ = twins("mlp", eps=1e-2)
    x = np.random.RandomState(5).standard_normal((3, 16)).astype(np.float32)
    result = NetDifferenceFinder(pt_net, ms_net, dump_path=str(tmp_path / "dumps")).compare(
        inputs=[(x,), (torch.from_numpy(x[:2]),), ms.Tensor(x[:1])])
    assert [s["input_set"] for s in result["input_sets"]] == [0, 1, 2]
    assert all(s["first_divergence"]["name"] == "Primitive.LayerNorm.0.forward" for s in result["input_sets"])
    assert [o["shape"] for o in result["outputs"]] == [[3, 32], [2, 32], [1, 32]]
    for step in range(3):
        for side in ("mindspore", "pytorch"):
            assert os.path.isfile(tmp_path / "dumps" / side / f"step{step}" / "rank" / "dump.json")
    assert os.path.isfile(tmp_path / "dumps" / "compare" / "summary.json")
    generated = NetDifferenceFinder(*twins("mlp")[:2]).compare(auto_inputs=[(((4, 16), np.float32),),
                                                                             (((2, 16), np.float32),)])
    assert generated["agree"] and [i[0][0] for i in generated["inputs"]] == [[4, 16], [2, 16]]


def test_training_mode_compares_the_backward_too_and_leaves_the_networks_as_they_were():
    pt_net, ms_net, shape = twins("cnn")
    running = pt_net.bn.running_mean.clone()
    flags = [m.training for m in pt_net.modules()]
    eval_result = NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=((shape, np.float32),))
    result = NetDifferenceFinder(pt_net, ms_net, train=True,
                                 loss_fn=(lambda out: (out ** 2).mean(), lambda out: (out ** 2).mean())).compare(
        auto_inputs=((shape, np.float32),))
    assert result["agree"] and result["mode"] == "train", (result["counts"], result["first_divergence"])
    assert result["counts"]["pass"] > 2 * eval_result["counts"]["pass"]   # backward records and gradients
    assert torch.equal(pt_net.bn.running_mean, running) and pt_net.conv.weight.grad is None
    assert [m.training for m in pt_net.modules()] == flags
    assert np.array_equal(ms_net.bn.moving_mean.asnumpy(), running.numpy())


def test_a_convolution_bias_before_batch_norm_trains_alike():
    """A bias before BatchNorm: its gradient is zero in exact arithmetic, rounding noise in both frameworks, and
    MindSpore's BiasAdd gradient sums in another order (several times PyTorch's noise): not a difference."""
    class Pt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), \
                torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    class Ms(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
            self.bn, self.fc = nn.BatchNorm2d(8), nn.Dense(8, 4)

        def construct(self, x):
            return self.fc(ops.relu(self.bn(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    result = NetDifferenceFinder(Pt(), Ms(), train=True).compare(auto_inputs=(((2, 3, 8, 8), np.float32),))
    assert result["agree"], (result["counts"], result["first_divergence"])
    assert result["counts"]["error"] == 0 and result["counts"]["pass"] > 20


def test_the_users_program_is_unchanged_afterwards():
    pt_net, ms_net, shape = twins("mlp")
    x = torch.from_numpy(np.random.RandomState(2).standard_normal(shape).astype(np.float32))
    pt_net.train()
    torch.manual_seed(3)
    before = pt_net(x).detach()
    dropout, ms_dropout = torch.nn.functional.dropout, nn.Dropout.construct
    NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=((shape, np.float32),))
    assert torch.nn.functional.dropout is dropout and nn.Dropout.construct is ms_dropout
    assert pt_net.training and not any(c.training for _, c in ms_net.cells_and_names())
    torch.manual_seed(3)
    assert torch.equal(pt_net(x).detach(), before)      # dropout active again, the same draws


def test_a_training_run_keeps_the_users_gradients_modes_and_generators():
    """Gradients the user holds are neither changed (a backward adds into them in place) nor dumped as the
    run's; MindSpore's cells keep their phase and training flags; the random generators go on as they were."""
    pt_net, ms_net, shape = twins("cnn")
    for p in pt_net.parameters():
        p.grad = torch.ones_like(p)
    ms_net.set_train(False)
    modes = [(c.phase, dict(c.get_flags()), c.training) for _, c in ms_net.cells_and_names()]
    torch.manual_seed(7)
    np.random.seed(7)
    ms.set_seed(7)
    expected = (torch.rand(3), np.random.rand(3))
    torch.manual_seed(7)
    np.random.seed(7)
    result = NetDifferenceFinder(pt_net, ms_net, train=True).compare(auto_inputs=((shape, np.float32),))
    assert result["agree"], (result["counts"], result["first_divergence"])  # the run's own gradients compared
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in pt_net.parameters())
    assert [(c.phase, dict(c.get_flags()), c.training) for _, c in ms_net.cells_and_names()] == modes
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])


@pytest.mark.parametrize("kwargs,compare_kwargs,message", [
    ({}, {}, "give exactly one of inputs"),
    ({}, {"auto_inputs": (((4, 16), "float99"),)}, r"auto_inputs\[0\]: 'float99' is not a numpy dtype"),
    ({}, {"auto_inputs": ((4, 16), np.float32)}, r"auto_inputs\[0\]: expected a \(shape, dtype\) pair"),
    ({}, {"inputs": ("text",)}, "inputs: expected numpy arrays or tensors"),
    ({"level": "L2"}, {}, "level: expected one of L0, L1, mix, got 'L2'"),
    ({"loss_fn": print}, {}, r"loss_fn: expected a pair \(pytorch_loss, mindspore_loss\)"),
    ({"name_map": "/nonexistent/map.json"}, {}, "name_map /nonexistent/map.json: no such file"),
    ({}, {"auto_inputs": (((4, 16), np.float32),), "rtol": -1}, "rtol: expected a finite number of at least 0"),
])
def test_bad_arguments_are_named_in_one_line(kwargs, compare_kwargs, message):
    pt_net, ms_net, _ = twins("mlp")
    with pytest.raises(NetDifferenceError, match=message):
        NetDifferenceFinder(pt_net, ms_net, **kwargs).compare(**compare_kwargs)


def test_a_network_that_raises_leaves_no_hook_behind():
    pt_net, ms_net, _ = twins("mlp")
    linear, matmul = torch.nn.functional.linear, ops.matmul
    with pytest.raises(RuntimeError):   # 8 features where the network takes 16: PyTorch's own error
        NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=(((4, 8), np.float32),))
    assert torch.nn.functional.linear is linear and ops.matmul is matmul
    assert not pt_net.fc1._forward_hooks and not pt_net.fc1._forward_pre_hooks
    x = torch.ones(2, 16)
    assert torch.equal(pt_net.fc1(x), x @ pt_net.fc1.weight.T + pt_net.fc1.bias)
    result = NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=(((4, 16), np.float32),))
    assert result["agree"]   # and a new run works


def test_at_L0_code_between_cells_is_found_where_its_difference_arrives():
    """The softmax over the wrong axis runs in MsAttention's own construct, between its Dense cells: at L0 no
    record holds it, and the first cell receiving its difference (attn.proj) is named, at the line that calls it."""
    pt_net, ms_net, shape = twins("attention", axis=-2)
    result = NetDifferenceFinder(pt_net, ms_net, level="L0").compare(auto_inputs=((shape, np.float32),))
    assert result["first_divergence"] is None and not result["agree"]
    found = result["first_seen"]
    assert found["name"] == "Cell.attn.proj.Dense.forward.0"
    assert "ops.softmax(scores, axis=self.axis)" in found["stack"][0]


def test_tensor_dumps_name_the_same_call():
    """task="tensor": compare measures the tensors themselves (cosine, errors) and names the same call."""
    pt_net, ms_net, shape = twins("mlp")
    assert NetDifferenceFinder(pt_net, ms_net, task="tensor").compare(auto_inputs=((shape, np.float32),))["agree"]
    pt_net, ms_net, shape = twins("mlp", approximate=True)
    found = NetDifferenceFinder(pt_net, ms_net, task="tensor").compare(
        auto_inputs=((shape, np.float32),))["first_divergence"]
    assert found["name"] == "Functional.gelu.0.forward" and found["parents"] == ["Cell.act.GELU.forward.0"]
