"""PyTorch weights -> a MindSpore checkpoint for the same architecture (the migration step that makes a
MindSpore run comparable with its PyTorch original: same weights, same inputs, then compare the dumps).

The state_dict is found where training scripts put it and freed of DDP's `module.` (core/state_dict.py); a
user's name map renames attributes the port named otherwise. Each MindSpore parameter then looks for its
PyTorch source under the same path with the parameter's name translated by the shared name mapping (`gamma` ->
`weight`, `moving_mean` -> `running_mean`, ...). Shapes must agree exactly (Dense, Conv and BatchNorm keep
PyTorch's layouts). The report lists MindSpore parameters with no source, PyTorch entries left unused and shape
mismatches, and a checkpoint is written only when every parameter has its source: a half-converted checkpoint
would leave a network that loads it with its initial weights where the source was not found.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import mindspore as ms
import numpy as np

from ..compare.frameworks import MAPPING, TORCH_BOOKKEEPING, load_names
from ..core.state_dict import (StateDictError, find_state_dict, load_name_map, load_torch_checkpoint, rename,
                               strip_wrapper_prefixes)

__all__ = ["ConversionReport", "StateDictError", "convert_checkpoint", "convert_state_dict", "load_into",
           "load_name_map", "load_torch_state_dict"]


@dataclass
class ConversionReport:
    converted: list = field(default_factory=list)       # (mindspore name, pytorch name)
    missing: list = field(default_factory=list)         # mindspore names with no pytorch source
    unused: list = field(default_factory=list)          # pytorch names no mindspore parameter took
    mismatched: list = field(default_factory=list)      # (mindspore name, its shape, pytorch name, shape)
    notes: list = field(default_factory=list)           # what was done to find the weights and their names

    @property
    def complete(self) -> bool:
        """Every MindSpore parameter got its source (and there was at least one)."""
        return bool(self.converted) and not (self.missing or self.mismatched)

    def lines(self) -> list:
        out = list(self.notes) + [f"converted {len(self.converted)} parameters"]
        out += [f"no PyTorch source for {n}" for n in self.missing]
        out += [f"shape mismatch: {m} {ms_shape} vs {t} {t_shape}" for m, ms_shape, t, t_shape in self.mismatched]
        out += [f"unused PyTorch entry {n}" for n in self.unused]
        return out


def as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (bf16 has no numpy dtype: go through float32)
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def _is_tensor(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")  # torch tensors, numpy arrays (load_into)


def load_torch_state_dict(path: str, trust: bool = False):
    """What a .pt/.pth file holds (a state_dict or a training checkpoint holding one: `prepare` finds it),
    loaded without unpickling arbitrary objects unless `trust` (core/state_dict.py: load_torch_checkpoint)."""
    return load_torch_checkpoint(path, trust)


def prepare(loaded, name_map: Optional[Mapping[str, str]] = None, source: str = "the state_dict") -> tuple:
    """({name as the port calls it: tensor}, {that name: the name in the file once the wrapper prefixes the notes
    name are removed}, notes) from a loaded checkpoint."""
    state, walked = find_state_dict(loaded, _is_tensor, source)
    notes = [f"state_dict read from {''.join(f'[{k!r}]' for k in walked)}"] if walked else []
    state, removed = strip_wrapper_prefixes(state)
    notes += [f"prefix {p!r} removed from every name (a wrapped model: DDP, DataParallel, torch.compile)"
              for p in removed]
    renamed, original = {}, {}
    for name, value in state.items():
        new = rename(name, name_map or {})
        if new in renamed:
            raise StateDictError(f"{source}: the name map gives {name!r} the name {new!r}, "
                                 f"which {original[new]!r} has already")
        renamed[new], original[new] = value, name  # as the notes say: after the prefix removal
    return renamed, original, notes


def torch_name_of(ms_name: str, params: dict) -> str:
    """The PyTorch state_dict key of a MindSpore parameter name: same path, translated last component."""
    path, _, leaf = ms_name.rpartition(".")
    leaf = params.get(leaf, leaf)
    return f"{path}.{leaf}" if path else leaf


def convert_state_dict(state_dict: dict, targets: dict, names: str = MAPPING,
                       original: Optional[Mapping[str, str]] = None) -> tuple:
    """({mindspore name: numpy array}, ConversionReport) for `targets` = {mindspore name: shape}; `original`
    gives the report the file's name of each state_dict key (as `prepare` returns it)."""
    params = load_names(names)["parameters"]
    report, converted = ConversionReport(), {}
    shown = original or {}
    taken = set()
    for ms_name, shape in targets.items():
        source = torch_name_of(ms_name, params)
        if source not in state_dict:
            source = ms_name if ms_name in state_dict else None
        if source is None:
            report.missing.append(ms_name)
            continue
        value = as_numpy(state_dict[source])
        taken.add(source)
        if tuple(value.shape) != tuple(shape):
            report.mismatched.append((ms_name, tuple(shape), shown.get(source, source), tuple(value.shape)))
            continue
        converted[ms_name] = value
        report.converted.append((ms_name, shown.get(source, source)))
    report.unused = [shown.get(k, k) for k in state_dict
                     if k not in taken and k.rpartition(".")[2] not in TORCH_BOOKKEEPING]
    return converted, report


def _convert(loaded, targets: dict, names: str, name_map, source: str) -> tuple:
    state, original, notes = prepare(loaded, name_map, source)
    converted, report = convert_state_dict(state, targets, names, original)
    report.notes = notes
    return converted, report


def load_into(net: ms.nn.Cell, state_dict, names: str = MAPPING,
              name_map: Optional[Mapping[str, str]] = None) -> ConversionReport:
    """Copy PyTorch weights (a state_dict, or a checkpoint holding one) into a MindSpore network in place
    (dtype of each MindSpore parameter kept); `name_map` renames parts of PyTorch's names (`old: new`)."""
    targets = {p.name: tuple(p.shape) for p in net.get_parameters()}
    converted, report = _convert(state_dict, targets, names, name_map, "the state_dict")
    for p in net.get_parameters():
        if p.name in converted:
            p.set_data(ms.Tensor(converted[p.name]).astype(p.dtype))
    return report


def convert_checkpoint(torch_path: str, ckpt_path: str, template, names: str = MAPPING,
                       name_map: Optional[Mapping[str, str]] = None, trust: bool = False) -> ConversionReport:
    """A .pt/.pth checkpoint -> a MindSpore .ckpt named and shaped like `template`: a network (nn.Cell) or a
    MindSpore checkpoint of the target architecture (what `mindspore.save_checkpoint(net, ...)` wrote).
    `ckpt_path` is written only when the report is complete (every parameter converted); raises
    StateDictError when the file holds no state_dict, or objects other than tensors and plain values without
    `trust` (which runs the file's pickled code: for files the user made)."""
    loaded = load_torch_state_dict(torch_path, trust)
    if isinstance(template, ms.nn.Cell):
        targets = {p.name: (tuple(p.shape), p.dtype) for p in template.get_parameters()}
    else:
        try:
            template_params = ms.load_checkpoint(str(template))
        except Exception:  # noqa: BLE001 - MindSpore raises many types, with long texts, for a bad file
            raise StateDictError(f"{template}: not a MindSpore checkpoint (expected a file that "
                                 f"mindspore.save_checkpoint wrote)") from None
        targets = {k: (tuple(v.shape), v.dtype) for k, v in template_params.items()}
    converted, report = _convert(loaded, {k: s for k, (s, _) in targets.items()}, names, name_map, torch_path)
    if report.complete:
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v).astype(targets[k][1])} for k, v in converted.items()],
                           ckpt_path)
    return report
