"""`kvprobe diff A.csv B.csv`: what changed between two runs, case by case
(matched on probe, case name and implementation, so a new generation
compares with the last, and each IUT with itself)."""

from __future__ import annotations

import pandas as pd

from probes.report.results import implementation

COMPARED = ["layout", "slice_bytes", "legacy_slice_bytes", "verdict"]


def case_key(frame: pd.DataFrame) -> pd.Series:
    """probe/case on an implementation, without the generation."""
    return frame["case_id"].str.split("/", n=1).str[1] + " on " + implementation(frame)


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
