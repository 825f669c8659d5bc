"""Replay of a PyTorch dump's API calls on CPU in float64, from the inputs a dump of task tensor saved.

Every floating-point tensor argument is loaded and widened to float64 (exactly: float16, bfloat16 and float32
values are all float64 values), every floating-point dtype argument becomes float64 and every device the CPU;
the same function (apis.yaml's mapping of record names to callables) then runs with the same arguments. A
backward record is replayed through its forward: the forward inputs that received gradients are made leaves,
the forward runs again in float64 and autograd takes the recorded gradients of its outputs back to them.

What is not replayed says why (`NotReplayable`): collectives, random ops (their generator state is not in the
dump; dropout is the exception, its mask is read off the recorded output), uninitialised memory, names this
PyTorch does not have, arguments the dump did not keep.
"""
from __future__ import annotations

import functools
import inspect
from collections import Counter

import numpy as np
import torch

from ..acc_check.arguments import Decoder, map_tensors, saved, tensor_objects
from ..acc_check.judge import NotReplayable, Output
from ..acc_check.standards import NUDGE
from ..acc_check.skips import never_replayed
from ..compare.pair import is_module, split_name
from ..core.naming import counterpart
from ..core.seed import ORIGINAL
from ..core.values import tensors_in
from .api_capture import load_api_list

DROPOUTS = frozenset(("dropout", "dropout1d", "dropout2d", "dropout3d"))


@functools.lru_cache(maxsize=1)
def _callables() -> dict:
    table, _ = load_api_list()
    # seed_all's dropout removal, where in place, is not what the call ran: the function it replaced is
    return {entry[:2]: func for func, entry in table.items() if not hasattr(func, ORIGINAL)}


def resolve(prefix: str, api: str):
    """The callable recorded as `{prefix}.{api}` in apis.yaml, or None. Only the list's: a dump names what runs,
    and must not make the replay call what no capture records (`torch.save`)."""
    return _callables().get((prefix, api))


def not_replayable_why(prefix: str, api: str):
    """Why calls of `{prefix}.{api}` are never replayed, or None."""
    why = never_replayed(prefix, api)
    if why is None and resolve(prefix, api) is None:
        why = f"{prefix}.{api} is not in apis.yaml's list of this PyTorch (a custom op?)"
    return why


class _Loader:
    """The dump's tensor files, as torch tensors in their own dtype."""

    def __init__(self, dump):
        self.dump = dump

    def tensor(self, obj: dict, label: str) -> torch.Tensor:
        value = saved(self.dump, obj, label)
        return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.to(torch.float64)
    if t.is_complex():
        return t.to(torch.complex128)
    return t


def _dtype(text: str):
    dtype = getattr(torch, text.rsplit(".", 1)[-1], None)
    if not isinstance(dtype, torch.dtype):
        return None
    return torch.float64 if dtype.is_floating_point else dtype


def _fingerprint(obj: dict) -> tuple:
    return tuple(str(obj.get(k)) for k in ("dtype", "shape", "Max", "Min", "Mean", "Norm"))


def _memory_format(obj: dict):
    """`{"type": "torch.memory_format", "format": "channels_last"}` back into torch.channels_last."""
    value = getattr(torch, str(obj.get("format")), None)
    if not isinstance(value, torch.memory_format):
        raise NotReplayable(f"unknown memory format {obj.get('format')!r}")
    return value


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _index_variants(api: str, args: list):
    """Arguments to try in turn: the dump writes tuples as lists, and `x[:, 0]` (a tuple index) and `x[[0, 2]]`
    (a list index) read back alike; a tuple first, it is the more common."""
    if api in ("__getitem__", "__setitem__") and len(args) > 1 and isinstance(args[1], list):
        yield [args[0], tuple(args[1]), *args[2:]]
    yield args


