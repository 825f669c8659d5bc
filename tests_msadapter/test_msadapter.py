"""The MSAdapter lane (Python 3.9, MindSpore 2.0.0, MSAdapter 0.1.0): one PyTorch-style script dumped on
MSAdapter, checked against numbers computed here, against the same script dumped on real PyTorch (run by
the main lane's Python, `MSPROBE_LITE_TORCH_PYTHON`), and for bitwise-unchanged training."""
from __future__ import annotations

import json
import math
import os
import subprocess
import zlib

import numpy as np
import pytest

import mindspore as ms
import msadapter.pytorch as torch  # noqa: F401 - imported before the debugger: the MSAdapter scenario
import msadapter_demo as demo
from helpers import expected_stats, load

from msprobe_lite.compare import compare

TORCH_PYTHON = os.environ.get("MSPROBE_LITE_TORCH_PYTHON")
DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "msadapter_demo.py")


def assert_stats(entry, array, rel=1e-5):
    array = np.asarray(array, dtype=np.float64)
    assert entry["shape"] == list(array.shape) and entry["dtype"] == "Float32"
    for key, want in zip(("Max", "Min", "Mean", "Norm"), expected_stats(array)):
        assert math.isclose(entry[key], want, rel_tol=rel, abs_tol=1e-6), (key, entry[key], want)


def weights(kind):
    model, _ = demo.build(kind)
    return demo.weights_for(model), np.random.RandomState(1).randn(*demo.MODELS[kind][1]).astype(np.float32)


def conv2d_same(x, w, b):
    """3x3 convolution, stride 1, padding 1, computed with numpy only."""
    n, c, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(h):
        for j in range(wd):
            patch = padded[:, :, i:i + 3, j:j + 3]
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out + b[None, :, None, None]


def test_mlp_dump_is_mindtorch_with_values_from_numpy(tmp_path):
    demo.run("mlp", str(tmp_path), "L0")
    dump = load(tmp_path)
    assert dump["framework"] == "mindtorch"
    d = dump["data"]
    w, x = weights("mlp")
    h = x @ w["fc1.weight"].T + w["fc1.bias"]
    out = np.maximum(h, 0) @ w["fc2.weight"].T + w["fc2.bias"]
    assert_stats(d["Module.fc1.Linear.forward.0"]["input_args"][0], x)
    assert_stats(d["Module.fc1.Linear.forward.0"]["parameters"]["weight"], w["fc1.weight"])
    assert_stats(d["Module.fc1.Linear.forward.0"]["output"][0], h)
    assert_stats(d["Module.fc2.Linear.forward.0"]["output"][0], out)
    g_out = 2 * out / out.size                                      # d mean(out^2) / d out
    assert_stats(d["Module.fc2.Linear.backward.0"]["input"][0], g_out)
    assert_stats(d["Module.fc2.Linear.backward.0"]["output"][0], g_out @ w["fc2.weight"])
    assert d["Module.fc1.Linear.forward.0"]["input_args"][0]["type"] == "mindspore.Tensor"


def test_cnn_dump_values_from_numpy(tmp_path):
    demo.run("cnn", str(tmp_path), "mix")
    d = load(tmp_path)["data"]
    w, x = weights("cnn")
    conv = conv2d_same(x.astype(np.float64), w["conv.weight"], w["conv.bias"])
    pooled = np.maximum(conv, 0).reshape(2, 4, 2, 2, 2, 2).max(axis=(3, 5))
    assert_stats(d["Module.conv.Conv2d.forward.0"]["output"][0], conv, rel=1e-4)
    assert_stats(d["Functional.max_pool2d.0.forward"]["output"][0], pooled, rel=1e-4)
    assert_stats(d["Module.fc.Linear.forward.0"]["input_args"][0], pooled.reshape(2, -1), rel=1e-4)
    assert d["Tensor.view.0.forward"]["input_args"][1] == {"type": "int", "value": 2}


