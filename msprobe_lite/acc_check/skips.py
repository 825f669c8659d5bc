"""API names that no replay runs again, whatever the framework, and why."""
from __future__ import annotations

import re

# random ops: their result depends on a generator state the dump does not hold (a replay may read dropout's
# mask off its output instead)
RANDOM = frozenset((
    "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "poisson", "uniform_", "random_",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "gumbel_softmax", "rrelu", "rrelu_", "alpha_dropout",
    "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_", "feature_dropout", "feature_dropout_",
    "native_dropout", "fractional_max_pool2d", "fractional_max_pool3d", "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices", "dropout_", "uniform", "standard_normal", "gamma", "random_gamma",
    "random_poisson", "shuffle"))
UNINITIALISED = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "empty_permuted"))


# what writes memory, files or devices, or runs code, instead of computing (MindSpore's Tensor.set_device_address,
# offload_file_path, PyExecute, DumpGradient, the *Summary ops): a dump names the call and its arguments, and must
# not make a replay do that
NOT_MATH = re.compile(r"^(set_|offload|flush|assign_value|init_flag|py_?execute|dump|print|save|load)|device_address"
                      r"|summary$", re.IGNORECASE)


def never_replayed(prefix: str, api: str):
    """Why calls of `{prefix}.{api}` are never replayed, or None."""
    if NOT_MATH.search(api):
        return "not a computation (it writes memory, files or devices, or runs code): never replayed"
    if prefix == "Distributed":
        return "a collective: its result is made with the other ranks' data"
    if api in RANDOM or api.startswith("rand"):
        return "a random op: the dump does not hold its generator state"
    if api in UNINITIALISED:
        return "its output is uninitialised memory"
    return None
