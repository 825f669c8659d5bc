"""Statistics rules and value encodings of the spec, on hand-made tensors and values."""
from __future__ import annotations

import collections
import dataclasses
import gc
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

from helpers import C_ROUTES, ROUTE_PARAMS, ROUTES_HERE, assert_same_files, c_route, dump_files, expected_stats

from msprobe_lite.config import load_config
from msprobe_lite.core.summary import EVERYWHERE, MAX_TAINTED
from msprobe_lite.core.values import ValueEncoder
from msprobe_lite.pytorch.summary import TorchSummarizer, tensor_stats


class _Session:
    pending: list = []
    config = load_config()


def summarize(t):
    return TorchSummarizer(_Session()).summarize(t).to_json()


def test_float32_statistics_match_numpy():
    t = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    got = tensor_stats(t)
    for g, w in zip(got, expected_stats(t)):
        assert math.isclose(g, w, rel_tol=1e-6)


def test_low_precision_accumulates_in_float32():
    # 4096 values of 1.0 + 2^-7: a bf16 running sum would stall; float32 accumulation does not
    t = torch.full((4096,), 1.0078125, dtype=torch.bfloat16)
    mx, mn, mean, norm = tensor_stats(t)
    assert mean == 1.0078125
    assert math.isclose(norm, 1.0078125 * 64, rel_tol=1e-6)
    obj = summarize(t)
    assert obj["dtype"] == "torch.bfloat16"
    h = torch.tensor([60000.0, 60000.0], dtype=torch.float16)  # the fp16 sum would overflow
    assert tensor_stats(h)[2] == 60000.0 and math.isfinite(tensor_stats(h)[3])


def test_bool_empty_zero_dim_int_float64():
    assert tensor_stats(torch.tensor([True, False])) == (True, False, None, None)
    assert tensor_stats(torch.tensor([True, True])) == (True, True, None, None)
    assert tensor_stats(torch.empty(0, 3)) == (None, None, None, None)
    assert tensor_stats(torch.tensor(-2.5)) == (-2.5, -2.5, -2.5, 2.5)
    mx, mn, mean, norm = tensor_stats(torch.tensor([2 ** 60, -3], dtype=torch.int64))
    assert (mx, mn) == (2 ** 60, -3) and isinstance(mx, int)
    assert math.isclose(mean, (2 ** 60 - 3) / 2)
    d = torch.tensor([1e-300, 3.0], dtype=torch.float64)
    assert tensor_stats(d)[1] == 1e-300


def test_nan_and_inf_are_kept():
    mx, mn, mean, norm = tensor_stats(torch.tensor([1.0, float("nan")]))
    assert math.isnan(mx) and math.isnan(mean)
    mx, mn, mean, norm = tensor_stats(torch.tensor([1.0, float("inf"), -float("inf")]))
    assert mx == math.inf and mn == -math.inf and math.isinf(norm)


def test_tensor_object_key_order_and_fields():
    t = torch.ones(2, 3, requires_grad=True)
    obj = summarize(t)
    assert list(obj) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]
    assert obj["type"] == "torch.Tensor" and obj["shape"] == [2, 3] and obj["requires_grad"] is True


def test_summary_cache_sees_inplace_changes():
    s = TorchSummarizer(_Session())
    t = torch.zeros(3)
    first = s.summarize(t)
    assert s.summarize(t) is first          # same value: computed once
    t.add_(1)
    assert s.summarize(t).stats[0] == 1.0   # in-place change: recomputed


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Cfg:
    lr: float
    t: object


def test_value_encodings():
    s = TorchSummarizer(_Session())
    enc = s.encode
    assert enc(3) == {"type": "int", "value": 3}
    assert enc(True) == {"type": "bool", "value": True}
    assert enc(1.5) == {"type": "float", "value": 1.5}
    assert enc("mean") == {"type": "str", "value": "mean"}
    assert enc(slice(1, None, 2)) == {"type": "slice", "value": [1, None, 2]}
    assert enc(...) == {"type": "ellipsis", "value": "..."}
    assert enc(None) is None
    assert enc(object()) is None
    assert enc((1, [2])) == [{"type": "int", "value": 1}, [{"type": "int", "value": 2}]]
    assert enc({"a": 1}) == {"a": {"type": "int", "value": 1}}
    assert enc(Point(1, 2)) == {"x": {"type": "int", "value": 1}, "y": {"type": "int", "value": 2}}
    assert enc(Cfg(0.1, None)) == {"lr": {"type": "float", "value": 0.1}, "t": None}
    assert enc(np.float32(1.5)) == {"type": "float32", "value": 1.5}
    arr = enc(np.array([[1.0, -2.0]], dtype=np.float32))
    assert arr["type"] == "numpy.ndarray" and arr["dtype"] == "float32" and arr["shape"] == [1, 2]
    assert (arr["Max"], arr["Min"], arr["Mean"]) == (1.0, -2.0, -0.5)
    assert enc(torch.Size([2, 3])) == {"type": "torch.Size", "value": [2, 3]}
    assert enc(torch.float16) == {"type": "torch.dtype", "value": "torch.float16"}
    assert enc(torch.device("cpu")) == {"type": "torch.device", "value": "cpu"}
    # the reference tool's shapes for these (they were null)
    assert enc(torch.channels_last) == {"type": "torch.memory_format", "format": "channels_last"}
    reduce_op = torch.distributed.ReduceOp
    assert enc(reduce_op.MAX) == {"type": "torch.distributed.ReduceOp", "value": "RedOpType.MAX"}
    assert enc(reduce_op(reduce_op.AVG)) == {"type": "torch.distributed.ReduceOp", "value": "RedOpType.AVG"}
    # a process group's ranks need torch.distributed set up (tests/test_distributed_l1.py): here, its type alone
    assert enc(torch.distributed.ProcessGroup.__new__(torch.distributed.ProcessGroup)) == {"type": "torch.ProcessGroup"}


