"""Probe results as tables: one CSV row per case, written per generation."""

from __future__ import annotations

import difflib

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvref.generations import report_name

from probes.report.atomic import write_whole
from probes.suite.verdicts import Prediction, Verdict

# The results table, declared once: each column, where a case's row takes it
# from (`run`: the run's id and time; `case`, `outcome`, `result`: the
# attribute of that name, or `attr`; `facts`: the reference's facts about
# the case, probes.suite.predict.describe; `judged`: whether the verdict is
# one the prediction admits, empty for a SKIP), the kind of its values, and
# whether a rerun of the same cases reproduces it (the committed baseline
# keeps those). probes.run.rows fills it.
KINDS = {"text": str, "int": "int64", "count": "Int64", "real": "float64", "flag": "boolean"}
NULLABLE = ("count", "real", "flag")  # an empty cell is a missing value (an int, a float, a bool or none)


@dataclass(frozen=True)
class Column:
    name: str
    source: str
    kind: str = "text"  # one of KINDS
    attr: str = ""
    reproduced: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r} has kind {self.kind!r}; expected one of {list(KINDS)}")

    @property
    def nullable(self) -> bool:
        return self.kind in NULLABLE

    def value(self, sources: dict):
        found = sources[self.source]
        key = self.attr or self.name
        return found[key] if isinstance(found, dict) else getattr(found, key)


SCHEMA = (
    Column("run_id", "run", reproduced=False), Column("time", "run", reproduced=False),
    Column("generation", "case"), Column("device_kind", "outcome"), Column("iut", "case"),
    Column("iut_version", "outcome", reproduced=False), Column("iut_options", "case", attr="options_text"),
    Column("backend", "outcome"), Column("layout_source", "facts", reproduced=False), Column("probe", "case"),
    Column("case_id", "case"), Column("dtype", "facts"), Column("shape", "facts"), Column("sharding", "facts"),
    Column("layout", "facts"), Column("physical_bytes", "facts", "int"), Column("slice_bytes", "facts", "count"),
    Column("legacy_slice_bytes", "facts", "int"), Column("predicted", "facts"), Column("verdict", "outcome"),
    Column("agrees", "judged", "flag", reproduced=False),
    Column("detail", "outcome", reproduced=False), Column("pending_at_construction", "outcome", "flag"),
    Column("host_bytes", "outcome", "count"), Column("bytes_moved", "outcome", "count"),
    Column("seconds", "outcome", "real", reproduced=False), Column("gbps", "outcome", "real", reproduced=False),
    Column("baseline_gbps", "outcome", "real", reproduced=False),
    Column("faults", "case", attr="faults_text"), Column("host", "result", reproduced=False),
    Column("host_generation", "result", reproduced=False),
)
COLUMNS = [c.name for c in SCHEMA]
DETERMINISTIC = [c.name for c in SCHEMA if c.reproduced]


def write_runs(frame: pd.DataFrame, out: Path) -> list[Path]:
    """reports/<generation>/runs/<run_id>.csv for each generation in the frame."""
    paths = []
    for gen, part in frame.groupby("generation", sort=False):
        path = Path(out) / generation_dir(gen) / "runs" / f"{part['run_id'].iloc[0]}.csv"
        write_whole(path, lambda f, part=part: part.to_csv(f, index=False))
        paths.append(path)
    return paths


BASELINE = "baseline.csv"  # in a generation's folder: the deterministic columns of the run its reports show


def generation_dir(generation: str) -> str:
    """The folder of a generation's reports: `cpu`, or the TPU type's report name."""
    return generation if generation == "cpu" else report_name(generation)


def read_run(path) -> pd.DataFrame:
    """A run CSV (or a baseline, which has only the deterministic columns);
    anything else is a ValueError of one line that names the file."""
    try:
        header = set(pd.read_csv(path, nrows=0).columns)
        missing = [c for c in DETERMINISTIC if c not in header and c != "sharding"]  # sharding: added by typed()
        if missing:
            strangers = sorted(header - set(COLUMNS))  # columns kvprobe never writes: a misspelling, likely
            meant = [f"{theirs!r} for {ours}" for ours in missing[:4]
                     for theirs in difflib.get_close_matches(ours, strangers, 1)]
            raise ValueError(f"it has no column {', '.join(missing[:4])}"
                             + (f" (misspelled? it has {', '.join(meant)})" if meant else ""))
        frame = pd.read_csv(path, keep_default_na=False,
                            dtype={c.name: KINDS[c.kind] for c in SCHEMA if c.kind == "text" and c.name in header},
                            na_values={c.name: [""] for c in SCHEMA if c.nullable and c.name in header})
        bare = frame.index[~frame["case_id"].astype(str).str.fullmatch(r"[^/]+/[^/]+/.+")]
        if len(bare):
            raise ValueError(f"row {bare[0] + 2} has case_id {frame['case_id'][bare[0]]!r}; expected "
                             "generation/probe/case, as kvprobe writes it")
        return typed(frame)
    except (ValueError, TypeError, OverflowError, pd.errors.ParserError, pd.errors.EmptyDataError,
            UnicodeDecodeError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not a kvprobe run CSV: {why[:300]}") from None


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """The nullable columns in the types a written and a read table share (a
    table written before caches could be sharded has every case on one device)."""
    if "sharding" not in frame.columns:
        frame.insert(frame.columns.get_loc("shape") + 1 if "shape" in frame.columns else len(frame.columns),
                     "sharding", "")
    if "gbps" in frame.columns and "baseline_gbps" not in frame.columns:  # written before it was measured
        frame.insert(frame.columns.get_loc("gbps") + 1, "baseline_gbps", float("nan"))
    for column in SCHEMA:
        if column.nullable and column.name in frame.columns:
            frame[column.name] = frame[column.name].astype(KINDS[column.kind])
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


def agrees(verdict: str, predicted: str) -> bool | None:
    """Whether a verdict is one its prediction admits; None for a SKIP, which was not tested."""
    return None if verdict == Verdict.SKIP else Prediction.parse(predicted).admits(verdict)


def disagreements(frame):
    """Rows of a results table whose verdict is none of the predicted ones. A
    SKIP was not tested, so it neither agrees nor disagrees."""
    agreeing = [agrees(v, p) is not False for v, p in zip(frame["verdict"], frame["predicted"])]
    return frame[~pd.Series(agreeing, index=frame.index, dtype=bool)]


def skipped(frame):
    return frame[frame["verdict"] == Verdict.SKIP]
