"""acc_check_result.csv: one line per call, with the measures of its worst output."""
from __future__ import annotations

from ..compare.report import write_csv

COLUMNS = ["Step", "Rank", "Name", "Verdict", "Output", "Dtype", "Elements", "MaxAbsErr", "MaxRelErr", "NormRelErr",
           "MaxULP", "MeanULP", "Balance", "Mismatched", "Reason"]
_MEASURES = {"Output": "output", "Dtype": "dtype", "Elements": "elements", "MaxAbsErr": "max_abs_err",
             "MaxRelErr": "max_rel_err", "NormRelErr": "norm_rel_err", "MaxULP": "max_ulp", "MeanULP": "mean_ulp",
             "Balance": "balance", "Mismatched": "mismatched"}


def write_table(path: str, calls: list) -> None:
    rows = []
    for call in calls:
        error = call.get("error") or {}
        row = {"Step": call.get("step"), "Rank": call.get("rank"), "Name": call["name"], "Verdict": call["verdict"],
               "Reason": call["reason"]}
        row.update({column: error.get(key) for column, key in _MEASURES.items()})
        rows.append(row)
    write_csv(path, COLUMNS, rows)