def test_shared_scalar_encodings_keep_every_value_apart():
    """The C encoder shares the encodings of recurring bools, ints and floats and of `{}` (records are only
    read): values that compare equal but are written differently must still get their own."""
    enc = TorchSummarizer(_Session()).encode
    assert enc({}) == {}
    if C_ROUTES:  # shared by the C encoder; the Python route makes each anew
        assert enc(0.9) is enc(0.9) and enc({}) is enc({})
    pairs = [(0.0, -0.0), (1, True), (0, False), (1, 1.0), (2 ** 63 - 1, -(2 ** 63)), (2 ** 70, 2 ** 70 + 1)]
    for a, b in pairs * 2:  # twice: the second round reads the table
        for v in (a, b):
            got = enc(v)
            assert got == {"type": type(v).__name__, "value": v} and type(got["value"]) is type(v)
            assert json.dumps(got) == json.dumps({"type": type(v).__name__, "value": v})
    many = [enc(float(i) / 7) for i in range(2000)]  # collisions replace entries; values stay right
    assert [d["value"] for d in many] == [float(i) / 7 for i in range(2000)]
    nan = enc(float("nan"))
    assert nan["type"] == "float" and math.isnan(nan["value"])


def test_deeply_nested_values_do_not_recurse_forever():
    v = []
    for _ in range(100):
        v = [v]
    ValueEncoder(lambda x: False).encode(v, None)


def test_large_tensors_take_the_fused_route_with_the_same_rules():
    big = torch.randn(300_000, generator=torch.Generator().manual_seed(5))
    for g, w in zip(tensor_stats(big), expected_stats(big)):
        assert math.isclose(g, w, rel_tol=1e-5)
    huge = torch.full((100_000,), 3e19)  # float32 squares overflow: recomputed in float64
    assert math.isclose(tensor_stats(huge)[3], 3e19 * math.sqrt(100_000), rel_tol=1e-6)
    nan = big.clone()
    nan[7] = float("nan")
    assert all(math.isnan(v) for v in tensor_stats(nan))
    assert tensor_stats(big.to(torch.bfloat16))[0] == float(big.to(torch.bfloat16).max())


def test_tensors_in_lists_what_tensor_leaves_yields():
    from msprobe_lite.core.values import tensor_leaves, tensors_in

    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)
    Pair = collections.namedtuple("Pair", "x y")
    for value in [a, (a, 1, None, b), [a, "s", b], {"x": a, "y": 2}, (a, [b, (c,)]), {"k": {"j": c}},
                  Pair(a, b), (), {}, 3, None, (torch.Size([2]), a)]:
        want = list(tensor_leaves(value, torch.is_tensor))
        got = tensors_in(value, torch.is_tensor)
        assert len(got) == len(want) and all(g is w for g, w in zip(got, want))


# -- the one-pass C kernel and the library routes it stands in front of ------------------------------------------
import pytest  # noqa: E402

import msprobe_lite.core.statistics as core_statistics  # noqa: E402
import msprobe_lite.pytorch.summary as torch_summary  # noqa: E402


@pytest.fixture(params=[pytest.param("one pass", marks=c_route), "library"])
def route(request, monkeypatch):
    """Every statistic below must hold on both routes: the C kernel, and numpy/torch where it is not built."""
    if request.param == "library":
        monkeypatch.setattr(core_statistics, "one_pass", None)
        monkeypatch.setattr(torch_summary, "one_pass", None)
        monkeypatch.setattr(torch_summary, "FastEncoder", None)  # it is built with the kernel, or not at all
    return request.param


@c_route
def test_the_one_pass_kernel_is_built_here():
    # the test set-up compiles it (pip install -e .): a silently missing kernel would only show as slowness
    assert core_statistics.one_pass is not None


# sizes around the kernel's 16 lanes and 4096-value blocks, and past the library's numpy/torch switch (65536)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 4095, 4096, 4097, 65537, 300_001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_statistics_on_both_routes(route, n, dtype):
    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n, generator=g) * 3 + 0.25).to(dtype)
    mx, mn, mean, norm = tensor_stats(t)
    want = expected_stats(t)  # float64, from the values the tensor holds in its own dtype
    assert (mx, mn) == (want[0], want[1])  # Max and Min are values of the tensor, exactly
    # float32 accumulation (the spec's rule for low precision) bounds how close Mean and Norm can be
    rel = 1e-12 if dtype is torch.float64 else 2e-5
    assert math.isclose(mean, want[2], rel_tol=rel, abs_tol=rel * want[3] / math.sqrt(n))
    assert math.isclose(norm, want[3], rel_tol=rel)


def test_layouts_views_and_autograd_on_both_routes(route):
    g = torch.Generator().manual_seed(9)
    base = torch.randn(64, 48, generator=g, requires_grad=True)
    for t in (base, base.t(), base[::3, 5:], base.detach().expand(3, 64, 48), base[7, 9], base.detach().neg()):
        got = tensor_stats(t)
        for g_, w in zip(got, expected_stats(t)):
            assert math.isclose(g_, w, rel_tol=1e-5, abs_tol=1e-6), (t.shape, got)
    assert tensor_stats(torch.tensor(-2.5)) == (-2.5, -2.5, -2.5, 2.5)


def test_non_finite_values_keep_the_spec_rules_on_both_routes(route):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.arange(40.0).to(dtype)
        t[33] = float("nan")
        assert all(math.isnan(v) for v in tensor_stats(t)), dtype
        t[33] = float("inf")
        mx, mn, mean, norm = tensor_stats(t)
        assert (mx, mn, mean, norm) == (math.inf, 0.0, math.inf, math.inf), dtype
        t[34] = -float("inf")
        mx, mn, mean, norm = tensor_stats(t)
        assert (mx, mn, norm) == (math.inf, -math.inf, math.inf) and math.isnan(mean), dtype


def test_float32_squares_beyond_float32_are_computed_wider_on_both_routes(route):
    huge = torch.full((5000,), 3e19)  # each square overflows float32
    mx, mn, mean, norm = tensor_stats(huge)
    assert (mx, mn) == (float(huge[0]), float(huge[0]))
    assert math.isclose(mean, float(huge[0]), rel_tol=1e-6)
    assert math.isclose(norm, float(huge[0]) * math.sqrt(5000), rel_tol=1e-6)


