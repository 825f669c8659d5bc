"""PyTorch's side of the hook contract (`core.framework.Framework`): tensors, autograd hooks, module trees."""
from __future__ import annotations

import operator

import torch

from ..core.framework import Framework, NoHandle


class TorchFramework(Framework):
    name = "pytorch"
    module_kind = "Module"
    module_type = torch.nn.Module

    # Both run for every tensor argument of every captured call: C callables, no Python frame each.
    # `type.__instancecheck__` bound to torch.Tensor is `isinstance(value, torch.Tensor)` itself.
    is_tensor = staticmethod(torch.Tensor.__instancecheck__)
    may_get_grad = staticmethod(operator.attrgetter("requires_grad"))

    recording_gradients = staticmethod(torch.is_grad_enabled)

    @staticmethod
    def on_grad(tensor, fn):
        return tensor.register_hook(fn)

    @staticmethod
    def submodules(root):
        return root.named_modules()

    @staticmethod
    def own_parameters(module) -> list:
        return [(name, p) for name, p in module.named_parameters(recurse=False)]

    @staticmethod
    def on_param_grad(param, fn):
        """After accumulation into `.grad`: what the optimizer will use, summed over micro-batches."""
        if not param.requires_grad:
            return NoHandle
        return param.register_post_accumulate_grad_hook(lambda p: fn(p.grad))
