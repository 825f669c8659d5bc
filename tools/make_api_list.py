"""Regenerate msprobe_lite/pytorch/apis.yaml from what the installed PyTorch can intercept.

The list is data, not code: users edit the YAML to add or drop APIs. This script only gives a sound start:
every function PyTorch routes through `__torch_function__` (torch.overrides.get_overridable_functions) in
torch, torch.nn.functional and torch.Tensor, minus queries that compute nothing (shapes, flags, pointers),
Python conversions, and autograd/plumbing entry points. Run: .venv/bin/python tools/make_api_list.py
"""
from __future__ import annotations

import os
import sys
import re

import torch
import torch.nn.functional as F
from torch.overrides import get_overridable_functions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_list_yaml import write_api_list  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "msprobe_lite", "pytorch", "apis.yaml")

# Methods that only read metadata, convert to Python, or drive autograd: not numerical operations.
NOT_OPS = re.compile(r"^(_[^_].*|is_.*|dim|ndimension|size|stride|numel|nelement|element_size|data_ptr|"
                     r"const_data_ptr|mutable_data_ptr|storage.*|untyped_storage|get_device|dim_order|"
                     r"item|tolist|numpy|backward|register_.*|retain_grad|requires_grad_|__repr__|__format__|"
                     r"__len__|__bool__|__nonzero__|__int__|__long__|__float__|__complex__|__index__|"
                     r"__array__|__array_wrap__|__reduce_ex__|__deepcopy__|__setstate__|__dlpack.*|__contains__|"
                     r"__reversed__|__iter__|__hash__|dense_dim|sparse_dim|has_names|refine_names|rename_?|"
                     r"align_.*|names|type|type_as|new_tensor|share_memory_|pin_memory|record_stream|"
                     r"hash_tensor|module_load|set_|apply_|map_|map2_|ipu|cpu|cuda|xpu|mtia|to_sparse.*|"
                     r"coalesce|indices|values|crow_indices|col_indices|ccol_indices|row_indices|q_.*|"
                     r"int_repr|dequantize)$")
DISTRIBUTED = ["all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
               "reduce", "gather", "scatter", "send", "recv", "barrier", "batch_isend_irecv"]


def names(namespace, funcs) -> list:
    """The names under which `namespace` holds each function: its own name, else the attribute holding it
    (`Tensor.__pow__` is a function named `pow` that is not `Tensor.pow`; PyTorch hands it to the mode as is)."""
    held = {}
    for attr in dir(namespace):
        value = getattr(namespace, attr, None)
        if callable(value):
            held.setdefault(id(value), attr)
    out = set()
    for f in funcs:
        name = getattr(f, "__name__", None)
        if name and getattr(namespace, name, None) is not f:
            name = held.get(id(f))
        if name and not NOT_OPS.match(name):
            out.add(name)
    return sorted(out)


def with_in_place(namespace, found: list) -> list:
    """`found` plus the in-place form `name_` of each name that has one (F.relu_, torch.sigmoid_):
    get_overridable_functions() leaves most of them out, though they reach a torch-function mode."""
    extra = {f"{name}_" for name in found if callable(getattr(namespace, f"{name}_", None))}
    return sorted(set(found) | {name for name in extra if not NOT_OPS.match(name)})


def main() -> None:
    table = get_overridable_functions()
    sections = {
        "functional": with_in_place(F, names(F, table[F])),
        "torch": with_in_place(torch, names(torch, table[torch] + table.get(torch.functional, []))),
        "tensor": names(torch.Tensor, table[torch.Tensor]),
        "distributed": DISTRIBUTED,
    }
    write_api_list(OUT, [
        "APIs that level L1/mix records, by namespace (prefix in record names: functional -> Functional,",
        "torch -> Torch, tensor -> Tensor, distributed -> Distributed). Add or remove names freely; a name that",
        f"does not exist in the installed PyTorch is reported once. Generated for torch {torch.__version__}",
        "by tools/make_api_list.py. Operators are recorded under the method they run (x + y is Tensor.add).",
    ], sections)


if __name__ == "__main__":
    main()
