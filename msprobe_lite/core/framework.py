"""What the framework-neutral hook logic needs to know about a framework: the adapter's side of the contract.

`core.calls` and `core.module_calls` record calls the same way for PyTorch and MindSpore; everything that
differs (what a tensor is, how a gradient hook is attached, how a model lists its submodules) goes through
one object of a subclass of `Framework`, provided by the adapter.
"""
from __future__ import annotations


class Framework:
    """Hooks into one framework's tensors and modules. Every method is called on the hot path: keep them thin."""

    name = ""          # dump.json's "framework"
    tensor_hooks = True  # gradients through per-tensor hooks; False: through the module backward hook
    module_kind = ""   # record prefix of modules: "Module" or "Cell"
    module_type: type = object  # the class every hooked model (and submodule) is an instance of

    @staticmethod
    def is_tensor(value) -> bool:
        raise NotImplementedError

    @staticmethod
    def recording_gradients() -> bool:
        """Whether a gradient can flow through what runs now (autograd on, or inside a grad function)."""
        raise NotImplementedError

    @staticmethod
    def in_backward() -> bool:
        """Whether this thread runs inside a backward pass now (activation checkpointing's recomputation):
        module calls there are not records, as API calls there are not (no mode reaches the backward)."""
        return False

    @staticmethod
    def may_get_grad(tensor) -> bool:
        """False only when `tensor` certainly receives no gradient (then no hook is attached)."""
        raise NotImplementedError

    @staticmethod
    def on_grad(tensor, fn):
        """Call `fn(grad)` when the gradient w.r.t. `tensor` is computed; returns a handle with `remove()`."""
        raise NotImplementedError

    @staticmethod
    def submodules(root):
        """(path, module) of every module under `root`, the root itself included with path ""."""
        raise NotImplementedError

    @staticmethod
    def opaque(module) -> bool:
        """True for a module whose inside runs compiled: the modules `submodules` lists under it get only their
        parameter-gradient hooks (which run outside compiled code), no forward hooks."""
        return False

    @staticmethod
    def class_name(module) -> str:
        """The class that names the module's records."""
        return type(module).__name__

    @staticmethod
    def unwrap(root):
        """The model a data-parallel wrapper holds (`root` itself when it is none): the wrapper adds a level
        (`module.`) to every name, and a run with it would not pair with a run without it."""
        return root

    @staticmethod
    def own_parameters(module) -> list:
        """(name, parameter) of the module's own trainable parameters, not its children's."""
        raise NotImplementedError

    @staticmethod
    def hook_forward(module, pre, post) -> list:
        """Register `pre(module, args, kwargs)` before and `post(module, args, kwargs, output)` after every call
        of `module` (post also when the call raises); returns the handles."""
        return [module.register_forward_pre_hook(pre, with_kwargs=True),
                module.register_forward_hook(post, with_kwargs=True, always_call=True)]

    @staticmethod
    def hook_backward(module, fn):
        """Only when `tensor_hooks` is False: call `fn(grads w.r.t. outputs, grads w.r.t. inputs)` when the
        module's backward runs; returns a handle, or None when the framework offers no such hook."""
        return None

    @staticmethod
    def on_param_grad(param, fn):
        """Call `fn(grad)` with the parameter's gradient once it is accumulated; returns a handle. `fn` returns
        None or a function to call with the gradient again once it is final (PyTorch: when the backward pass
        ends, after DistributedDataParallel's averaging), which an adapter may call or leave."""
        raise NotImplementedError


class NoHandle:
    """The handle of a hook that was not registered (nothing to remove)."""

    @staticmethod
    def remove() -> None:
        pass