def _dropout_arguments(func, args: list, kwargs: dict) -> tuple:
    """(input, p, training) of a dropout call as recorded."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        return values["input"], values.get("p", 0.5), values.get("training", values.get("train", True))
    except (TypeError, ValueError):  # torch.dropout(input, p, train): a builtin without a signature
        merged = list(args) + [kwargs[k] for k in ("p", "train") if k in kwargs]
        return merged[0], merged[1], merged[2]


class TorchReplayer:
    """Replays the API records of one loaded PyTorch dump (compare/read.Dump) of task tensor."""

    def __init__(self, dump):
        self.dump = dump
        self.loader = _Loader(dump)
        self.decode = Decoder(lambda obj, label: _wide(self.loader.tensor(obj, label)), _dtype, torch.device("cpu"),
                              {"torch.Size": lambda v: torch.Size(v.get("value")),
                               "torch.memory_format": _memory_format}).value
        self._uses = None
        self._dropout_hint = None

    def uses(self, obj: dict) -> int:
        """How many input places of the dump's forward API records hold the tensor `obj` describes (same dtype,
        shape and statistics). A backward record holds the gradient that reached an input tensor, summed over
        every call that tensor feeds: it is one call's own only when the tensor feeds that call alone."""
        if self._uses is None:
            # calls after the step's last backward record (the optimizer's update, gradient clipping) take the
            # parameters too, but no gradient flows back from them
            names = list(self.dump.records)
            end = max((i for i, name in enumerate(names) if split_name(name)[1] == "backward"), default=len(names))
            self._uses = Counter(_fingerprint(o) for name in names[:end]
                                 if split_name(name)[1] == "forward" and not is_module(name) and
                                 isinstance(self.dump.records[name], dict)
                                 for _, o in tensor_objects([self.dump.records[name].get("input_args"),
                                                             self.dump.records[name].get("input_kwargs")], "input"))
        return self._uses.get(_fingerprint(obj), 0)

    def replay(self, name: str) -> list:
        """The outputs of record `name` beside their float64 replay ([judge.Output]); NotReplayable says why
        there are none."""
        base, direction, _ = split_name(name)
        prefix, _, api = base.partition(".")
        why = not_replayable_why(prefix, api)
        if why:
            raise NotReplayable(why)
        record = self.dump.records[name]
        if direction == "forward":
            return self._forward(name, prefix, api, record)
        return self._backward(name, prefix, api, record)

    # -- forward -----------------------------------------------------------------------------------------------
    def _arguments(self, record: dict) -> tuple:
        args = self.decode(record.get("input_args") or [], "input")
        kwargs = self.decode(record.get("input_kwargs") or {}, "kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise NotReplayable("input_args is not a list or input_kwargs not an object")
        if isinstance(kwargs.get("device"), str):
            kwargs["device"] = "cpu"
        return args, kwargs

    def _run(self, name: str, api: str, args: list, kwargs: dict, recorded: list):
        """The call's result in float64: the first argument variant whose tensors have the recorded shapes."""
        func = resolve(*split_name(name)[0].split(".", 1))
        if api in DROPOUTS:
            return self._dropout(func, args, kwargs, recorded)
        failure = None
        wanted = [tuple(o.get("shape") or ()) for _, o in recorded if o is not None]
        for variant in _index_variants(api, args):
            if _meta_shapes(func, api, variant, kwargs) not in (None, wanted):
                continue  # not the recorded call: never run (a dump's `repeat(100000, 100000)` would fill memory)
            try:
                result = func(*variant, **kwargs)
            except Exception as exc:  # noqa: BLE001 - any failure of the call is the reason it is skipped
                failure = exc
                continue
            if api == "__setitem__":
                result = variant[0]  # x[i] = y records x, changed
            if [tuple(t.shape) for t in tensors_in(result, _is_tensor)] == wanted:
                return result
        if failure is not None:
            raise NotReplayable(f"the float64 replay raised {type(failure).__name__}: "
                                f"{' '.join(str(failure).split())[:200]}")
        raise NotReplayable("the float64 replay's outputs are not the recorded ones in number or shape")

    def _dropout(self, func, args: list, kwargs: dict, recorded: list):
        x, p, training = _dropout_arguments(func, args, kwargs)
        if not training or not p or p >= 1:  # no randomness: the call itself
            return func(*args, **kwargs)
        if len(recorded) != 1 or recorded[0][1] is None:
            raise NotReplayable("a random op whose kept elements cannot be read off its output")
        kept = _wide(self.loader.tensor(recorded[0][1], recorded[0][0])) != 0
        if self._dropout_hint is not None and self._dropout_hint.shape == kept.shape:
            kept |= (x.detach() == 0) & (self._dropout_hint != 0)
        return x * kept / (1.0 - float(p))  # the recorded mask, the same scaling: differentiable for backward

    def _forward(self, name: str, prefix: str, api: str, record: dict) -> list:
        recorded = tensor_objects(record.get("output"), "output")
        if not recorded:
            raise NotReplayable("no tensor output to measure")
        args, kwargs = self._arguments(record)
        nudged = _nudged((args, kwargs))  # before the call: an in-place op writes its arguments
        with torch.no_grad():
            result = tensors_in(self._run(name, api, args, kwargs, recorded), _is_tensor)
            moved = tensors_in(self._run(name, api, *nudged, recorded), _is_tensor)
        return self._outputs(recorded, result, moved)

    def _outputs(self, recorded: list, replayed: list, nudged: list) -> list:
        """judge.Output of each recorded tensor beside its replay, with the replay's sensitivity: how far the
        replay moves when its inputs are nudged by one float32 rounding (see _nudged)."""
        out = []
        for (label, obj), ref, moved in zip(recorded, replayed, nudged):
            if obj is None:
                continue
            got = self.loader.tensor(obj, label)
            if tuple(got.shape) != tuple(ref.shape):
                raise NotReplayable(f"{label}: the replay's shape {list(ref.shape)} is not the recorded "
                                    f"{list(got.shape)}")
            is_float = got.is_floating_point() or got.is_complex()
            sensitivity = None
            if is_float and ref.is_floating_point() and moved is not None and moved.shape == ref.shape:
                sensitivity = (moved.detach().to(torch.float64) - ref.detach().to(torch.float64)).abs().numpy()
            out.append(Output(label, str(obj.get("dtype", got.dtype)), _array(got), _array(ref.detach()), is_float,
                              sensitivity))
        return out

    # -- backward ----------------------------------------------------------------------------------------------
    def _backward(self, name: str, prefix: str, api: str, record: dict) -> list:
        forward_name = counterpart(name)
        forward = self.dump.records.get(forward_name)
        if not isinstance(forward, dict):
            raise NotReplayable(f"its forward record {forward_name} is not in the dump")
        upstream = record.get("input") or []     # gradients of the forward's output tensors, in their order
        recorded = record.get("output") or []    # gradients of the forward's input tensors, in their order
        if not any(isinstance(g, dict) for g in recorded):
            raise NotReplayable("no input gradient to measure")
        if not any(isinstance(g, dict) for g in upstream):
            raise NotReplayable("its output gradients are not in the dump (none reached the call)")
        args, kwargs = self._arguments(forward)
        given = [o for _, o in tensor_objects([forward.get("input_args"), forward.get("input_kwargs")], "input")]
        if len(recorded) != len(given):
            raise NotReplayable(f"the backward record has {len(recorded)} input gradients for {len(given)} "
                                f"forward input tensors")
        labelled, shared = [], []
        for i, (g, obj) in enumerate(zip(recorded, given)):
            if isinstance(g, dict):
                (labelled if self.uses(obj) <= 1 else shared).append(i)
        if not labelled:
            raise NotReplayable(f"{', '.join(f'output.{i}' for i in shared)}: the gradient that reached a tensor "
                                f"feeding several recorded calls is their sum, not this call's own")
        grads = [_wide(self.loader.tensor(g, f"input.{j}")) if isinstance(g, dict) else None
                 for j, g in enumerate(upstream)]
        nudged = _nudged((args, kwargs, grads))
        if api in DROPOUTS:  # where the input is 0 the output does not show the mask; the gradient that passed does
            self._dropout_hint = self.loader.tensor(recorded[0], "output.0") if isinstance(recorded[0], dict) else None
        try:
            refs = self._gradients(forward_name, api, args, kwargs, grads, forward, labelled)
            moved = self._gradients(forward_name, api, *nudged, forward, labelled)
        finally:
            self._dropout_hint = None
        shared_note = "the gradient that reached a tensor feeding several recorded calls is their sum, not this " \
                      "call's own"
        return self._outputs([(f"output.{i}", recorded[i]) for i in labelled], refs, moved) + [
            Output(f"output.{i}", str(recorded[i].get("dtype")), None, None, False, left_out=shared_note)
            for i in shared]

    def _gradients(self, forward_name: str, api: str, args, kwargs, grads: list, forward: dict, wanted: list) -> list:
        """The float64 gradients of the forward's input tensors at indices `wanted`, given the gradients of its
        output tensors (`grads`, None where none reached)."""
        leaves = tensors_in(args, _is_tensor, 1) + tensors_in(kwargs, _is_tensor, 1)
        want = set(wanted)
        made = {id(t): t.detach().requires_grad_() for i, t in enumerate(leaves)
                if i in want and (t.is_floating_point() or t.is_complex())}
        # the call gets clones: an in-place op may not write a leaf that requires grad
        args, kwargs = _with_leaves(args, made), _with_leaves(kwargs, made)
        recorded_outputs = tensor_objects(forward.get("output"), "output")
        with torch.enable_grad():
            outs = tensors_in(self._run(forward_name, api, args, kwargs, recorded_outputs), _is_tensor)
        if len(outs) != len(grads):
            raise NotReplayable(f"the backward record has {len(grads)} output gradients for {len(outs)} forward "
                                f"output tensors")
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        inputs = [made[id(t)] for t in leaves if id(t) in made]
        if not pairs or not inputs:
            raise NotReplayable("no path from the recorded output gradients to the inputs in the replay")
        found = dict(zip((id(t) for t in leaves if id(t) in made),
                         torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)))
        return [found.get(id(leaves[i])) if found.get(id(leaves[i])) is not None
                else torch.zeros(leaves[i].shape, dtype=torch.float64) for i in wanted]


