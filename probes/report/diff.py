"""`kvprobe diff A.csv B.csv`: what changed between two runs, case by case
(matched on probe and case name, so a new generation compares with the last)."""

from __future__ import annotations

import pandas as pd

COMPARED = ["layout", "slice_bytes", "legacy_slice_bytes", "verdict"]


def case_key(frame: pd.DataFrame) -> pd.Series:
    return frame["case_id"].str.split("/", n=1).str[1]


def diff_runs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per case whose compared columns differ, or that only one run has."""
    left = a.assign(key=case_key(a)).set_index("key")
    right = b.assign(key=case_key(b)).set_index("key")
    rows = []
    for key in sorted(set(left.index) | set(right.index)):
        if key not in right.index or key not in left.index:
            side = "A" if key in left.index else "B"
            row = (left if side == "A" else right).loc[key]
            rows.append({"case": key, "change": f"only in {side}", "A": row["verdict"] if side == "A" else "",
                         "B": row["verdict"] if side == "B" else ""})
            continue
        ra, rb = left.loc[key], right.loc[key]
        for col in COMPARED:
            va, vb = ra[col], rb[col]
            if not (pd.isna(va) and pd.isna(vb)) and str(va) != str(vb):
                rows.append({"case": key, "change": col, "A": va, "B": vb})
    return pd.DataFrame(rows, columns=["case", "change", "A", "B"])
