"""Compiled MindSpore (GRAPH_MODE, `mindspore.jit`) dumped through MindSpore's own Dump and converted.

MindSpore reads MINDSPORE_DUMP_CONFIG once, at a process's first graph compile: each run is a script of its
own (`SCRIPT`), which saves the inputs and initial weights beside the dump; the statistics are checked here
against numpy from those values. Facts of MindSpore 2.10 on the CPU that the code relies on are checked too."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn, ops  # noqa: E402

from msprobe_lite.compare import compare  # noqa: E402
from msprobe_lite.core import mindspore_dump as native_read  # noqa: E402
from msprobe_lite.mindspore import PrecisionDebugger  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NETS = '''
import numpy as np
import mindspore as ms
from mindspore import nn, ops


class DenseNorm(nn.Cell):
    def __init__(self):
        super().__init__()
        self.d = nn.Dense(4, 8)
        self.ln = nn.LayerNorm((8,))
        self.d2 = nn.Dense(8, 2)

    def construct(self, x):
        return self.d2(ops.relu(self.ln(self.d(x))))


class ConvBN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Dense(4 * 5 * 5, 3)

    def construct(self, x):
        return self.fc(ops.relu(self.bn(self.conv(x))).reshape(x.shape[0], -1))


class Attention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.q = nn.Dense(8, 8)
        self.k = nn.Dense(8, 8)
        self.v = nn.Dense(8, 8)
        self.out = nn.Dense(8, 8)

    def construct(self, x):
        s = ops.matmul(self.q(x), self.k(x).transpose(0, 2, 1)) / 2.0
        return self.out(ops.matmul(ops.softmax(s, -1), self.v(x)))


class Seq(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
        self.ln = nn.LayerNorm((2,))

    def construct(self, x):
        return self.ln(self.body(x))


def make(kind):
    ms.set_seed(0)
    net = {"dense": DenseNorm, "conv": ConvBN, "attn": Attention, "seq": Seq}[kind]()
    rs = np.random.RandomState(1)
    x = {"dense": (3, 4), "conv": (2, 2, 5, 5), "attn": (2, 3, 8), "seq": (3, 4)}[kind]
    x = ms.Tensor(rs.randn(*x).astype(np.float32))
    y = {"dense": (3, 2), "conv": (2, 3), "attn": (2, 3, 8), "seq": (3, 2)}[kind]
    y = ms.Tensor(rs.randn(*y).astype(np.float32))
    return net, x, y
'''

SCRIPT = NETS + '''
import json, sys
kind, how, dump, debug, task = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
if how in ("graph", "train_cell"):
    ms.set_context(mode=ms.GRAPH_MODE)
if debug:
    from msprobe_lite.mindspore import PrecisionDebugger
    dbg = PrecisionDebugger(dump_path=dump, task=task, level="mix",
                            native_dump=True if how == "jit" else None)
net, x, y = make(kind)
net.set_train(True)
params = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
np.savez(dump + ".start.npz", x=x.asnumpy(), y=y.asnumpy(), **params)
losses = []


def stepped(run):
    """One step of the loop, between the debugger's start() and step() when it is on."""
    if debug:
        dbg.start(net)
    value = run()
    if debug:
        dbg.stop()
        dbg.step()
    return value


if how == "graph":
    for _ in range(2):
        losses.append(stepped(lambda: net(x).asnumpy().tolist()))
elif how == "train_cell":
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    for i in range(2):
        losses.append(stepped(lambda: float(step(x, y).asnumpy())))
else:
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = nn.MSELoss()

    def forward_fn(inp, target):
        return loss_fn(net(inp), target)

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)

    @ms.jit
    def train_step(inp, target):
        loss, grads = grad_fn(inp, target)
        opt(grads)
        return loss

    for i in range(2):
        losses.append(stepped(lambda: float(train_step(x, y).asnumpy())))
        np.savez(dump + f".after{i}.npz", **{p.name: p.asnumpy().copy() for p in net.trainable_params()})