def _nudged(value, seed: int = 0):
    """A copy of `value` whose float64 tensors are each multiplied by 1 +- NUDGE, element by element with random
    signs (seeded: the same every run)."""
    gen = torch.Generator().manual_seed(seed)

    def nudge(t):
        if not t.is_floating_point():
            return t.clone()
        signs = torch.randint(0, 2, t.shape, generator=gen, dtype=torch.int8).to(t.dtype) * 2 - 1
        return t.detach() * (1 + NUDGE * signs)
    return map_tensors(value, _is_tensor, nudge)


def _meta_shapes(func, api: str, args: list, kwargs: dict):
    """The shapes of the call's tensor outputs, computed on the meta device (no memory, no values), or None
    where the op has no meta kernel or its shapes depend on values (nonzero, unique)."""
    meta_args, meta_kwargs = map_tensors((args, kwargs), _is_tensor, lambda t: t.to("meta"))
    if "device" in meta_kwargs:
        meta_kwargs["device"] = "meta"
    try:
        with torch.device("meta"):  # factory functions (zeros, full) too
            result = func(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel, a data-dependent shape: the call itself decides
        return None
    if api == "__setitem__":
        result = meta_args[0]
    return [tuple(t.shape) for t in tensors_in(result, _is_tensor)]


def _with_leaves(value, wanted: dict):
    """`value` with each tensor in `wanted` (by id) replaced by a clone of its leaf."""
    return map_tensors(value, _is_tensor, lambda t: wanted[id(t)].clone() if id(t) in wanted else t)


def _array(t: torch.Tensor) -> np.ndarray:
    """A numpy array of `t`'s values: float64 for floats (exact), its own dtype otherwise."""
    if t.is_floating_point():
        return t.to(torch.float64).numpy()
    if t.dtype == torch.bool or not t.is_complex():
        return t.numpy()
    return t.to(torch.complex128).numpy()
