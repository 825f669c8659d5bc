"""The MSAdapter / MindTorch scenario: a PyTorch-style script running on MindSpore through a torch-compatible
namespace (`import msadapter.pytorch as torch`, or MindTorch's `mindtorch.torch`).

Detected when such a namespace is imported before the debugger is made and its tensors are MindSpore
tensors. The dump then speaks PyTorch: `"framework": "mindtorch"`, `Module.{path}.{Class}` records, and the
`Torch.` / `Tensor.` / `Functional.` APIs of the PyTorch API list, captured on the adapter's namespaces; so
the same script dumped on real PyTorch gives records with the same names. Tensors stay MindSpore tensors
(MindSpore dtype names, `.npy` files).
"""
from __future__ import annotations

import os
import sys

import mindspore as ms

from .api_capture import load_api_list
from .framework import MindSporeFramework

NAMESPACES = ("msadapter.pytorch", "mindtorch.torch")   # MSAdapter 0.1, MindTorch 0.3+
TORCH_API_LIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pytorch", "apis.yaml")


def torch_namespace():
    """The imported torch-like namespace whose tensors are MindSpore tensors, or None."""
    for name in NAMESPACES:
        namespace = sys.modules.get(name)
        if namespace is None or not hasattr(namespace, "Tensor") or not hasattr(namespace, "nn"):
            continue
        try:
            if isinstance(namespace.zeros(1), ms.Tensor):
                return namespace
        except Exception:  # noqa: BLE001 - an odd namespace is simply not this scenario
            continue
    return None


def _adapter_cast(namespace):
    """The adapter's own `cast_to_adapter_tensor` (tensors, and tensors inside tuples/lists), or None."""
    tensor_module = sys.modules.get(namespace.__name__ + ".tensor")
    return getattr(tensor_module, "cast_to_adapter_tensor", None)


def framework_for(namespace) -> type:
    """A Framework class for the adapter's modules: PyTorch names, MindSpore tensors and hooks.

    On MindSpore 2.0 a cell backward hook hands the cell's `forward` and its caller plain MindSpore tensors
    instead of the adapter's (whose torch-style methods, `x.size(0)`, user code relies on: it would crash).
    So backward hooks go only on the adapter's own layers (`nn.Linear`, `nn.Conv2d`, ...), whose forward
    takes either kind, and the forward hook hands their output back as the adapter's tensor: same data,
    the type the script would have seen. Modules the user wrote get forward records only."""
    module_type = namespace.nn.Module
    cast = _adapter_cast(namespace)
    adapter_tensor = namespace.Tensor

    class MindTorchFramework(MindSporeFramework):
        name = "mindtorch"
        module_kind = "Module"

        @staticmethod
        def submodules(root):
            if hasattr(root, "named_modules"):
                return root.named_modules()
            return MindSporeFramework.submodules(root)

        @staticmethod
        def own_parameters(module) -> list:
            if hasattr(module, "named_parameters"):
                try:
                    return list(module.named_parameters(recurse=False))
                except TypeError:  # an adapter without `recurse`
                    pass
            return MindSporeFramework.own_parameters(module)

        @staticmethod
        def hook_backward(module, fn):
            if not type(module).__module__.startswith(namespace.__name__ + "."):
                return None
            return MindSporeFramework.hook_backward(module, fn)

        if not MindSporeFramework.tensor_hooks and cast is not None:
            @staticmethod
            def hook_forward(module, pre, post) -> list:
                def after(_id, args, output):
                    post(module, args, {}, output)
                    # exact type: the adapter's isinstance() also accepts plain MindSpore tensors
                    if isinstance(output, ms.Tensor) and type(output) is not adapter_tensor \
                            or isinstance(output, (tuple, list)):
                        return cast(output)
                    return None
                return [module.register_forward_pre_hook(lambda _id, args: pre(module, args, {})),
                        module.register_forward_hook(after)]

    MindTorchFramework.module_type = module_type
    return MindTorchFramework


def api_entries(namespace) -> tuple:
    """The PyTorch API list, resolved on the adapter's namespaces (names it lacks are reported once)."""
    sections = {"torch": ("Torch", namespace, False), "tensor": ("Tensor", namespace.Tensor, False),
                "functional": ("Functional", getattr(namespace.nn, "functional", None), False)}
    return load_api_list(TORCH_API_LIST, sections, ignored=("distributed",), tensor_type=namespace.Tensor)