@pytest.mark.skipif(not TORCH_PYTHON, reason="MSPROBE_LITE_TORCH_PYTHON (the main lane's Python) not given")
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_names_match_real_pytorch_and_the_cross_compare_passes(tmp_path, kind, level):
    subprocess.run([TORCH_PYTHON, DEMO, "--backend", "torch", "--model", kind, "--level", level,
                    "--dump", str(tmp_path / "torch")], check=True, capture_output=True, timeout=600)
    demo.run(kind, str(tmp_path / "msadapter"), level)
    names = list(load(tmp_path / "msadapter")["data"])
    torch_names = list(load(tmp_path / "torch")["data"])
    assert names and set(names) <= set(torch_names), set(names) - set(torch_names)
    forward = [n for n in torch_names if n.startswith("Module.") and ".forward." in n]
    assert [n for n in names if n.startswith("Module.") and ".forward." in n] == forward
    summary = compare(str(tmp_path / "msadapter" / "step0"), str(tmp_path / "torch" / "step0"),
                      str(tmp_path / "out"), quiet=True)
    pair = summary.pairs[0]
    counts = pair["counts"]
    assert counts["error"] == 0 and counts["unmatched_target"] == 0, (counts, pair["first_divergence"])
    assert counts["pass"] + counts["warning"] == len(names)
    # what PyTorch records and MSAdapter cannot: parameter gradients and API backward (no tensor hooks on
    # MindSpore 2.0), the F.linear/F.conv2d that PyTorch's layers call internally
    extra = set(torch_names) - set(names)
    assert all(".parameters_grad." in n or n.endswith(".backward") or n.startswith("Functional.linear")
               or n.startswith("Functional.conv2d") for n in extra), extra


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_training_is_bitwise_identical_with_the_debugger(tmp_path, kind, level):
    loss_a, grads_a = demo.run(kind, None)
    loss_b, grads_b = demo.run(kind, str(tmp_path), level)
    assert loss_a.tobytes() == loss_b.tobytes()
    for a, b in zip(grads_a, grads_b):
        assert a.tobytes() == b.tobytes()


def test_idle_debugger_leaves_msadapter_untouched(tmp_path):
    import msadapter.pytorch.nn.functional as F

    relu, add = F.relu, torch.Tensor.__dict__.get("__add__")
    baseline = demo.run("mlp", None)
    from msprobe_lite.mindspore import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix", step=[0])
    model, x = demo.build("mlp")
    debugger.start(model)
    assert F.relu is not relu
    demo.train_step(model, x)
    debugger.stop()
    assert F.relu is relu and torch.Tensor.__dict__.get("__add__") is add
    debugger.step()                      # the last step: hooks removed too
    assert all(not c._forward_hook and not c._forward_pre_hook for _, c in model.cells_and_names())
    again = demo.run("mlp", None)
    assert baseline[0].tobytes() == again[0].tobytes()


def test_md5_and_tensor_tasks(tmp_path):
    from msprobe_lite.mindspore import PrecisionDebugger

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "md5"), "level": "L1",
                                  "statistics": {"summary_mode": "md5"}}))
    model, x = demo.build("mlp")
    debugger = PrecisionDebugger(str(config))
    debugger.start(model)
    demo.train_step(model, x)
    debugger.stop()
    debugger.step()
    entry = load(tmp_path / "md5")["data"]["Functional.relu.0.forward"]["input_args"][0]
    w, xa = weights("mlp")
    h = (xa @ w["fc1.weight"].T + w["fc1.bias"]).astype(np.float32)
    assert entry["md5"] == f"{zlib.crc32(h.tobytes()):08x}" or entry["Max"] == pytest.approx(h.max(), rel=1e-6)
    demo.run("mlp", str(tmp_path / "tensor"), "L0", task="tensor")
    dump = load(tmp_path / "tensor")
    entry = dump["data"]["Module.fc1.Linear.forward.0"]["input_args"][0]
    saved = np.load(os.path.join(dump["dump_data_dir"], entry["data_name"]), allow_pickle=False)
    assert entry["data_name"].endswith(".npy") and np.array_equal(saved, xa)


PLAIN_MINDSPORE = """
import json, os, sys
import numpy as np
import mindspore as ms
from mindspore import nn, ops
from msprobe_lite.mindspore import PrecisionDebugger

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 2)

    def construct(self, x):
        return ops.tanh(self.fc(x))

net, out = Net(), sys.argv[1]
debugger = PrecisionDebugger(dump_path=out, task="statistics", level="mix")
x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) / 10)
debugger.start(net)
y = ms.value_and_grad(lambda inp: net(inp).sum(), 0, net.trainable_params())(x)
debugger.stop()
debugger.step()
np.savez(os.path.join(out, "weights.npz"), w=net.fc.weight.asnumpy(), b=net.fc.bias.asnumpy(), x=x.asnumpy())
"""


def test_plain_mindspore_cells_on_mindspore_2_0(tmp_path):
    """The MindSpore part of the package on MindSpore 2.0, without MSAdapter: an nn.Cell network."""
    import sys

    subprocess.run([sys.executable, "-c", PLAIN_MINDSPORE, str(tmp_path)], check=True, timeout=600,
                   capture_output=True)
    dump = load(tmp_path)
    assert dump["framework"] == "mindspore"
    d = dump["data"]
    saved = np.load(tmp_path / "weights.npz")
    h = saved["x"] @ saved["w"].T + saved["b"]
    assert_stats(d["Cell.fc.Dense.forward.0"]["output"][0], h)
    assert_stats(d["Functional.tanh.0.forward"]["output"][0], np.tanh(h))
    assert_stats(d["Cell.fc.Dense.backward.0"]["input"][0], 1 - np.tanh(h) ** 2)
