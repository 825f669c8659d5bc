"""Reading dumps and computing expected statistics independently (numpy, float64), for assertions."""
from __future__ import annotations

import json
import math
import os

import numpy as np


def load(dump_path, step=0, rank=None, name="dump.json"):
    folder = os.path.join(str(dump_path), f"step{step}", "rank" if rank is None else f"rank{rank}")
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


def data(dump_path, step=0, rank=None):
    return load(dump_path, step, rank)["data"]


def expected_stats(tensor):
    """(Max, Min, Mean, Norm) computed in float64 from the tensor's values, independently of the tool."""
    a = tensor.detach().cpu().double().numpy() if hasattr(tensor, "detach") else np.asarray(tensor, np.float64)
    return float(a.max()), float(a.min()), float(a.mean()), float(np.sqrt((a * a).sum()))


def assert_stats(entry, tensor, rel=1e-5):
    """A dumped tensor object matches `tensor`: dtype, shape and the four statistics."""
    assert entry["shape"] == list(tensor.shape), (entry, tensor.shape)
    assert entry["dtype"] == str(tensor.dtype)
    for key, want in zip(("Max", "Min", "Mean", "Norm"), expected_stats(tensor)):
        got = entry[key]
        assert math.isclose(got, want, rel_tol=rel, abs_tol=1e-6), (key, got, want)
