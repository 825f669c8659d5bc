"""NetDifferenceFinder: a PyTorch network and its MindSpore port, one call, to the first difference (the
migration guide's automatic route, taken to the call that departs).

`NetDifferenceFinder(pt_net, ms_net).compare(auto_inputs=(((4, 16), np.float32),))` copies the PyTorch weights
onto the MindSpore network (checkpoint.load_into: the rules of `ckpt convert`), seeds both frameworks as
seed_all does, feeds both the same inputs under the two PrecisionDebuggers into a dump each, and compares the
dumps with compare() (the MindSpore dump the target, the PyTorch one the golden). The result is compare's
answer for each input set (first divergence, first call only in one side, counts) beside the weight report
and the networks' outputs compared directly (allclose, cosine, largest errors).

The user's networks come back as they came but for the MindSpore weights (the PyTorch ones, as asked):
training flags, PyTorch gradients, BatchNorm statistics and the dropout functions are restored afterwards.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from typing import Mapping, Optional, Sequence

import mindspore as ms
import numpy as np
import torch
from mindspore import nn as ms_nn

from ..compare import compare as compare_dumps
from ..compare import console
from ..compare.frameworks import MAPPING, load_names
from ..compare.npy_dirs import compare_arrays
from ..compare.read import place
from ..core.safety import log
from ..pytorch import seed as pt_seed
from ..pytorch.debugger import PrecisionDebugger as PtDebugger
from . import seed as ms_seed
from .checkpoint import ConversionReport, convert_state_dict, load_into, load_name_map, prepare
from .checkpoint import as_numpy as torch_numpy
from .debugger import PrecisionDebugger as MsDebugger

__all__ = ["NetDifferenceError", "NetDifferenceFinder", "get_weight_map"]

LEVELS = ("L0", "L1", "mix")
# what compare names, in its order: a call that departs, a call of one side only, where inputs first differ
# (at L0, code between cells: named by the first cell that receives its difference)
FINDINGS = ("first_divergence", "first_only_in_target", "first_only_in_golden", "first_seen")
# PyTorch modules whose weight and bias MindSpore's own layers call gamma and beta (and running_* moving_*)
_NORMS = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


class NetDifferenceError(ValueError):
    """Bad input to NetDifferenceFinder: what was given and what was expected, in one line."""


# -- the weight map ---------------------------------------------------------------------------------------------
def _leaf_names() -> dict:
    """{PyTorch parameter leaf: MindSpore leaf} of the shared name mapping, for norm layers and embeddings."""
    to_torch = load_names(MAPPING)["parameters"]
    return {"norm": {t: m for m, t in to_torch.items() if m != "embedding_table"},
            "embedding": {t: m for m, t in to_torch.items() if m == "embedding_table"}}


def _guessed_ms_name(pt_net: torch.nn.Module, name: str, leaves: dict) -> str:
    path, _, leaf = name.rpartition(".")
    module = pt_net.get_submodule(path) if path else pt_net
    kind = "norm" if isinstance(module, _NORMS) else "embedding" if isinstance(module, torch.nn.Embedding) else None
    leaf = leaves[kind].get(leaf, leaf) if kind else leaf
    return f"{path}.{leaf}" if path else leaf


def weight_map(pt_net: torch.nn.Module, ms_net: Optional[ms_nn.Cell] = None) -> dict:
    """{PyTorch parameter or buffer name: MindSpore parameter name}. With `ms_net`, as the conversion pairs them
    (entries it finds no parameter for map to themselves); without, by PyTorch's module types: the weight and
    bias of a norm layer are MindSpore's gamma and beta, its running stats moving ones, an Embedding's weight
    its embedding_table (mint's layers keep PyTorch's names: edit those lines)."""
    state = pt_net.state_dict()
    if ms_net is not None:
        renamed, original, _ = prepare(state)
        _, report = convert_state_dict(renamed, {p.name: tuple(p.shape) for p in ms_net.get_parameters()},
                                       original=original)
        found = {torch_name: ms_name for ms_name, torch_name in report.converted}
        names = [name for name in state if name.rpartition(".")[2] != "num_batches_tracked"]
        unpaired = [name for name in names if name not in found]
        if unpaired:  # written as they are: the lines to edit
            log.warning("get_weight_map: %d PyTorch names found no MindSpore parameter of their shape and are "
                        "written unchanged (edit them): %s", len(unpaired),
                        ", ".join(unpaired[:5]) + (" ..." if len(unpaired) > 5 else ""))
        return {name: found.get(name, name) for name in names}
    leaves = _leaf_names()
    return {name: _guessed_ms_name(pt_net, name, leaves) for name in state
            if name.rpartition(".")[2] != "num_batches_tracked"}


def get_weight_map(pt_net: torch.nn.Module, path: str, ms_net: Optional[ms_nn.Cell] = None) -> dict:
    """Write weight_map(pt_net, ms_net) as JSON to `path` (a file the user edits where the port named a parameter
    otherwise, then passes as NetDifferenceFinder's name_map); returns the map."""
    mapping = weight_map(pt_net, ms_net)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(mapping, f, indent=1)
    return mapping


def _name_map(name_map) -> dict:
    """A name map given as a dict (`old: new` name parts, or whole names as get_weight_map writes them) or as a
    JSON/YAML file of one."""
    if name_map is None:
        return {}
    if isinstance(name_map, (str, os.PathLike)):
        if not os.path.isfile(name_map):
            raise NetDifferenceError(f"name_map {os.fspath(name_map)}: no such file (expected a JSON or YAML "
                                     f"mapping of PyTorch names to the port's, as get_weight_map writes)")
        return load_name_map(os.fspath(name_map))
    if isinstance(name_map, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in name_map.items()):
        return {k: v for k, v in name_map.items() if k != v}
    raise NetDifferenceError(f"name_map: expected a dict of PyTorch name parts to the port's ({{'attn': "
                             f"'attention'}}) or a file of one, got {type(name_map).__name__}")


def _compare_mapping(report: ConversionReport) -> dict:
    """compare's name fragments (the target's vocabulary, as its -dm mapping takes them) for the cells the port
    named otherwise, found from the parameters the conversion paired: MindSpore's `dense1.weight` from PyTorch's
    `fc1.weight` gives `Cell.dense1.` -> `Cell.fc1.`. A renamed leaf (gamma for weight) renames no cell."""
    out = {}
    for ms_name, torch_name in report.converted:
        ms_path, pt_path = ms_name.split(".")[:-1], torch_name.split(".")[:-1]
        while ms_path and pt_path and ms_path[-1] == pt_path[-1]:
            ms_path, pt_path = ms_path[:-1], pt_path[:-1]
        if ms_path and pt_path:
            out[f"Cell.{'.'.join(ms_path)}."] = f"Cell.{'.'.join(pt_path)}."
    return out


# -- inputs -----------------------------------------------------------------------------------------------------
def _as_numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return torch_numpy(value)
    if isinstance(value, ms.Tensor):
        return (value.astype(ms.float32) if value.dtype == ms.bfloat16 else value).asnumpy()
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return np.asarray(value)
    raise NetDifferenceError(f"inputs: expected numpy arrays or tensors (torch or MindSpore), got "
                             f"{type(value).__name__}")


def _generated(spec, rng: np.random.RandomState, where: str) -> np.ndarray:
    if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], (tuple, list))
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in spec[0])):
        raise NetDifferenceError(f"auto_inputs{where}: expected a (shape, dtype) pair such as ((4, 16), np.float32), "
                                 f"got {spec!r}")
    try:
        dtype = np.dtype(spec[1])
    except TypeError:
        raise NetDifferenceError(f"auto_inputs{where}: {spec[1]!r} is not a numpy dtype") from None
    shape = tuple(spec[0])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":  # token ids, class labels: small non-negative integers
        return rng.randint(0, 10, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.randint(0, 2, size=shape).astype(bool)
    raise NetDifferenceError(f"auto_inputs{where}: dtype {dtype} is neither float, integer nor bool")


def _input_sets(inputs, auto_inputs, seed: int) -> list:
    """Lists of numpy arrays, one list per input set: one set is a tuple, several a list of tuples."""
    if (inputs is None) == (auto_inputs is None):
        raise NetDifferenceError("compare(): give exactly one of inputs (arrays or tensors) and auto_inputs "
                                 "((shape, dtype) pairs)")
    given = inputs if inputs is not None else auto_inputs
    sets = list(given) if isinstance(given, list) else [given]
    if not sets:
        raise NetDifferenceError("compare(): an empty list of input sets")
    if inputs is not None:
        return [[_as_numpy(x) for x in (s if isinstance(s, (tuple, list)) else (s,))] for s in sets]
    rng = np.random.RandomState(seed)
    out = []
    for i, s in enumerate(sets):
        where = f"[{i}]" if isinstance(given, list) else ""
        if not isinstance(s, tuple) or not s:
            raise NetDifferenceError(f"auto_inputs{where}: expected a tuple of (shape, dtype) pairs such as "
                                     f"(((4, 16), np.float32),), got {s!r}")
        out.append([_generated(spec, rng, f"{where}[{j}]") for j, spec in enumerate(s)])
    return out


def _outputs(value, prefix: str = "output") -> list:
    """[(name, numpy array)] of a network's output: a tensor, or tuples, lists and dicts of them."""
    if isinstance(value, (torch.Tensor, ms.Tensor, np.ndarray)):
        return [(prefix, _as_numpy(value))]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in _outputs(v, f"{prefix}.{i}")]
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in _outputs(v, f"{prefix}.{k}")]
    return []


