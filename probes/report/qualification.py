"""`kvprobe qualify NEW --against OLD`: one report of what a new TPU type
changes against one already qualified, from a run of each: layouts that
changed, block slice sizes that changed, shapes newly refused or newly
accepted, and every verdict that differs, each with both details (the
reference's rows on each type). Where the run also held production
libraries to the prediction (on a TPU VM of the new type), every case in
which they disagree with it is listed too."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from probes.report.atomic import write_text_whole
from probes.report.diff import case_key
from probes.report.results import disagreements
from probes.suite.verdicts import Verdict


REFERENCE = "kvref-sim"


def compare(new: pd.DataFrame, old: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Sections of the report, each a table (empty when nothing changed)."""
    production = new[new["iut"] != REFERENCE]
    new, old = new[new["iut"] == REFERENCE], old[old["iut"] == REFERENCE]
    both = _matched(new, old)
    shapes = both.drop_duplicates("shape")
    sections = {
        "Layouts that changed": shapes[shapes["layout_new"] != shapes["layout_old"]][
            ["shape", "layout_old", "layout_new"]],
        "Block slice sizes that changed": shapes[_differs(shapes["slice_bytes_new"],
                                                          shapes["slice_bytes_old"])][
            ["shape", "slice_bytes_old", "slice_bytes_new"]],
    }
    trips = both[both["probe"] == "roundtrip"]
    sections["Shapes newly refused"] = trips[(trips["verdict_old"] != Verdict.REJECTED)
                                             & (trips["verdict_new"] == Verdict.REJECTED)][
        ["shape", "verdict_old", "verdict_new", "detail_new"]]
    sections["Shapes newly accepted"] = trips[(trips["verdict_old"] == Verdict.REJECTED)
                                              & (trips["verdict_new"] != Verdict.REJECTED)][
        ["shape", "verdict_old", "verdict_new", "detail_new"]]
    sections["Every verdict that differs"] = both[both["verdict_new"] != both["verdict_old"]][
        ["case", "verdict_old", "verdict_new", "detail_old", "detail_new"]]
    only = sorted(set(case_key(new)) ^ set(case_key(old)))
    sections["Cases only one side ran"] = pd.DataFrame({"case": only})
    if len(production):
        sections["Production libraries against the prediction"] = disagreements(production)[
            ["iut", "iut_options", "case_id", "predicted", "verdict", "detail"]]
    return sections


def write(new: pd.DataFrame, old: pd.DataFrame, new_name: str, old_name: str, path: Path) -> Path:
    lines = [f"# Qualification of {new_name} against {old_name}", "",
             f"{len(new)} cases on {new_name} (run {new['run_id'].iloc[0]}, layouts from "
             f"{', '.join(sorted(set(new['layout_source'])))}), {len(old)} on {old_name} "
             f"(run {old['run_id'].iloc[0]}).", ""]
    for title, table in compare(new, old).items():
        lines += [f"## {title} ({len(table)})", ""]
        lines += [_markdown(table) if len(table) else "None.", ""]
    write_text_whole(path, "\n".join(lines))
    return path


def _differs(a: pd.Series, b: pd.Series) -> pd.Series:
    """Element-wise, with two missing values (no contiguous slice) equal."""
    same = (a == b).fillna(False) | (a.isna() & b.isna())
    return ~same.astype(bool)


def _matched(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    columns = ["probe", "shape", "layout", "slice_bytes", "verdict", "detail"]
    left = new.assign(case=case_key(new))[["case", *columns]]
    right = old.assign(case=case_key(old))[["case", *columns]]
    return left.merge(right, on=["case", "probe", "shape"], suffixes=("_new", "_old"))


def _markdown(table: pd.DataFrame) -> str:
    cells = table.astype(str).apply(lambda col: col.str.replace("|", "\\|").str.replace("\n", " ")
                                    .str.slice(0, 300))
    return cells.to_markdown(index=False)