def test_numpy_arrays_and_mindspore_bfloat16_take_the_same_routes(route):
    import mindspore as ms  # registers numpy's `bfloat16` dtype, which its bf16 tensors' asnumpy() returns

    a = np.random.default_rng(4).standard_normal(5000).astype(np.float32)
    bf16 = ms.Tensor(a, ms.bfloat16).asnumpy()
    assert bf16.dtype.name == "bfloat16"
    for arr in (a, a.astype(np.float64), bf16, a.reshape(50, 100)[:, ::2]):
        wide = arr.astype(np.float64)
        got = core_statistics.numpy_stats(arr)
        want = (wide.max(), wide.min(), wide.mean(), math.sqrt((wide * wide).sum()))
        for g_, w in zip(got, want):
            assert math.isclose(g_, w, rel_tol=2e-5), (arr.dtype, got, want)


@c_route
def test_the_kernel_refuses_what_it_cannot_read():
    one_pass = core_statistics.one_pass
    with pytest.raises(ValueError, match="expected a non-empty contiguous buffer"):
        one_pass(np.zeros(0, np.float32), "float32")
    with pytest.raises(ValueError, match="kind 'int8'"):
        one_pass(np.zeros(4, np.float32), "int8")
    with pytest.raises(ValueError, match="float64"):
        one_pass(np.zeros(3, np.float32), "float64")  # 12 bytes are not whole float64 items
    with pytest.raises((BufferError, ValueError, TypeError)):
        one_pass(np.zeros((4, 4), np.float32)[:, ::2], "float32")  # strided: the caller makes it contiguous


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_strided_layouts_are_read_in_place_or_staged_with_the_same_statistics(route, dtype):
    g = torch.Generator().manual_seed(11)
    qkv = (torch.randn(4, 16, 3 * 40, generator=g) + 0.5).to(dtype)
    q, k, v = qkv.split(40, dim=-1)                              # rows of 40 values, 120 apart
    heads = v.view(4, 16, 5, 8).transpose(1, 2)                   # the same memory, heads first
    base = torch.randn(6, 7, 9, 5, generator=g).to(dtype)
    cases = [q, k, v, heads, k.transpose(-2, -1), base.permute(3, 1, 0, 2), base[:, 2:5],
             base[::2, :, 1:], base[..., 0], base.expand(3, 6, 7, 9, 5),
             base.reshape(-1).as_strided((10, 8), (4, 1))]       # overlapping rows: staged, every value
    for t in cases:
        got = tensor_stats(t)
        want = expected_stats(t)
        assert (got[0], got[1]) == (want[0], want[1]), (t.shape, t.stride())
        rel = 1e-12 if dtype is torch.float64 else 2e-5
        assert math.isclose(got[2], want[2], rel_tol=rel, abs_tol=rel), (t.shape, t.stride(), got, want)
        assert math.isclose(got[3], want[3], rel_tol=rel), (t.shape, t.stride(), got, want)
    qkv[1, 2, 3] = float("nan")                                   # inside q's rows
    assert all(math.isnan(x) for x in tensor_stats(qkv.split(40, dim=-1)[0]))
    assert not any(math.isnan(x) for x in tensor_stats(qkv.split(40, dim=-1)[1]))  # k's rows skip it


@c_route
def test_the_kernel_reads_rows_and_refuses_rows_that_do_not_fit():
    one_pass = core_statistics.one_pass
    values = np.arange(30, dtype=np.float32)                      # rows [0..3], [10..13], [20..23]
    rows = np.concatenate([values[0:4], values[10:14], values[20:24]]).astype(np.float64)
    mx, mn, mean, norm = one_pass(values[:24], "float32", 4, 10)
    assert (mx, mn, mean) == (23.0, 0.0, rows.mean()) and math.isclose(norm, math.sqrt((rows ** 2).sum()))
    for run, stride in ((4, 3), (4, 11), (-1, 10), (34, 10)):  # (34, 10): longer than the buffer
        with pytest.raises(ValueError, match="rows of"):
            one_pass(values[:24], "float32", run, stride)


def test_layouts_beyond_the_staging_buffer_are_copied_whole(monkeypatch):
    monkeypatch.setattr(torch_summary, "_STAGING_MAX", 16)
    t = torch.randn(8, 3, 5, generator=torch.Generator().manual_seed(2)).expand(2, 8, 3, 5)  # 240 > 16
    for x in (t, t.half()):
        got = tensor_stats(x)
        for g_, w in zip(got, expected_stats(x)):
            assert math.isclose(g_, w, rel_tol=1e-5, abs_tol=1e-6)


@c_route
def test_a_missing_kernel_is_said_once_and_the_numbers_stay(tmp_path, monkeypatch, capsys):
    import msprobe_lite.core.debugger as core_debugger
    from msprobe_lite.pytorch import PrecisionDebugger

    monkeypatch.setattr(core_statistics, "one_pass", None)
    monkeypatch.setattr(torch_summary, "one_pass", None)
    monkeypatch.setattr(core_debugger, "_c_routes_warned", False)
    for _ in range(2):
        PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    err = capsys.readouterr().err
    assert err.count("not built") == 1 and "one-pass statistics kernel (core/_fast_stats.c) of" in err
    monkeypatch.undo()                                          # the kernel back; only the adapter's route
    monkeypatch.setattr(torch_summary, "FastEncoder", None)   # missing: said too, and only it
    monkeypatch.setattr(core_debugger, "_c_routes_warned", False)
    PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    err = capsys.readouterr().err
    assert "value encoding (pytorch/_fast_encode.c) of msprobe_lite was not built" in err and "_fast_stats" not in err
    t = torch.randn(100, generator=torch.Generator().manual_seed(1))
    for g_, w in zip(tensor_stats(t), expected_stats(t)):
        assert math.isclose(g_, w, rel_tol=1e-6)


# -- found in review: staging shared by threads, inference mode, byte order, masks, lazy negation, extremes --