# -- keeping the user's networks as they were -------------------------------------------------------------------
@contextlib.contextmanager
def _dropout_removed(remove: bool):
    """seed_all's dropout removal for the time of the run; the framework functions and classes it replaces are
    put back afterwards (a user who called seed_all(rm_dropout=True) keeps what that call did)."""
    if not remove:
        yield
        return
    undo = [pt_seed.remove_dropout(), ms_seed.remove_dropout()]
    try:
        yield
    finally:
        for put_back in reversed(undo):
            put_back()


@contextlib.contextmanager
def _kept(pt_net: torch.nn.Module, ms_net: ms_nn.Cell, train: bool):
    """Both networks in training or eval mode for the run; afterwards as they were: their modes (MindSpore's
    phase and training flags of every cell), PyTorch's gradients (values, not references: a backward adds into
    the tensors in place) and buffers (BatchNorm's statistics), MindSpore's untrainable parameters, and the
    random generators that seeding both frameworks reset."""
    pt_flags = [(m, m.training) for m in pt_net.modules()]
    ms_flags = [(c, c.phase, dict(c.get_flags()), c.training) for _, c in ms_net.cells_and_names()]
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in pt_net.parameters()]
    buffers = [(b, b.detach().clone()) for b in pt_net.buffers()]
    moving = [(p, p.value().copy()) for p in ms_net.untrainable_params()]
    generators = _generators()
    for p in pt_net.parameters():
        p.grad = None  # the run's gradients alone, not added to the user's (the dump would record their sum)
    pt_net.train(train)
    ms_net.set_train(train)
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)
        for p, grad in grads:
            p.grad = grad
        for p, value in moving:
            p.set_data(value)
        for m, flag in pt_flags:
            m.training = flag
        for c, phase, flags, training in ms_flags:
            kept = c.get_flags()
            kept.clear()
            kept.update(flags)
            c.phase, c.training = phase, training
        _restore_generators(generators)


