"""PyTorch weights -> a MindSpore checkpoint for the same architecture (the migration step that makes a
MindSpore run comparable with its PyTorch original: same weights, same inputs, then compare the dumps).

Each MindSpore parameter looks for its PyTorch source under the same path with the parameter's name
translated by the shared name mapping (`gamma` -> `weight`, `moving_mean` -> `running_mean`, ...). Shapes
must agree exactly (Dense, Conv and BatchNorm keep PyTorch's layouts). The report lists MindSpore parameters
with no source, PyTorch entries left unused and shape mismatches: nothing is converted silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mindspore as ms
import numpy as np

from ..compare.frameworks import MAPPING, TORCH_BOOKKEEPING, load_names


@dataclass
class ConversionReport:
    converted: list = field(default_factory=list)       # (mindspore name, pytorch name)
    missing: list = field(default_factory=list)         # mindspore names with no pytorch source
    unused: list = field(default_factory=list)          # pytorch names no mindspore parameter took
    mismatched: list = field(default_factory=list)      # (mindspore name, its shape, pytorch name, shape)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.mismatched)

    def lines(self) -> list:
        out = [f"converted {len(self.converted)} parameters"]
        out += [f"no PyTorch source for {n}" for n in self.missing]
        out += [f"shape mismatch: {m} {ms_shape} vs {t} {t_shape}" for m, ms_shape, t, t_shape in self.mismatched]
        out += [f"unused PyTorch entry {n}" for n in self.unused]
        return out


def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (bf16 has no numpy dtype: go through float32)
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def load_torch_state_dict(path: str) -> dict:
    """A state_dict from a .pt/.pth file, loaded without unpickling arbitrary objects."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state_dict (a mapping of names to tensors), got "
                         f"{type(state).__name__}")
    return state


def torch_name_of(ms_name: str, params: dict) -> str:
    """The PyTorch state_dict key of a MindSpore parameter name: same path, translated last component."""
    path, _, leaf = ms_name.rpartition(".")
    leaf = params.get(leaf, leaf)
    return f"{path}.{leaf}" if path else leaf


def convert_state_dict(state_dict: dict, targets: dict, names: str = MAPPING) -> tuple:
    """({mindspore name: numpy array}, ConversionReport) for `targets` = {mindspore name: shape}."""
    params = load_names(names)["parameters"]
    report, converted = ConversionReport(), {}
    taken = set()
    for ms_name, shape in targets.items():
        source = torch_name_of(ms_name, params)
        if source not in state_dict:
            source = ms_name if ms_name in state_dict else None
        if source is None:
            report.missing.append(ms_name)
            continue
        value = _as_numpy(state_dict[source])
        taken.add(source)
        if tuple(value.shape) != tuple(shape):
            report.mismatched.append((ms_name, tuple(shape), source, tuple(value.shape)))
            continue
        converted[ms_name] = value
        report.converted.append((ms_name, source))
    report.unused = [k for k in state_dict if k not in taken and k.rpartition(".")[2] not in TORCH_BOOKKEEPING]
    return converted, report


def load_into(net: ms.nn.Cell, state_dict: dict, names: str = MAPPING) -> ConversionReport:
    """Copy PyTorch weights into a MindSpore network in place (dtype of each MindSpore parameter kept)."""
    targets = {p.name: tuple(p.shape) for p in net.get_parameters()}
    converted, report = convert_state_dict(state_dict, targets, names)
    for p in net.get_parameters():
        if p.name in converted:
            p.set_data(ms.Tensor(converted[p.name]).astype(p.dtype))
    return report


def convert_checkpoint(torch_path: str, ckpt_path: str, template, names: str = MAPPING) -> ConversionReport:
    """A .pt/.pth state_dict -> a MindSpore .ckpt named and shaped like `template`: a network (nn.Cell) or
    a MindSpore checkpoint of the target architecture (what `mindspore.save_checkpoint(net, ...)` wrote)."""
    state = load_torch_state_dict(torch_path)
    if isinstance(template, ms.nn.Cell):
        targets = {p.name: (tuple(p.shape), p.dtype) for p in template.get_parameters()}
    else:
        targets = {k: (tuple(v.shape), v.dtype) for k, v in ms.load_checkpoint(str(template)).items()}
    converted, report = convert_state_dict(state, {k: s for k, (s, _) in targets.items()}, names)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v).astype(targets[k][1])} for k, v in converted.items()],
                       ckpt_path)
    return report
