"""Replay of a MindSpore dump's forward API calls on CPU in float64 (acc_check), from a dump of task tensor.

The callable of a record is apis.yaml's (`Functional.softmax` is `mindspore.ops.softmax`, `Mint.matmul`
`mindspore.mint.matmul`, `Tensor.add` the Tensor method, an operator its own method). Floating tensors (saved as
.npy; bf16 as float32, exactly) are loaded as float64 tensors and floating dtype arguments become float64. Kernels
that MindSpore's CPU backend has no float64 for raise: those calls are skipped with the error. Not replayed:
backward records (forward only here), primitives made with attributes (`Primitive.LayerNorm`: the dump does not
hold them; `Primitive.Dense` takes none and is replayed), random ops, and names this MindSpore does not have.
"""
from __future__ import annotations

import inspect

import numpy as np
import mindspore as ms

from ..acc_check.arguments import Decoder, map_tensors, saved, tensor_objects
from ..acc_check.judge import NotReplayable, Output
from ..acc_check.standards import NUDGE
from ..compare.pair import split_name
from ..core.values import tensors_in
from ..acc_check.skips import never_replayed
from .api_capture import load_api_list



def _callables() -> dict:
    """{(prefix, record api name): callable}; a name's own attribute first (`Tensor.add` is `add`, not `__radd__`).
    A primitive class is there when it takes no attributes (`Dense()`, `Add()`): then an instance is the one the
    call used; one with attributes (`LayerNorm(begin_norm_axis, ...)`) maps to None."""
    out = {}
    for owner, attribute, prefix, api, primitive in load_api_list():
        if primitive:
            out[(prefix, api)] = owner if _takes_nothing(owner) else None  # made when used: some warn when made
        elif (prefix, api) not in out or attribute == api:
            out[(prefix, api)] = getattr(owner, attribute)
    return out


def _takes_nothing(cls) -> bool:
    try:
        return list(inspect.signature(cls.__init__).parameters) == ["self"]
    except (TypeError, ValueError):
        return False


def _is_tensor(value) -> bool:
    return isinstance(value, ms.Tensor)


def _is_float(dtype_text: str) -> bool:
    return "float" in str(dtype_text).lower()


def _dtype(text: str):
    dtype = getattr(ms, text.rsplit(".", 1)[-1].lower(), None)
    if not isinstance(dtype, ms.dtype.Type):
        return None
    return ms.float64 if dtype in (ms.float16, ms.bfloat16, ms.float32, ms.float64) else dtype


class MindSporeReplayer:
    """Replays the forward API records of one loaded MindSpore dump (compare/read.Dump) of task tensor."""

    def __init__(self, dump):
        self.dump = dump
        self.callables = _callables()
        self.decode = Decoder(self._tensor, _dtype, None).value

    def _array(self, obj: dict, label: str) -> np.ndarray:
        value = np.asarray(saved(self.dump, obj, label))
        return value.astype(np.float64) if value.dtype.kind == "f" else np.array(value)

    def _tensor(self, obj: dict, label: str):
        return ms.Tensor(self._array(obj, label))

    def replay(self, name: str) -> list:
        base, direction, _ = split_name(name)
        prefix, _, api = base.partition(".")
        if direction != "forward":
            raise NotReplayable("backward records of MindSpore dumps are not replayed (forward only)")
        if prefix == "Primitive" and self.callables.get((prefix, api)) is None:
            raise NotReplayable("a primitive with attributes: the ones it was made with are not in the dump")
        why = never_replayed(prefix, api) or ("a random op: the dump does not hold its generator state"
                                              if "dropout" in api.lower() else None)
        if why:
            raise NotReplayable(why)
        func = self.callables.get((prefix, api))
        if func is None:
            raise NotReplayable(f"{prefix}.{api} is not an API of this MindSpore (a custom op?)")
        if prefix == "Primitive":
            func = func()
        record = self.dump.records[name]
        recorded = tensor_objects(record.get("output"), "output")
        if not recorded:
            raise NotReplayable("no tensor output to measure")
        args = self.decode(record.get("input_args") or [], "input")
        kwargs = self.decode(record.get("input_kwargs") or {}, "kwargs")
        results = []
        for values in ((args, kwargs), _nudged((args, kwargs))):
            try:
                # asnumpy() waits for the kernel: its failure is this call's, not the next one's
                results.append([t.asnumpy() for t in tensors_in(func(*values[0], **values[1]), _is_tensor)])
            except Exception as exc:  # noqa: BLE001 - a kernel without float64 on CPU, or arguments it refuses
                raise NotReplayable(f"the float64 replay raised {type(exc).__name__}: "
                                    f"{' '.join(str(exc).split())[:200]}") from None
        reference, moved = results
        if [tuple(t.shape) for t in reference] != [tuple(o.get("shape") or ()) for _, o in recorded]:
            raise NotReplayable("the float64 replay's outputs are not the recorded ones in number or shape")
        out = []
        for (label, obj), ref, nudged in zip(recorded, reference, moved):
            got = self._array(obj, label)
            is_float = _is_float(obj.get("dtype"))
            sensitivity = np.abs(nudged.astype(np.float64) - ref.astype(np.float64)) if is_float else None
            out.append(Output(label, str(obj.get("dtype")), got, ref.astype(np.float64) if is_float else ref,
                              is_float, sensitivity))
        return out


def _nudged(value, seed: int = 0):
    """A copy of `value` whose float64 tensors are each multiplied by 1 +- NUDGE (random signs, seeded)."""
    rng = np.random.default_rng(seed)

    def nudge(t):
        a = t.asnumpy()
        if a.dtype.kind != "f":
            return t
        return ms.Tensor(a * (1 + NUDGE * (rng.integers(0, 2, a.shape) * 2 - 1)))
    return map_tensors(value, _is_tensor, nudge)