def _generators() -> tuple:
    """The states of the generators seed_all sets (MindSpore's global seed, once set, cannot be unset)."""
    return (random.getstate(), np.random.get_state(), torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None, ms.get_rng_state(),
            os.environ.get("PYTHONHASHSEED"))


def _restore_generators(states: tuple) -> None:
    python, numpy_state, torch_state, cuda_states, ms_state, hash_seed = states
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda_states is not None:
        torch.cuda.set_rng_state_all(cuda_states)
    ms.set_rng_state(ms_state)
    if hash_seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = hash_seed


@contextlib.contextmanager
def _removed_on_failure(debugger):
    """A network that raises leaves its debugger between start() and its last step, hooks installed and the
    framework's functions wrapped: they are taken off before the error reaches the user."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            debugger.stop()
        debugger.release()
        raise


# -- running ----------------------------------------------------------------------------------------------------
def _config(folder: str, side: str, task: str, level: str, steps: int) -> str:
    path = os.path.join(folder, f"config_{side}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"task": task, "level": level, "dump_path": os.path.join(folder, side),
                   "step": [f"0-{steps - 1}"] if steps > 1 else [0]}, f)
    return path


def _square_mean(out):
    first = out[0] if isinstance(out, (tuple, list)) else out
    return (first.float() ** 2).mean() if isinstance(first, torch.Tensor) else (first.astype(ms.float32) ** 2).mean()


class NetDifferenceFinder:
    """A PyTorch network and its MindSpore port compared call by call on the same inputs and weights.

    `name_map`: PyTorch name parts -> the port's (`{"fc1": "dense1"}`), or whole names as get_weight_map writes
    them, or a JSON/YAML file of either. `level`: L0 (cells and modules), L1 (APIs) or mix (both, the default).
    `train=True` runs the backward of a scalar loss too: `loss_fn=(pytorch_loss, mindspore_loss)`, each taking
    its network's output (default: the mean of the squared first output). `dump_path` keeps the two dumps and
    the compare's tables there (else a temporary folder, removed). `seed`: for seed_all on both sides and the
    generated inputs. `rm_dropout`: dropout removed during the run (the default; the result says so).
    `task`: the dumps' task, statistics (default) or tensor.
    """

    def __init__(self, pt_net: torch.nn.Module, ms_net: ms_nn.Cell, *, name_map=None, level: str = "mix",
                 train: bool = False, loss_fn: Optional[Sequence] = None, dump_path: Optional[str] = None,
                 seed: int = 1234, rm_dropout: bool = True, task: str = "statistics"):
        if not isinstance(pt_net, torch.nn.Module):
            raise NetDifferenceError(f"pt_net: expected a torch.nn.Module, got {type(pt_net).__name__}")
        if not isinstance(ms_net, ms_nn.Cell):
            raise NetDifferenceError(f"ms_net: expected a mindspore.nn.Cell, got {type(ms_net).__name__}")
        if level not in LEVELS:
            raise NetDifferenceError(f"level: expected one of {', '.join(LEVELS)}, got {level!r}")
        if task not in ("statistics", "tensor"):
            raise NetDifferenceError(f"task: expected 'statistics' or 'tensor', got {task!r}")
        if loss_fn is not None and not (isinstance(loss_fn, (tuple, list)) and len(loss_fn) == 2
                                        and all(callable(f) for f in loss_fn)):
            raise NetDifferenceError("loss_fn: expected a pair (pytorch_loss, mindspore_loss) of callables taking "
                                     "each network's output")
        self.pt_net, self.ms_net = pt_net, ms_net
        self.name_map = _name_map(name_map)
        self.level, self.train, self.task = level, bool(train), task
        self.loss_fn = tuple(loss_fn) if loss_fn is not None else (_square_mean, _square_mean)
        self.dump_path, self.seed, self.rm_dropout = dump_path, seed, bool(rm_dropout)

    def convert_weights(self) -> ConversionReport:
        """The PyTorch network's parameters and buffers onto the MindSpore network (checkpoint.load_into);
        raises NetDifferenceError when a MindSpore parameter finds no source of its shape."""
        report = load_into(self.ms_net, self.pt_net.state_dict(), name_map=self.name_map)
        if not report.complete:
            left = [f"{m} (no PyTorch source)" for m in report.missing]
            left += [f"{m} {s} (PyTorch {t} is {ts})" for m, s, t, ts in report.mismatched]
            raise NetDifferenceError(
                f"weights: {len(left)} MindSpore parameters without a PyTorch source of their shape: "
                f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}; name the port's renamed attributes with "
                f"name_map={{'pytorch_part': 'port_part'}} (get_weight_map writes a map to edit)")
        return report

    def compare(self, inputs=None, auto_inputs=None, rtol: float = 1e-4, atol: float = 1e-4) -> dict:
        """Run both networks on each input set and compare them; returns the result (see docs/mindspore.md,
        "Porting a network") and says a short answer through the `msprobe_lite.answer` logger."""
        for name, value in (("rtol", rtol), ("atol", atol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise NetDifferenceError(f"{name}: expected a finite number of at least 0, got {value!r}")
        sets = _input_sets(inputs, auto_inputs, self.seed)
        report = self.convert_weights()
        folder = self.dump_path or tempfile.mkdtemp(prefix="msprobe_lite_net_")
        os.makedirs(folder, exist_ok=True)
        try:
            with _dropout_removed(self.rm_dropout), _kept(self.pt_net, self.ms_net, self.train):
                pt_out = self._run_pytorch(folder, sets)
                ms_out = self._run_mindspore(folder, sets)
            summary = self._compare(folder, report)
        finally:
            if not self.dump_path:
                shutil.rmtree(folder, ignore_errors=True)
        result = self._result(summary, sets, pt_out, ms_out, report, rtol, atol)
        result["answer"] = answer(result)
        console.say(result["answer"])
        return result

    def _run_pytorch(self, folder: str, sets: list) -> list:
        pt_seed.seed_all(self.seed)
        debugger = PtDebugger(_config(folder, "pytorch", self.task, self.level, len(sets)))
        device = next((p.device for p in self.pt_net.parameters()), torch.device("cpu"))
        outputs = []
        with _removed_on_failure(debugger):
            for arrays in sets:
                debugger.start(self.pt_net)
                tensors = [torch.from_numpy(a.copy()).to(device) for a in arrays]
                if self.train:
                    out = self.pt_net(*tensors)
                    self.loss_fn[0](out).backward()
                else:
                    with torch.no_grad():
                        out = self.pt_net(*tensors)
                debugger.stop()
                debugger.step()
                outputs.append(_outputs(out))
        return outputs

    def _run_mindspore(self, folder: str, sets: list) -> list:
        ms_seed.seed_all(self.seed, rm_dropout=False)  # dropout: _dropout_removed's, undone afterwards
        debugger = MsDebugger(_config(folder, "mindspore", self.task, self.level, len(sets)))
        net, loss = self.ms_net, self.loss_fn[1]

        def forward(*xs):
            out = net(*xs)
            return loss(out), out
        outputs = []
        with _removed_on_failure(debugger):
            for arrays in sets:
                debugger.start(net)
                tensors = [ms.Tensor(a.copy()) for a in arrays]
                if self.train:
                    (_, out), _ = ms.value_and_grad(forward, None, net.trainable_params(), has_aux=True)(*tensors)
                else:
                    out = net(*tensors)
                debugger.stop()
                debugger.step()
                outputs.append(_outputs(out))
        return outputs

    def _compare(self, folder: str, report: ConversionReport):
        mapping = _compare_mapping(report)
        mapping_file = None
        if mapping:
            mapping_file = os.path.join(folder, "compare_mapping.yaml")
            with open(mapping_file, "w", encoding="utf-8") as f:
                json.dump(mapping, f)  # JSON is YAML
        return compare_dumps(os.path.join(folder, "mindspore"), os.path.join(folder, "pytorch"),
                             os.path.join(folder, "compare"), mapping=mapping_file, quiet=True,
                             html=bool(self.dump_path), workers=1)

    def _result(self, summary, sets, pt_out, ms_out, report, rtol, atol) -> dict:
        per_set, outputs = [], []
        for i, (pt, mso) in enumerate(zip(pt_out, ms_out)):
            rows = _output_rows(pt, mso, rtol, atol)
            for row in rows:
                outputs.append(dict(row, input_set=i))
            pair = next((p for p in summary.pairs if p["step"] == i), None)
            keys = ("counts", "first_divergence", "first_only_in_target", "first_only_in_golden", "first_seen",
                    "first_error", "first_warning", "note")
            found = {k: (pair or {}).get(k) for k in keys}
            per_set.append(dict(found, input_set=i, outputs=rows, allclose=all(r["allclose"] for r in rows),
                                compared=pair is not None, verdict=_verdict(pair, i)))
        result = {"agree": None, "allclose": all(s["allclose"] for s in per_set)}
        for key in FINDINGS:
            first = next(((s["input_set"], s[key]) for s in per_set if s[key]), None)
            result[key] = dict(first[1], input_set=first[0]) if first else None
        counts = {}
        for s in per_set:
            for k, v in (s["counts"] or {}).items():
                counts[k] = counts.get(k, 0) + v
        result["agree"] = result["allclose"] and all(s["compared"] for s in per_set) and not any(
            result[k] for k in FINDINGS)
        result.update(counts=counts, outputs=outputs, input_sets=per_set, rtol=rtol, atol=atol,
                      weights={"converted": len(report.converted), "missing": list(report.missing),
                               "mismatched": [list(m) for m in report.mismatched], "unused": list(report.unused),
                               "notes": list(report.notes)},
                      level=self.level, mode="train" if self.train else "eval", dropout_removed=self.rm_dropout,
                      seed=self.seed, inputs=[[(list(a.shape), str(a.dtype)) for a in arrays] for arrays in sets],
                      dump_path=self.dump_path,
                      compare_output=os.path.join(self.dump_path, "compare") if self.dump_path else None)
        return result


def _verdict(pair, index: int) -> str | None:
    """compare's verdict block of an input set, headed by the set (its step in the dumps)."""
    if pair is None:
        return None
    text = console.block(pair)
    head = f"[{place(pair['step'], pair['rank'])}] "
    return f"[input set {index}] " + text[len(head):] if text.startswith(head) else text


