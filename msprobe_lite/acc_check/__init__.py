"""acc_check: diagnosis without a golden run. Every API call of a dump of task tensor is replayed on CPU in
float64 from its saved inputs, and its recorded output is judged against what its dtype's rounding explains
(docs/acc_check.md)."""
from __future__ import annotations


class AccCheckError(ValueError):
    """A dump or output folder acc_check cannot use, named with the reason."""


def acc_check(input_path: str, output_path: str, quiet: bool = False) -> dict:
    """Check every rank under `input_path`; writes acc_check_summary.json and acc_check_result.csv to
    `output_path` (and a section of its report.html when there is one). Returns the summary."""
    return run(input_path, output_path, quiet)


from .run import run  # noqa: E402 - after AccCheckError, which run imports

__all__ = ["AccCheckError", "acc_check"]