import os
print("ENV", os.environ.get("MINDSPORE_DUMP_CONFIG"))
print("LOSSES", json.dumps(losses))
'''


def run(tmp_path, kind, how, debug=True, name="dump", task="statistics"):
    script = tmp_path / "net_script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "MINDSPORE_DUMP_CONFIG"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    dump = str(tmp_path / name)
    done = subprocess.run([sys.executable, str(script), kind, how, dump, "1" if debug else "0", task],
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("LOSSES"))[7:])
    return dump, dict(np.load(dump + ".start.npz")), losses, done.stdout


def dump_data(dump, step=0, what="dump.json"):
    with open(os.path.join(dump, f"step{step}", "rank", what)) as f:
        content = json.load(f)
    return content["data"] if what == "dump.json" else content


def stats(a):
    a = np.asarray(a, np.float64)
    return float(a.max()), float(a.min()), float(a.mean()), float(np.sqrt((a * a).sum()))


def check(entry, want, rel=1e-5):
    assert entry["shape"] == list(np.shape(want)), (entry, np.shape(want))
    for key, w in zip(("Max", "Min", "Mean", "Norm"), stats(want)):
        assert math.isclose(entry[key], w, rel_tol=rel, abs_tol=1e-5), (key, entry[key], w)


def dense(x, p, name):
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def layer_norm(x, g, b, eps=1e-7):
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def conv_same3(x, w, b):
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, _, h, wd = x.shape
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(h):
        for j in range(wd):
            out[:, :, i, j] = np.einsum("ncij,ocij->no", pad[:, :, i:i + 3, j:j + 3], w)
    return out + b[None, :, None, None]


def batch_norm(x, g, b, eps=1e-5):
    m, v = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g[None, :, None, None] + b[None, :, None, None]


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_mindspore_cpu_facts():
    """What the code and docs say of MindSpore's Dump on the CPU: "statistic" is refused (so statistics come
    from tensor files), and file names carry a dtype field after the format."""
    parsed = native_read.parse_name("MatMul.Default_d-Dense_MatMul-op0.0.0.1795869758107297.output.0."
                                    "DefaultFormat.Float32.npy")
    assert parsed == ("MatMul", "Default_d-Dense_MatMul-op0", 1795869758107297, "output", 0)
    assert native_read.cells_of("Default/network-WithLossCell/_backbone-Net/d-Dense/MatMul-op3") == (
        "forward", [("d", "Dense")], "MatMul")
    assert native_read.cells_of("Gradients/Default/Grad_MatMul/MatMul-op1") == ("backward", [], "MatMul")


def test_graph_mode_dense_layernorm_converted(tmp_path):
    dump, v, losses, printed = run(tmp_path, "dense", "graph")
    without = run(tmp_path, "dense", "graph", debug=False, name="plain")[2]
    assert losses == without   # the Dump reads, never changes
    x = v["x"].astype(np.float64)
    h = dense(x, v, "d")
    n = layer_norm(h, v["ln.gamma"], v["ln.beta"])
    out = dense(np.maximum(n, 0), v, "d2")
    for step in (0, 1):
        d = dump_data(dump, step)
        check(d["Cell.d.Dense.forward.0"]["input_args"][0], x)
        check(d["Cell.d.Dense.forward.0"]["output"][0], h)
        check(d["Cell.ln.LayerNorm.forward.0"]["output"][0], n)
        check(d["Cell.d2.Dense.forward.0"]["output"][0], out)
        check(d["Kernel.d.MatMul.0.forward"]["output"][0], x @ v["d.weight"].T)
        check(d["Kernel.ReLU.0.forward"]["output"][0], np.maximum(n, 0))
        if step == 0:   # the parameters as the kernels read them (the Parameter files hold them after the step)
            check(d["Cell.d.Dense.forward.0"]["parameters"]["weight"], v["d.weight"])
            check(d["Cell.ln.LayerNorm.forward.0"]["parameters"]["gamma"], v["ln.gamma"])
    construct = dump_data(dump, 0, "construct.json")
    assert construct["Kernel.d.BiasAdd.0.forward"] == "Cell.d.Dense.forward.0"
    assert construct["Cell.d.Dense.forward.0"] is None
    stacks = dump_data(dump, 0, "stack.json")
    frames = next(f for names, f in stacks.values() if "Kernel.d.MatMul.0.forward" in names)
    assert "net_script.py" in frames[0] and "self.d2(ops.relu(self.ln(self.d(x))))" in frames[0]
    native = json.load(open(os.path.join(dump, "native_dump.json")))["common_dump_settings"]
    assert native["saved_data"] == "tensor" and native["iteration"] == "all"
    assert "ENV None" in printed   # removed once read: processes started later do not dump


def test_graph_mode_conv_batchnorm_converted(tmp_path):
    dump, v, _, _ = run(tmp_path, "conv", "graph")
    x = v["x"].astype(np.float64)
    c = conv_same3(x, v["conv.weight"], v["conv.bias"])
    b = batch_norm(c, v["bn.gamma"], v["bn.beta"])
    d = dump_data(dump, 0)
    check(d["Cell.conv.Conv2d.forward.0"]["input_args"][0], x)
    check(d["Cell.conv.Conv2d.forward.0"]["output"][0], c)
    check(d["Cell.bn.BatchNorm2d.forward.0"]["output"][0], b, rel=1e-4)
    check(d["Cell.fc.Dense.forward.0"]["output"][0], dense(np.maximum(b, 0).reshape(2, -1), v, "fc"), rel=1e-4)


def test_graph_mode_softmax_attention_converted(tmp_path):
    dump, v, _, _ = run(tmp_path, "attn", "graph")
    x = v["x"].astype(np.float64)
    q, k, val = dense(x, v, "q"), dense(x, v, "k"), dense(x, v, "v")
    p = softmax(q @ k.transpose(0, 2, 1) / 2.0)
    d = dump_data(dump, 0)
    soft = [n for n in d if n.startswith("Kernel.") and "Softmax" in n]
    assert soft, list(d)
    check(d[soft[0]]["output"][0], p)
    check(d["Cell.out.Dense.forward.0"]["output"][0], dense(p @ val, v, "out"), rel=1e-4)


def test_jit_train_step_converted_each_step(tmp_path):
    """The tutorial's `@ms.jit` train step (value_and_grad and the optimizer inside): kernels of the forward,
    the backward (`Gradients/` scopes) and the optimizer, each step its own; the cells are found from the
    source lines (a jit function's scopes are only `Default/`) against the network given to start()."""
    dump, v, losses, _ = run(tmp_path, "conv", "jit")
    assert losses == run(tmp_path, "conv", "jit", debug=False, name="plain")[2]
    after0 = dict(np.load(dump + ".after0.npz"))
    for step, w in ((0, v), (1, after0)):
        d = dump_data(dump, step)
        x = v["x"].astype(np.float64)
        check(d["Cell.conv.Conv2d.forward.0"]["output"][0], conv_same3(x, w["conv.weight"], w["conv.bias"]),
              rel=1e-4)
        assert any(n.endswith(".backward") for n in d) and any(".SGD." in n for n in d), list(d)
    assert dump_data(dump, 1)["Cell.conv.Conv2d.forward.0"] != dump_data(dump, 0)["Cell.conv.Conv2d.forward.0"]


def pynative_dump(tmp_path, v, plant=None):
    """The same network in PyNative, with the graph run's initial weights, dumped at L0 by hooks."""
    namespace = {}
    exec(compile(NETS, "nets", "exec"), namespace)
    net, _, _ = namespace["make"]("dense")
    for p in net.trainable_params():
        value = v[p.name] + (0.5 if p.name == plant else 0.0)
        p.set_data(ms.Tensor(value.astype(np.float32)))
    if plant == "eps":   # a computation that differs, on the same inputs and weights
        net.ln.layer_norm = ops.LayerNorm(-1, -1, 0.1)
    x = ms.Tensor(v["x"])
    path = str(tmp_path / f"pynative_{plant}")
    dbg = PrecisionDebugger(dump_path=path, task="statistics", level="L0", native_dump=False)
    for _ in range(2):
        dbg.start(net)
        net(x)
        dbg.stop()
        dbg.step()
    return path


def first_named(pair):
    """The call compare names first: a planted weight shows in the cell's `parameters`, so compare names it as
    the first difference seen (explained by its parameters) rather than one its computation introduced."""
    found = pair["first_divergence"] or pair["first_seen"]
    assert found is not None, pair
    return found["name"]


def test_compare_graph_dump_against_pynative_at_cell_level(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    dump, v, _, _ = run(tmp_path, "dense", "graph")
    same = compare(dump, pynative_dump(tmp_path, v), str(tmp_path / "cmp"), html=False, quiet=True)
    for pair in same.pairs:
        assert pair["first_divergence"] is None, pair
        assert pair["counts"]["error"] == pair["counts"]["warning"] == 0 and pair["counts"]["pass"] == 3, pair
    planted = compare(dump, pynative_dump(tmp_path, v, plant="d2.bias"), str(tmp_path / "cmp2"), html=False,
                      quiet=True)
    assert first_named(planted.pairs[0]) == "Cell.d2.Dense.forward.0", planted.pairs[0]
    computed = compare(dump, pynative_dump(tmp_path, v, plant="eps"), str(tmp_path / "cmp3"), html=False,
                       quiet=True)
    assert computed.pairs[0]["first_divergence"]["name"] == "Cell.ln.LayerNorm.forward.0", computed.pairs[0]


def test_compare_and_overflow_check_read_the_native_folder(tmp_path):
    """`-tp` naming MindSpore's Dump `path` itself: its iterations are steps, its rank_{id} the rank."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    dump, v, _, _ = run(tmp_path, "dense", "graph")
    native = os.path.join(dump, "native")
    summary = compare(native, pynative_dump(tmp_path, v), str(tmp_path / "cmp"), html=False, quiet=True)
    assert len(summary.pairs) == 2
    for pair in summary.pairs:
        assert pair["first_divergence"] is None and pair["counts"]["error"] == 0, pair
    planted = compare(native, pynative_dump(tmp_path, v, plant="d.weight"), str(tmp_path / "cmp2"), html=False,
                      quiet=True)
    assert first_named(planted.pairs[0]) == "Cell.d.Dense.forward.0", planted.pairs[0]
    done = subprocess.run([sys.executable, "-m", "msprobe_lite", "overflow_check", "-i", native, "-o",
                           str(tmp_path / "ov")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[step 0 rank 0] no call turns finite inputs into NaN/Inf" in done.stdout, done.stdout


def test_native_config_from_config_json():
    from msprobe_lite.config import load_config
    from msprobe_lite.mindspore.native_dump import native_config

    cfg = load_config(None, task="tensor", dump_path="/tmp/x", level="mix", step=[0, "3-5"])
    c = native_config(cfg, "CPU")["common_dump_settings"]
    assert c["iteration"] == "0|3-5" and c["saved_data"] == "tensor" and c["dump_mode"] == 0
    cfg = load_config(None, task="statistics", dump_path="/tmp/x", level="mix")
    assert native_config(cfg, "GPU")["common_dump_settings"]["saved_data"] == "statistic"


def test_compare_graph_dump_against_pytorch_at_module_level(tmp_path):
    """The cell paths of the kernels' scopes meet PyTorch's module paths: `Cell.d.Dense` pairs with
    `Module.d.Linear`."""
    torch = pytest.importorskip("torch")
    from msprobe_lite.pytorch import PrecisionDebugger as TorchDebugger

    dump, v, _, _ = run(tmp_path, "dense", "graph")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.d, self.ln, self.d2 = torch.nn.Linear(4, 8), torch.nn.LayerNorm(8, eps=1e-7), torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.d2(torch.relu(self.ln(self.d(x))))

    def torch_dump(plant):
        net = Net()
        names = {"ln.weight": "ln.gamma", "ln.bias": "ln.beta"}
        net.load_state_dict({k: torch.tensor(v[names.get(k, k)] + (0.5 if k == plant else 0.0))
                             for k in net.state_dict()})
        path = str(tmp_path / f"torch_{plant}")
        dbg = TorchDebugger(dump_path=path, task="statistics", level="L0")
        for _ in range(2):
            dbg.start(net)
            net(torch.tensor(v["x"]))
            dbg.stop()
            dbg.step()
        return path

    same = compare(dump, torch_dump(None), str(tmp_path / "cmp"), html=False, quiet=True)
    for pair in same.pairs:
        assert pair["first_divergence"] is None and pair["counts"]["pass"] == 3, pair
    planted = compare(dump, torch_dump("d2.bias"), str(tmp_path / "cmp2"), html=False, quiet=True)
    assert first_named(planted.pairs[0]) == "Cell.d2.Dense.forward.0", planted.pairs[0]
    from msprobe_lite.mindspore.native_dump import kernels_of

    class Sel:
        list = ["Cell.d2.Dense.forward.0", "relu", "Functional.relu.0.forward"]
        scope = []
    # MindSpore 2.10 CPU dumps exactly d2's kernels and the ReLU with these (tried by hand)
    assert kernels_of(Sel) == ["name-regex(.*d2-Dense/.*)", "relu"]


def test_statistic_csv_is_read_where_there_are_no_tensor_files(tmp_path):
    """GPU and Ascend write statistic.csv (the CPU refuses "statistic"): a copy of a CPU Dump whose tensor files
    are replaced by a statistic.csv in the seed's columns reads as the same records."""
    import csv
    import shutil

    dump, _, _, _ = run(tmp_path, "dense", "graph")
    native, copy = os.path.join(dump, "native"), str(tmp_path / "csv_dump")
    shutil.copytree(native, copy)
    for it_dir in [d for _, _, dirs in native_read.iterations(copy) for d in dirs]:
        rows = []
        for fn in sorted(os.listdir(it_dir)):
            parsed = native_read.parse_name(fn)
            a = np.load(os.path.join(it_dir, fn))
            os.remove(os.path.join(it_dir, fn))
            if parsed[0] == "Parameter" or a.dtype.kind not in "fc":
                continue
            st = stats(a)
            rows.append([parsed[0], parsed[1], 0, 0, parsed[2], parsed[3], parsed[4], a.nbytes, "float32",
                         "(" + ",".join(map(str, a.shape)) + ")", st[0], st[1], st[2], st[3]])
        with open(os.path.join(it_dir, "statistic.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size",
                        "Data Type", "Shape", "Max Value", "Min Value", "Avg Value", "L2Norm Value"])
            w.writerows(rows)
    from_csv = native_read.records(native_read.iterations(copy)[0][2])[0]
    from_npy = native_read.records(native_read.iterations(native)[0][2])[0]
    assert list(from_csv) == list(from_npy)
    for key in ("Max", "Min", "Mean", "Norm"):
        assert math.isclose(from_csv["Cell.d2.Dense.forward.0"]["output"][0][key],
                            from_npy["Cell.d2.Dense.forward.0"]["output"][0][key], rel_tol=1e-6)
    summary = compare(copy, native, str(tmp_path / "cmp"), html=False, quiet=True)
    assert all(p["first_divergence"] is None and p["counts"]["error"] == 0 for p in summary.pairs)


def test_task_tensor_keeps_each_tensor_as_npy(tmp_path):
    dump, v, _, _ = run(tmp_path, "dense", "graph", task="tensor")
    content = json.load(open(os.path.join(dump, "step1", "rank", "dump.json")))
    assert content["task"] == "tensor" and content["dump_data_dir"].endswith("dump_tensor_data")
    entry = content["data"]["Cell.d.Dense.forward.0"]["output"][0]
    saved = np.load(os.path.join(dump, "step1", "rank", "dump_tensor_data", entry["data_name"]), allow_pickle=False)
    np.testing.assert_allclose(saved, dense(v["x"].astype(np.float64), v, "d"), rtol=1e-5, atol=1e-6)
    assert json.load(open(os.path.join(dump, "native_dump.json")))["common_dump_settings"]["saved_data"] == "tensor"


def test_graph_mode_train_one_step_cell_scopes_name_the_network_cells(tmp_path):
    """GRAPH_MODE training through TrainOneStepCell(WithLossCell(net)): scopes run
    `Default/network-WithLossCell/_backbone-Net/body-SequentialCell/0-Dense/...`; the wrappers are left out, so
    the names are those of a PyNative dump of `net`, and the backward kernels (`Gradients/`) keep their cell."""
    dump, v, losses, _ = run(tmp_path, "seq", "train_cell")
    assert losses == run(tmp_path, "seq", "train_cell", debug=False, name="plain")[2]
    d = dump_data(dump, 0)
    x = v["x"].astype(np.float64)
    h = dense(x, v, "body.0")
    out = dense(np.maximum(h, 0), v, "body.2")
    check(d["Cell.body.0.Dense.forward.0"]["output"][0], h)
    check(d["Cell.body.2.Dense.forward.0"]["output"][0], out)
    check(d["Cell.ln.LayerNorm.forward.0"]["output"][0], layer_norm(out, v["ln.gamma"], v["ln.beta"]), rel=1e-4)
    assert dump_data(dump, 0, "construct.json")["Cell.body.0.Dense.forward.0"] == "Cell.body.SequentialCell.forward.0"
    assert "Kernel.ln.LayerNormGrad.0.backward" in d and "Kernel.SGD.0.forward" in d


def test_jit_train_step_compares_with_the_same_steps_in_pynative(tmp_path):
    """A `@ms.jit` train step's converted dump against the same training run in PyNative (hooks, L0): the
    forward cells pair and agree, both steps (the second after the compiled and the eager SGD updates)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    dump, v, losses, _ = run(tmp_path, "conv", "jit")
    namespace = {}
    exec(compile(NETS, "nets", "exec"), namespace)
    net, _, _ = namespace["make"]("conv")
    for p in net.trainable_params():
        p.set_data(ms.Tensor(v[p.name]))
    net.set_train(True)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    golden = str(tmp_path / "pynative")
    dbg = PrecisionDebugger(dump_path=golden, task="statistics", level="L0", native_dump=False)
    x, y = ms.Tensor(v["x"]), ms.Tensor(v["y"])
    eager = []
    for _ in range(2):
        dbg.start(net)
        loss, grads = grad_fn(x, y)
        opt(grads)
        dbg.stop()
        dbg.step()
        eager.append(float(loss.asnumpy()))
    np.testing.assert_allclose(eager, losses, rtol=1e-5)
    summary = compare(dump, golden, str(tmp_path / "cmp"), html=False, quiet=True)
    assert len(summary.pairs) == 2
    for pair in summary.pairs:
        assert pair["first_divergence"] is None and pair["counts"]["error"] == 0, pair
        assert pair["counts"]["pass"] >= 3, pair   # conv, bn, fc


def test_each_rank_converts_its_own_rank_folder(tmp_path):
    """The ranks of a distributed run write rank_0/, rank_1/ ... under one `path`: each converts its own."""
    import shutil

    from msprobe_lite.config import load_config
    from msprobe_lite.mindspore.native_dump import NativeDump

    dump, _, _, _ = run(tmp_path, "dense", "graph")
    root = str(tmp_path / "two_ranks")
    for r in (0, 1):
        shutil.copytree(os.path.join(dump, "native", "rank_0"), os.path.join(root, f"rank_{r}"))
    native = NativeDump.__new__(NativeDump)   # without setting MINDSPORE_DUMP_CONFIG in this process
    native.config = load_config(None, task="statistics", dump_path=str(tmp_path / "out"), level="mix")
    native.root, native.converted, native.said_nothing, native.model, native.env = root, set(), False, None, None
    assert native.convert(0, 1, "mix") > 0
    assert native.converted and all(f"{os.sep}rank_1{os.sep}" in f for f in native.converted)
    assert os.path.isfile(os.path.join(str(tmp_path / "out"), "step0", "rank1", "dump.json"))