def _output_rows(pt: list, mso: list, rtol: float, atol: float) -> list:
    """The networks' outputs compared one by one (the MindSpore output the target), in PyTorch's order."""
    mine = dict(mso)
    rows = []
    for name, golden in pt:
        if name not in mine:
            rows.append({"name": name, "result": "only in PyTorch", "allclose": False, "shape": list(golden.shape)})
            continue
        rows.append(compare_arrays(name, mine.pop(name), golden, rtol, atol).to_json())
    rows += [{"name": n, "result": "only in MindSpore", "allclose": False, "shape": list(v.shape)}
             for n, v in mine.items()]
    return rows


def answer(result: dict) -> str:
    """The short answer in compare's style: what ran, the weights, the outputs, then compare's verdict."""
    sets = len(result["input_sets"])
    head = (f"[net difference] MindSpore port (target) against PyTorch (golden): {sets} input "
            f"set{'s' if sets != 1 else ''}, "
            f"{result['mode']} mode, level {result['level']}, seed {result['seed']}"
            f"{', dropout removed' if result['dropout_removed'] else ''}")
    w = result["weights"]
    weights = f"weights: {w['converted']} parameters from the PyTorch network"
    if w["unused"]:
        n = len(w["unused"])
        weights += f"; {n} PyTorch {'entry' if n == 1 else 'entries'} unused: {', '.join(w['unused'][:5])}"
    lines = [console.wrapped(head), console.wrapped(weights, first=console.INDENT, indent=console.INDENT * 2)]
    for s in result["input_sets"]:
        for row in s["outputs"]:
            if row.get("cosine") is None:
                text = f"{row['name']}: {row['result']}"
            else:
                text = (f"{row['name']} {tuple(row['shape'])}: {'allclose' if row['allclose'] else 'not allclose'} "
                        f"(rtol {result['rtol']:g}, atol {result['atol']:g}; {row['close_ratio']:.2%} within), "
                        f"cosine {row['cosine']:.6f}, max abs error {row['max_abs']:.3g}, "
                        f"max relative error {row['max_rel']:.3g}")
            prefix = f"input set {s['input_set']}, " if sets > 1 else ""
            lines.append(console.wrapped(prefix + text, first=console.INDENT, indent=console.INDENT * 2))
        if s["verdict"]:
            lines.append(s["verdict"])
        else:
            lines.append(console.wrapped(f"input set {s['input_set']}: the dumps hold no step {s['input_set']} "
                                         f"of both sides: not compared", first=console.INDENT))
    verdict = "the port agrees with PyTorch" if result["agree"] else "the port departs from PyTorch"
    lines.append(console.wrapped(verdict + (f"; dumps and tables in {result['dump_path']}" if result["dump_path"]
                                            else ""), first=console.INDENT, indent=console.INDENT * 2))
    return "\n".join(lines)
