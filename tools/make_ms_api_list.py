"""Regenerate msprobe_lite/mindspore/apis.yaml from what the installed MindSpore exposes.

The list is data, not code: users edit the YAML to add or drop APIs. This script only gives a sound start:
the public functions of mindspore.ops, mindspore.mint and mindspore.mint.nn.functional, the methods and
operators of mindspore.Tensor, and the primitive classes of mindspore.ops (what nn layers call), minus what
computes nothing (shapes, dtypes, flags), Python conversions, hooks and plumbing.
Run: .venv/bin/python tools/make_ms_api_list.py
"""
from __future__ import annotations

import inspect
import os
import sys
import re

import mindspore as ms
import mindspore.mint.nn.functional as MF
from mindspore import mint, ops
from mindspore.ops.primitive import Primitive

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_list_yaml import write_api_list  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "msprobe_lite", "mindspore", "apis.yaml")

NOT_OPS = re.compile(
    r"^(_[^_].*|is_.*|isinstance|shape|rank|dtype|size|ndim|dim|numel|nelement|itemsize|nbytes|strides?|"
    r"item|tolist|asnumpy|numpy|asnumpy_of_slice_persistent_data|data_sync|init_data|set_dtype|set_const_arg|"
    r"register_hook|remove_hook|hooks|backward|has_init|slice_num_of_persistent_data|offload|"
    r"move_to|to|cpu|npu|contiguous|storage_offset|data_ptr|untyped_storage|assign_value|"
    r"__repr__|__str__|__format__|__len__|__bool__|__int__|__float__|__index__|__array__|__iter__|"
    r"__hash__|__contains__|__deepcopy__|__getstate__|__setstate__|__reduce.*|__sizeof__|__dir__|"
    r"__class__|__init__|__new__|__init_subclass__|__subclasshook__|__getattribute__|__setattr__|"
    r"__delattr__|__eq__|__ne__|__req__|__dlpack.*|__metaclass__|"
    r"Shape|DType|Rank|Size|TupleToArray|ScalarToTensor|Depend|identity|stop_gradient|StopGradient|"
    r"HookBackward|Cell|Primitive|PrimitiveWithInfer|PrimitiveWithCheck|constexpr|prim_attr_register|"
    r"typeof|get_grad|grad|value_and_grad|jvp|vjp|vmap|jacfwd|jacrev|custom_info_register|"
    r"Custom|CustomRegOp|DataType|TBERegOp|AiCPURegOp|AkgGpuRegOp|AkgAscendRegOp|CpuRegOp|op_info_register|"
    r"kernel|print_|Print|TensorDump|tensordump|InsertGradientOf|clear_auto_parallel_context)$")


def functions(namespace) -> list:
    """Public callables of a module that are functions or primitive instances, not classes or submodules."""
    out = []
    for name in dir(namespace):
        value = getattr(namespace, name, None)
        if NOT_OPS.match(name) or inspect.ismodule(value) or inspect.isclass(value) or not callable(value):
            continue
        out.append(name)
    return sorted(out)


def tensor_methods() -> list:
    out = []
    for name in dir(ms.Tensor):
        value = inspect.getattr_static(ms.Tensor, name, None)
        if NOT_OPS.match(name) or name.startswith("_") and not name.startswith("__"):
            continue
        if isinstance(value, (property, staticmethod, classmethod)) or not callable(value):
            continue
        if type(value).__name__ in ("wrapper_descriptor", "getset_descriptor", "member_descriptor"):
            continue
        out.append(name)
    return sorted(out)


def primitives() -> list:
    out = []
    for name in dir(ops):
        value = getattr(ops, name, None)
        if (inspect.isclass(value) and issubclass(value, Primitive) and value is not Primitive
                and not NOT_OPS.match(name) and name[:1].isupper()):
            out.append(name)
    return sorted(set(out))


def main() -> None:
    sections = {"ops": functions(ops), "tensor": tensor_methods(), "mint": functions(mint),
                "mint.nn.functional": functions(MF), "primitive": primitives()}
    write_api_list(OUT, [
        "APIs that level L1/mix records, by namespace (prefix in record names: ops -> Functional,",
        "tensor -> Tensor, mint -> Mint, mint.nn.functional -> MintFunctional, primitive -> Primitive).",
        "While collecting, each is wrapped in place and restored at stop(): add or remove names freely; a name",
        f"this MindSpore lacks is reported once. Generated for MindSpore {ms.__version__} by",
        "tools/make_ms_api_list.py. Primitives are classes of mindspore.ops (what nn layers call).",
    ], sections)


if __name__ == "__main__":
    main()