def test_staged_statistics_on_two_threads_at_once_are_each_their_own():
    import threading

    # float16 and gapped layouts are staged: both threads stage at once and each must see its own values
    ones = torch.ones(64, 64, 70, dtype=torch.float16)[:, :60, :60]
    twos = torch.full((64, 64, 70), 2.0, dtype=torch.float16)[:, :60, :60]
    wrong = []

    def work(t, value):
        for _ in range(40):
            got = tensor_stats(t)
            if got[:3] != (value, value, value):
                wrong.append((value, got))
    threads = [threading.Thread(target=work, args=(t, float(t[0, 0, 0]))) for t in (ones, twos)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not wrong


def test_a_staging_buffer_first_made_in_inference_mode_serves_training_later(monkeypatch):
    import threading

    monkeypatch.setattr(torch_summary, "_staging", threading.local())  # no buffer yet
    sliced = torch.ones(8, 8)[:, ::2].half()
    with torch.inference_mode():
        assert tensor_stats(torch.ones(8, 8, dtype=torch.float16))[0] == 1.0
    assert tensor_stats(torch.full((8, 8), 3.0, dtype=torch.float16))[:3] == (3.0, 3.0, 3.0)
    assert tensor_stats(sliced)[:3] == (1.0, 1.0, 1.0)


def test_numpy_byte_order_and_masks_on_both_routes(route):
    got = core_statistics.numpy_stats(np.arange(1, 6, dtype=">f4"))
    assert got[:3] == (5.0, 1.0, 3.0) and math.isclose(got[3], math.sqrt(55), rel_tol=1e-6)
    masked = np.ma.array([1.0, 2.0, 1e6], mask=[0, 0, 1], dtype=np.float32)
    got = core_statistics.numpy_stats(masked)
    assert got[:3] == (2.0, 1.0, 1.5) and math.isclose(got[3], math.sqrt(5), rel_tol=1e-6)


def test_a_lazily_negated_view_on_both_routes(route):
    t = torch._neg_view(torch.arange(6.0).view(2, 3)).t()   # non-contiguous, negative bit set
    got = tensor_stats(t)
    assert got[:3] == (0.0, -5.0, -2.5) and math.isclose(got[3], math.sqrt(55))


@pytest.mark.parametrize("value", [1e-20, 1e-30, 3e19, 1e-200, 1e200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_norms_of_tiny_and_huge_values_on_both_routes(route, value, dtype):
    for n in (1, 16, 70_000):  # 0-d-like, one lane row, past the library's numpy/torch switch
        t = torch.full((n,), value, dtype=torch.float64).to(dtype)
        v = float(t[0])
        if v == 0.0 or math.isinf(v):
            continue  # not representable in this dtype
        mx, mn, mean, norm = tensor_stats(t)
        assert (mx, mn) == (v, v)
        assert math.isclose(mean, v, rel_tol=2e-5 if dtype is not torch.float64 else 1e-12)  # float32 sums
        assert math.isclose(norm, abs(v) * math.sqrt(n), rel_tol=1e-6), (n, norm)
    zero_d = torch.tensor(value, dtype=torch.float64)
    assert tensor_stats(zero_d) == (value, value, value, value)


@c_route
def test_the_kernel_refuses_a_stride_without_a_run():
    with pytest.raises(ValueError, match="rows of 0 values"):
        core_statistics.one_pass(np.zeros(10, np.float32), "float32", 0, 5)


# -- the C encoder (pytorch/_fast_encode.c) and the Python walk it stands in front of ------------------------------
@pytest.fixture(params=ROUTE_PARAMS)
def encoder_route(request, monkeypatch):
    if request.param == "C":
        assert torch_summary.FastEncoder is not None  # the test set-up builds it (pip install -e .)
    else:
        monkeypatch.setattr(torch_summary, "FastEncoder", None)
    return request.param


def _odd_values():
    """Values of every kind the encoder meets, tensors in every layout, dtype and state among them."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 8, generator=g)
    with torch.inference_mode():
        inference = torch.randn(3, generator=g)
    nan = torch.arange(5.0)
    nan[2] = float("nan")
    Pair = collections.namedtuple("Pair", "a b")
    deep: list = [base]
    for _ in range(40):
        deep = [deep]
    return [
        base, base.t(), base[:, 2:5], base.neg(), base.to(torch.bfloat16), base.double(), base.half(),
        torch.tensor(2.5), torch.empty(0, 4), torch.arange(6), torch.tensor([True, False]), nan,
        torch.full((3,), float("inf")), base.requires_grad_(False).clone().requires_grad_(True),
        torch.nn.Parameter(torch.ones(2, 2)), inference, torch.empty(2, 3, device="meta"),
        torch.eye(3).to_sparse(), base.expand(2, 6, 8),
        base[1, 2], base[1:2, 3:4], base[2:3], base[:, 5:6], base.unsqueeze(1).transpose(0, 1),  # size-1 dims
        None, True, 3, -2.5, "text", (1, 2.0, "x", None), [base, (base, [base.t()])], {"k": base, 3: base[0]},
        Pair(base, 1), slice(1, None, 2), Ellipsis, torch.Size([2, 3]), torch.float16, torch.device("cpu"),
        {"nested": {"deeper": [base, {"x": None}]}}, deep, (), [], {},
    ] + _strided_views(g)


def _strided_views(g) -> list:
    """Layouts the C encoder reads in place as rows of memory, and ones it leaves to the Python route."""
    qkv = torch.randn(2, 6, 3 * 8, generator=g)
    q, k, v = qkv.split(8, dim=-1)
    base = torch.randn(3, 4, 5, 2, generator=g)
    views = [q, k, v, v.view(2, 6, 2, 4).transpose(1, 2), k.transpose(-2, -1), base.permute(3, 1, 0, 2),
             base[:, 1:3], base[::2, :, 1:], base[..., 0], base[:, :1, 2:], base.transpose(0, 1)[1:],
             base.reshape(-1).as_strided((5, 6), (4, 1)), base.reshape(-1).as_strided((4, 3), (1, 5)),
             base.reshape(-1)[::3], base.unsqueeze(2).expand(3, 4, 2, 5, 2)]
    return views + [t.to(dtype) for t in views[:6] for dtype in (torch.bfloat16, torch.float64)]


def _encoded_text(summarizer, value) -> bytes:
    from msprobe_lite.core.records import Record
    from msprobe_lite.core.writer import record_lines_python

    return record_lines_python([Record("r", {"v": summarizer.encode(value)})], {})


@c_route
def test_the_c_encoder_is_built_here():
    assert torch_summary.FastEncoder is not None


@c_route
def test_c_encoder_and_python_walk_encode_every_value_alike(monkeypatch):
    values = _odd_values()
    fast = TorchSummarizer(_Session())
    monkeypatch.setattr(torch_summary, "FastEncoder", None)
    slow = TorchSummarizer(_Session())
    assert fast.fast_encode is not None and slow.fast_encode is None
    for i, value in enumerate(values):
        assert _encoded_text(fast, value) == _encoded_text(slow, value), (i, type(value))
    call = (values[:5], {"a": values[5], "b": [values[6], None]})
    assert fast.encode_call(*call) == fast.encode_call(*call)  # cached: the same summaries
    got = [[s.to_json() for s in part] for part in (fast.encode_call(call[0], {})[0], slow.encode_call(call[0], {})[0])]
    assert got[0] == got[1]


@c_route
def test_c_encoder_reads_rows_of_memory_in_place(monkeypatch):
    """Transposed and sliced views (a transformer's q, k, v and heads) are summarised in C; layouts that are
    not rows of memory (gaps at two levels, a last dimension with gaps, overlapping or expanded) go to the
    Python route."""
    s = TorchSummarizer(_Session())
    to_python = []
    monkeypatch.setattr(s, "_summarize", lambda t: to_python.append(t) or TorchSummarizer._summarize(s, t))
    views = _strided_views(torch.Generator().manual_seed(3))
    for t in views:
        s.encode(t)
    in_python = {id(t) for t in to_python}
    assert [i for i, t in enumerate(views) if id(t) in in_python] == [7, 8, 11, 13, 14]


def _md5_session(tmp_path):
    (tmp_path / "md5.json").write_text(json.dumps({"task": "statistics", "statistics": {"summary_mode": "md5"}}))

    class Md5Session(_Session):
        config = load_config(str(tmp_path / "md5.json"))

    return Md5Session()


@c_route
def test_md5_of_contiguous_tensors_is_taken_in_c(tmp_path, monkeypatch):
    """summary_mode md5: the CRC-32 of a row-major contiguous tensor's bytes (up to 64 KiB) is taken in C;
    other layouts and larger tensors go to the Python route, which hashes a contiguous copy."""
    import zlib

    s = TorchSummarizer(_md5_session(tmp_path))
    to_python = []
    monkeypatch.setattr(s, "_summarize", lambda t: to_python.append(t) or TorchSummarizer._summarize(s, t))
    base = torch.randn(6, 10, generator=torch.Generator().manual_seed(5))
    dense = [base, base.double(), base.bfloat16(), (base * 100).long(), base > 0, torch.tensor(2.5), base[2:4],
             base[3], base.unsqueeze(0), torch.ones(16384)]
    views = [base.t(), base[:, 2:5], base[:, :1], base[::2], torch.ones(16385)]
    for t in dense + views:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        summary = s.encode(t)
        assert summary.md5 == f"{zlib.crc32(raw):08x}", t.shape
        assert summary.stats == TorchSummarizer._summarize(s, t).stats
    assert [id(t) for t in to_python] == [id(t) for t in views]


@c_route
def test_md5_in_c_hashes_a_copy_taken_before_zlib_ng_may_let_go_of_the_gil(tmp_path, monkeypatch):
    """Holding a tensor's storage would not keep another thread's `resize_()` from freeing its memory while
    zlib-ng runs without the GIL: the C route hashes a copy of the bytes made with the GIL held."""
    real = torch_summary.zlib_ng.crc32
    t = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    want = f"{real(t.clone().numpy().tobytes()):08x}"  # t.numpy() itself would make its storage unresizable

    def crc_while_another_thread_frees(data, value=0):
        t.untyped_storage().resize_(0)  # what FSDP does to a parameter it frees
        return real(data, value)

    monkeypatch.setattr(torch_summary.zlib_ng, "crc32", crc_while_another_thread_frees)
    summary = TorchSummarizer(_md5_session(tmp_path)).encode(t)
    assert summary.md5 == want and summary.stats[0] is not None


def test_methods_set_on_a_tensor_object_do_not_redirect_the_read(monkeypatch):
    """The kernel reads the memory shape, stride() and data_ptr() describe: it asks the tensor's class,
    so an attribute set on one tensor object (wrong, or hostile) cannot make it read elsewhere."""
    fast = TorchSummarizer(_Session())
    monkeypatch.setattr(torch_summary, "FastEncoder", None)
    slow = TorchSummarizer(_Session())
    t = torch.arange(6.0).reshape(2, 3).t()
    u = torch.arange(6.0)
    t.stride, t.data_ptr = (lambda: (1, 1 << 40)), (lambda: 8)
    u.numel, u.is_contiguous = (lambda: 1 << 40), (lambda: True)
    for v in (t, u):
        assert _encoded_text(fast, v) == _encoded_text(slow, v)
        assert fast.encode(v).stats == (5.0, 0.0, 2.5, math.sqrt(55.0))


@c_route
def test_c_statistics_are_one_object_read_as_their_tuple():
    """The C encoder keeps four finite statistics as one Stats object (four doubles; core/_fast_stats.c), not
    a tuple of four floats: it must read, compare, hash, pickle and print as that tuple does."""
    import pickle

    from msprobe_lite.core._fast_stats import Stats

    t = torch.tensor([[3.0, -4.0], [0.5, 2.5]])
    stats = TorchSummarizer(_Session()).encode(t).stats
    values = t.double().numpy()
    want = (values.max(), values.min(), values.mean(), math.sqrt((values ** 2).sum()))
    assert type(stats) is Stats and len(stats) == 4
    assert stats == want and want == stats and not stats != want and stats in (want,)
    high, low, mean, norm = stats
    assert (high, low, mean, norm) == want and all(type(v) is float for v in stats)
    assert stats[:2] == want[:2] and stats[-1] == norm and list(stats) == list(want)
    assert hash(stats) == hash(want) and repr(stats) == repr(want) and {want: 1}[stats] == 1
    assert pickle.loads(pickle.dumps(stats)) == want and type(pickle.loads(pickle.dumps(stats))) is tuple
    assert stats != (3.0, -4.0, 0.5, 5.0) and Stats(want) == stats and stats < (4.0,)
    with pytest.raises(IndexError):
        stats[4]
    with pytest.raises(ValueError, match="4 values"):
        Stats((1.0, 2.0))
    with pytest.raises(TypeError):
        Stats(("a", 1.0, 1.0, 1.0))
    # NaN or an infinity takes the exact route's rules: those statistics stay tuples
    assert type(TorchSummarizer(_Session()).encode(torch.tensor([1.0, float("inf")])).stats) is tuple


@c_route
def test_c_encoder_fills_summaries_itself_only_for_the_plain_summary_class():
    """The C encoder makes TensorSummary objects without running __init__ (core/_slots.h): only for a class
    that is exactly such a plain __slots__ class. A subclass, or a class with one more slot, is called."""
    from msprobe_lite.core.records import SHAPES, TensorSummary, canonical_shape
    from msprobe_lite.core.values import MAX_DEPTH

    made = []

    class Counted(TensorSummary):
        __slots__ = ()

        def __init__(self, *args):
            made.append(self)
            super().__init__(*args)

    class Wider:
        __slots__ = TensorSummary.__slots__ + ("device",)

        def __init__(self, *args):
            made.append(self)
            TensorSummary.__init__(self, *args)
            self.device = "cpu"

    def encoder(cls):
        return torch_summary.FastEncoder((torch.Tensor,), None, {}, None, cls, torch_summary._IN_PLACE_KINDS,
                                         torch.strided, canonical_shape, SHAPES, MAX_DEPTH)

    t = torch.arange(6.0).reshape(2, 3)
    plain = encoder(TensorSummary)(t)
    assert not made and type(plain) is TensorSummary
    assert plain.to_json() == TensorSummary("torch.Tensor", "torch.float32", (2, 3), (5.0, 0.0, 2.5, math.sqrt(55.0)),
                                            False).to_json()
    for cls in (Counted, Wider):
        made.clear()
        summary = encoder(cls)(t)
        assert made == [summary] and summary.stats == plain.stats and summary.shape is plain.shape

    class Other:  # a plain class of the same slots: a re-init that fails must not start making these
        __slots__ = TensorSummary.__slots__

    kept = encoder(TensorSummary)
    with pytest.raises(TypeError):
        kept.__init__((torch.Tensor,), None, {}, None, Other, {torch.float32: "not a pair"}, torch.strided,
                      canonical_shape, SHAPES, MAX_DEPTH)
    del Other
    gc.collect()
    assert type(kept(t)) is TensorSummary


@c_route
def test_c_encoder_follows_what_a_tensor_type_of_its_own_overrides():
    """The C encoder calls PyTorch's getters and methods directly, found once in the classes of its tensor
    types along their MRO: a read that one of them overrides (or that they do not share) goes through the
    attribute lookup, for that type and for the others; the reads they share still summarise alike."""
    from msprobe_lite.core.records import SHAPES, TensorSummary, canonical_shape
    from msprobe_lite.core.values import MAX_DEPTH

    class Flagged(torch.Tensor):  # a requires_grad of its own
        __torch_function__ = torch._C._disabled_torch_function_impl

        @property
        def requires_grad(self):
            return True

    class Inherits(torch.Tensor):  # overrides nothing: every read is torch.Tensor's
        __torch_function__ = torch._C._disabled_torch_function_impl

    class Sized(Inherits):  # stride() overridden further down the MRO, still the same values
        def stride(self, *args):
            return super().stride(*args)

    def encoder(*types):
        return torch_summary.FastEncoder(types, None, {}, None, TensorSummary, torch_summary._IN_PLACE_KINDS,
                                         torch.strided, canonical_shape, SHAPES, MAX_DEPTH)

    base = torch.arange(6.0).reshape(2, 3)
    want = encoder(torch.Tensor)(base).to_json()
    flagged = encoder(torch.Tensor, Flagged)
    assert flagged(base.as_subclass(Flagged)).requires_grad is True      # the override is followed
    assert flagged(base.clone()).to_json() == want                         # a plain tensor is as before
    for kind in (Inherits, Sized):
        assert encoder(torch.Tensor, kind)(base.as_subclass(kind)).to_json() == want
        assert encoder(kind)(base.clone().as_subclass(kind)).to_json() == want


def test_c_encoder_caches_by_identity_and_version(encoder_route):
    s = TorchSummarizer(_Session())
    t = torch.arange(8.0)
    first = s.encode(t)
    assert s.encode(t) is first and s.encode([t])[0] is first        # a tensor seen again: its summary
    t.add_(1)                                                          # changed in place: summarised anew
    second = s.encode(t)
    assert second is not first and second.stats[0] == 8.0
    view = t.view(2, 4)                                                # another tensor object, same values
    assert s.encode(view).stats == second.stats and list(s.encode(view).shape) == [2, 4]
    del t, view
    for _ in range(50):                                                # ids are reused: never a stale hit
        u = torch.full((8,), 3.0)
        assert s.encode(u).stats[0] == 3.0
    with torch.inference_mode():
        inf = torch.ones(3)
    a, b = s.encode(inf), s.encode(inf)                                # no version counter: never cached
    assert a is not b and a.stats == b.stats == (1.0, 1.0, 1.0, math.sqrt(3))


def test_a_cached_summary_follows_requires_grad(encoder_route):
    """`requires_grad_()` moves no version: the cached summary, which said requires_grad false, was given to
    every later call of the step. A summary is reused only while its flag still holds."""
    s = TorchSummarizer(_Session())
    t = torch.arange(4.0)
    first = s.encode(t)
    assert first.requires_grad is False and s.encode([t])[0] is first
    t.requires_grad_()
    second = s.encode(t)
    assert second.requires_grad is True and second.stats == first.stats
    assert s.encode(t) is second                                       # cached again, with the new flag
    t.requires_grad_(False)
    assert s.encode(t).requires_grad is False


def test_tainted_storages_are_summarised_anew_and_the_rest_stays_cached(encoder_route):
    """Once an alias of a storage is made (Summarizer.taint), a tensor in it is summarised at each sighting,
    views included; tensors elsewhere still come from the cache, and the next step caches all again."""
    s = TorchSummarizer(_Session())
    base, other = torch.arange(8.0), torch.arange(4.0)
    view = base[2:6]
    assert s.encode(view) is s.encode(view) and s.encode(other) is s.encode(other)
    s.taint((base, "not a tensor"))
    alias = base.numpy()                                               # written behind the version counter
    alias[:] = 5.0
    assert s.encode(view).stats[:2] == (5.0, 5.0) and s.encode(view) is not s.encode(view)
    assert s.encode(base).stats[0] == 5.0
    assert s.encode(other) is s.encode(other)                          # another storage: cached as before
    s.reset()                                                          # the step's end
    assert s._tainted == [] and s.encode(view) is s.encode(view)
    for _ in range(MAX_TAINTED + 1):                                   # too many storages: none cached
        s.taint((torch.ones(2),))
    assert s._tainted == [EVERYWHERE] and s.encode(other) is not s.encode(other)


def test_inference_mode_calls_are_recorded(tmp_path, encoder_route):
    """torch.inference_mode() tensors keep no version counter; reading it raised, and every call under
    inference mode was lost (an internal failure each)."""
    import json

    from msprobe_lite.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    for level in ("L1", "L0", "mix"):
        d = PrecisionDebugger(dump_path=str(tmp_path / level), task="statistics", level=level)
        d.start(model=model)
        with torch.inference_mode():
            y = model(x)
        d.stop()
        d.step()
        with open(tmp_path / level / "step0" / "rank" / "dump.json") as f:
            records = json.load(f)["data"]
        want = y.clone()
        out = next(r for n, r in records.items() if n.startswith(("Functional.relu.0", "Module.1.ReLU.forward")))
        assert out["output"][0]["Max"] == pytest.approx(float(want.max()))
        assert out["output"][0]["Norm"] == pytest.approx(float(want.norm()))


@pytest.mark.parametrize("kind, level, mode", [("transformer", "L1", "statistics"), ("transformer", "mix", "statistics"),
                                               ("mlp_inplace", "mix", "statistics"), ("cnn", "L1", "statistics"),
                                               ("transformer", "L1", "md5"), ("cnn", "mix", "md5")])
def test_c_encoder_and_python_walk_write_the_same_dumps(tmp_path, monkeypatch, kind, level, mode):
    """Whole dumps of real models, byte for byte: the C route is the Python route, faster. With md5, the C
    route hashes contiguous tensors over their memory; the transformer's attention views go the Python way."""
    from models import train

    from msprobe_lite.pytorch import PrecisionDebugger

    def dump(route):
        path, config = tmp_path / route, tmp_path / f"{route}.json"
        config.write_text(json.dumps({"task": "statistics", "level": level, "dump_path": str(path),
                                      "statistics": {"summary_mode": mode}}))
        train(kind, steps=2, debugger=PrecisionDebugger(str(config)))
        return dump_files(path)

    dumps = []
    for route in ROUTES_HERE:  # one call site: the stacks name the same line
        if route == "Python":
            monkeypatch.setattr(torch_summary, "FastEncoder", None)
        dumps.append(dump(route))
    assert_same_files(dumps[0], dumps[-1], at_least=6)


@pytest.mark.parametrize("mode", ["statistics", "md5"])
def test_a_tensor_whose_memory_another_thread_swaps_is_read_safely(tmp_path, encoder_route, mode):
    """A tensor object does not pin its memory: `t.data = ...` on another thread frees it. The C encoder keeps
    the GIL while its kernel reads (a crash before) and hands zlib-ng, which lets go of the GIL, a copy for
    the md5 mode's CRC; the Python route's numpy view pins the memory. The swap here holds the GIL all
    through, as `t.data = ...` does; a `t.set_()` already under way inside torch (which lets go of the GIL)
    when the read begins races the read as it races torch's own kernels (docs/reliability.md)."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "c.json").write_text(json.dumps({"task": "statistics", "statistics": {"summary_mode": mode}}))
    script = textwrap.dedent(f"""
        import sys, threading, warnings, zlib
        sys.path.insert(0, {repr(str(__import__("pathlib").Path(__file__).parent))})
        warnings.simplefilter("ignore")
        import torch
        import msprobe_lite.pytorch.summary as ts
        from msprobe_lite.config import load_config
        from test_statistics import _Session
        if {encoder_route == "Python"}:
            ts.FastEncoder = None
        class Session(_Session):
            config = load_config({repr(str(tmp_path / "c.json"))})
        s = ts.TorchSummarizer(Session())
        ones = f"{{zlib.crc32(torch.ones(1 << 24).numpy().tobytes()):08x}}"
        for attempt in range(3):
            t = torch.ones(1 << 24)            # 64 MB: returned to the system when freed
            empty = torch.empty(0)
            go = threading.Event()
            def other():
                go.wait()
                t.data = empty
            thread = threading.Thread(target=other)
            thread.start()
            go.set()
            out = s.encode(t)
            thread.join()
            assert out.stats in ((1.0, 1.0, 1.0, 4096.0), (None, None, None, None)), out.stats
            # swapped mid-way, the Python route may report its failure and write neither (training goes on)
            assert out.md5 in ((None,) if {mode == "statistics"} else
                               (ones,) if out.stats[0] == 1.0 else ("00000000", None)), (out.md5, out.stats)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def _both_routes(monkeypatch):
    """A summarizer with the C encoder, one without, and the tensors the first hands to its Python route."""
    fast = TorchSummarizer(_Session())
    monkeypatch.setattr(torch_summary, "FastEncoder", None)
    slow = TorchSummarizer(_Session())
    to_python = []
    monkeypatch.setattr(fast, "_summarize", lambda t: to_python.append(t) or TorchSummarizer._summarize(fast, t))
    return fast, slow, to_python


@c_route
def test_int64_and_bool_tensors_are_read_in_c_as_the_python_route_reads_them(monkeypatch):
    """Token ids, positions, targets and masks: read in C (the Python route's numpy costs 20 to 50 µs a
    tensor mid-step); int64 values whose float64 sums could round stay with the Python route's order."""
    fast, slow, to_python = _both_routes(monkeypatch)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 512, (4, 16), generator=g)
    in_c = [ids, ids.t(), ids[:, 3:9], torch.arange(16), torch.arange(-40, 3), torch.tensor([-7]),
            torch.randint(-(1 << 20), 1 << 20, (1000,), generator=g),
            torch.ones(16, 16, dtype=torch.bool).triu(1), torch.ones(3, dtype=torch.bool),
            torch.zeros(2, 5, dtype=torch.bool), torch.rand(6, 7, generator=g).gt(0.5).t()]
    in_python = [torch.tensor([2 ** 62, -5]), torch.tensor([-(2 ** 63), 2 ** 63 - 1]),
                 torch.full((1 << 12,), 1 << 20), torch.tensor([1, 2, 3], dtype=torch.int32)]
    for t in in_c + in_python:
        assert _encoded_text(fast, t) == _encoded_text(slow, t), t
    assert [id(t) for t in to_python] == [id(t) for t in in_python]
    for t in in_c:
        got = fast.encode(t).stats
        if t.dtype is torch.bool:
            assert got == (bool(t.any()), bool(t.all()), None, None)
        else:
            wide = [int(v) for v in t.reshape(-1).tolist()]
            assert got[:2] == (max(wide), min(wide)) and all(type(v) is int for v in got[:2])
            assert got[2] == sum(wide) / len(wide) and got[3] == math.sqrt(sum(v * v for v in wide))


@c_route
def test_infinities_without_nan_are_read_in_c_as_the_python_route_reads_them(monkeypatch):
    """Masked attention scores (-inf above the diagonal) are read in C: Max and Min as they are, Norm
    infinite, Mean the infinity's sign (NaN with both). NaN, a zero Max or Min (a review found that the sign
    of the zero kept depends on the reading order), finite values large enough that a sum's order could
    matter, and large tensors stay with the Python route."""
    fast, slow, to_python = _both_routes(monkeypatch)
    g = torch.Generator().manual_seed(11)
    mask = torch.ones(16, 16, dtype=torch.bool).triu(1)
    scores = torch.randn(4, 4, 16, 16, generator=g).masked_fill(mask, float("-inf"))
    both = torch.tensor([1.0, float("inf"), -2.0, float("-inf")])
    in_c = [scores, scores.transpose(-2, -1), scores.to(torch.bfloat16), scores.double(),
            torch.full((5,), float("-inf")), torch.tensor([3.0, float("inf")]), both]
    in_python = [torch.tensor([1.0, float("nan"), float("-inf")]),
                 torch.tensor([-0.0, 0.0, float("-inf")]),  # which zero is Max depends on the reading order
                 torch.tensor([float("inf"), 0.0, -0.0]).bfloat16(),
                 torch.tensor([3e38, 3e38, float("-inf")]),            # the finite part could overflow a sum
                 torch.tensor([1e308, 1e308, float("inf")], dtype=torch.float64),
                 # above 16,384 values the Python route's reductions are faster than a second C pass
                 torch.randn(300, 300, generator=g).masked_fill(torch.rand(300, 300, generator=g) > 0.7, float("-inf"))]
    for t in in_c + in_python:
        assert _encoded_text(fast, t) == _encoded_text(slow, t), t
    assert [id(t) for t in to_python] == [id(t) for t in in_python]
    finite = scores[~scores.isinf()]
    assert fast.encode(scores).stats == (float(finite.max()), float("-inf"), float("-inf"), float("inf"))
    high, low, mean, norm = fast.encode(both).stats
    assert (high, low, norm) == (float("inf"), float("-inf"), float("inf")) and math.isnan(mean)


# -- large tensors: read in pieces on the calling thread ------------------------------------------------------
def _large_cases():
    g = np.random.default_rng(21)
    flat = (g.standard_normal(1 << 20) * 3 + 0.5).astype(np.float32)
    bf16 = torch.from_numpy(flat).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    # lengths around the 16384-value pieces; rows shorter than a piece, and rows longer than one
    for n in (16383, 16384, 16385, 3 * 16384 + 7, 300_001, 1 << 20):
        yield flat[:n], "float32", 0, 0
        yield flat[:n].astype(np.float64), "float64", 0, 0
        yield bf16[:n], "bfloat16", 0, 0
    yield flat[: 2047 * 512 + 200], "float32", 200, 512  # 2048 rows of 200 every 512
    yield flat[: 2 * 40000 + 20000], "float32", 20000, 40000  # rows longer than a piece
    yield flat[: 999 * 768 + 256], "float32", 256, 768  # q of a qkv split: rows of 256 every 768


@c_route
def test_large_buffers_get_their_values_statistics():
    """Whole buffers and rows of a wider one, around the kernel's piece size: the statistics of the values
    read (computed here in float64), and the same numbers for the same values on every call."""
    from msprobe_lite.core._fast_stats import stats

    for values, kind, run, stride in _large_cases():
        got = stats(values, kind, run, stride)
        assert stats(values, kind, run, stride) == got
        wide = values.astype(np.float64) if kind != "bfloat16" else \
            torch.from_numpy(values.view(np.int16)).view(torch.bfloat16).double().numpy()
        if run:
            rows = (len(values) - run) // stride + 1
            wide = np.lib.stride_tricks.as_strided(wide, (rows, run), (stride * 8, 8)).ravel()
        want = (wide.max(), wide.min(), wide.mean(), math.sqrt((wide * wide).sum()))
        assert got[:2] == want[:2]
        for g, w in zip(got[2:], want[2:]):
            assert math.isclose(g, w, rel_tol=1e-12 if kind == "float64" else 2e-5), (kind, g, w)


@c_route
def test_the_debugger_reads_large_tensors_in_place(monkeypatch):
    """Contiguous tensors, slices read as rows (long and short), permuted tensors, bfloat16 and float64: the
    values' statistics; a contiguous tensor is read in C."""
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(8, 128, 768, generator=g)
    wide = torch.randn(3, 70_000, generator=g)
    cases = [qkv, qkv.split(256, -1)[1], qkv[:, :, :256].transpose(0, 1), wide[:, 5:60_005],
             qkv.to(torch.bfloat16), qkv.double()[:4]]
    for t in cases:
        fast, _, to_python = _both_routes(monkeypatch)
        got = fast.encode(t).stats
        assert to_python == [] or t is not qkv  # the usual case, a contiguous tensor: in C
        want = expected_stats(t)
        assert tuple(got[:2]) == tuple(want[:2])
        for g_, w in zip(got[2:], want[2:]):
            assert math.isclose(g_, w, rel_tol=1e-12 if t.dtype is torch.float64 else 2e-5)
