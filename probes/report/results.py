"""Probe results as tables: one CSV row per case, written per generation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvref.generations import report_name

from probes.suite.verdicts import Prediction, Verdict

# The results table, declared once: each column and where a case's row takes
# it from (`run`: the run's id and time; `case`, `outcome`, `result`: the
# attribute of that name, or `attr`; `facts`: the reference's facts about
# the case, probes.suite.predict.describe). probes.run.rows fills it.
@dataclass(frozen=True)
class Column:
    name: str
    source: str
    attr: str = ""

    def value(self, sources: dict):
        found = sources[self.source]
        key = self.attr or self.name
        return found[key] if isinstance(found, dict) else getattr(found, key)


SCHEMA = (
    Column("run_id", "run"), Column("time", "run"), Column("generation", "case"),
    Column("device_kind", "outcome"), Column("iut", "case"), Column("iut_version", "outcome"),
    Column("iut_options", "case", "options_text"), Column("backend", "outcome"), Column("layout_source", "facts"),
    Column("probe", "case"), Column("case_id", "case"), Column("dtype", "facts"), Column("shape", "facts"),
    Column("sharding", "facts"), Column("layout", "facts"), Column("physical_bytes", "facts"),
    Column("slice_bytes", "facts"), Column("legacy_slice_bytes", "facts"), Column("predicted", "facts"),
    Column("verdict", "outcome"), Column("detail", "outcome"), Column("pending_at_construction", "outcome"),
    Column("host_bytes", "outcome"), Column("bytes_moved", "outcome"), Column("seconds", "outcome"),
    Column("gbps", "outcome"), Column("baseline_gbps", "outcome"), Column("faults", "case", "faults_text"),
    Column("host", "result"), Column("host_generation", "result"),
)
COLUMNS = [c.name for c in SCHEMA]
# Columns a rerun of the same cases reproduces exactly (the committed baseline).
DETERMINISTIC = ["generation", "device_kind", "iut", "iut_options", "backend", "probe", "case_id",
                 "dtype", "shape", "sharding", "layout", "physical_bytes", "slice_bytes", "legacy_slice_bytes",
                 "predicted", "verdict", "pending_at_construction", "host_bytes", "bytes_moved",
                 "faults"]


def write_runs(frame: pd.DataFrame, out: Path) -> list[Path]:
    """reports/<generation>/runs/<run_id>.csv for each generation in the frame."""
    paths = []
    for gen, part in frame.groupby("generation", sort=False):
        path = Path(out) / generation_dir(gen) / "runs" / f"{part['run_id'].iloc[0]}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        part.to_csv(path, index=False)
        paths.append(path)
    return paths


BASELINE = "baseline.csv"  # in a generation's folder: the deterministic columns of the run its reports show


def generation_dir(generation: str) -> str:
    """The folder of a generation's reports: `cpu`, or the TPU type's report name."""
    return generation if generation == "cpu" else report_name(generation)


def read_run(path) -> pd.DataFrame:
    """A run CSV (or a baseline, which has only the deterministic columns)."""
    frame = pd.read_csv(path, dtype={"faults": str, "detail": str, "iut_options": str, "sharding": str,
                                     "pending_at_construction": "boolean"}, keep_default_na=False,
                        na_values={"slice_bytes": [""], "host_bytes": [""], "bytes_moved": [""],
                                   "seconds": [""], "gbps": [""], "baseline_gbps": [""],
                                   "pending_at_construction": [""]})
    return typed(frame)


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """The nullable columns in the types a written and a read table share (a
    table written before caches could be sharded has every case on one device)."""
    if "sharding" not in frame.columns:
        frame.insert(frame.columns.get_loc("shape") + 1 if "shape" in frame.columns else len(frame.columns),
                     "sharding", "")
    if "gbps" in frame.columns and "baseline_gbps" not in frame.columns:  # written before it was measured
        frame.insert(frame.columns.get_loc("gbps") + 1, "baseline_gbps", float("nan"))
    for col in ("slice_bytes", "host_bytes", "bytes_moved"):
        frame[col] = frame[col].astype("Int64")
    frame["pending_at_construction"] = frame["pending_at_construction"].astype("boolean")
    return frame


def latest_run(generation_dir: Path) -> Path | None:
    runs = sorted((Path(generation_dir) / "runs").glob("*.csv"))
    return runs[-1] if runs else None


def deterministic(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[DETERMINISTIC].sort_values(["case_id", "iut", "iut_options"]).reset_index(drop=True)


def implementation(frame: pd.DataFrame) -> pd.Series:
    """Each row's IUT as reports name it: the IUT, and how its manager was
    built where that is not its defaults."""
    options = frame["iut_options"].where(frame["iut_options"] != "defaults", "")
    return frame["iut"] + options.map(lambda o: f" [{o}]" if o else "")


def disagreements(frame):
    """Rows of a results table whose verdict is none of the predicted ones. A
    SKIP was not tested, so it neither agrees nor disagrees."""
    agreeing = [Prediction.parse(p).admits(v) for v, p in zip(frame["verdict"], frame["predicted"])]
    return frame[~pd.Series(agreeing, index=frame.index, dtype=bool) & (frame["verdict"] != Verdict.SKIP)]


def skipped(frame):
    return frame[frame["verdict"] == Verdict.SKIP]
