"""Probe results as tables: one CSV row per case, written per generation."""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path

import pandas as pd

from probes.predict import describe
from probes.runner import CaseResult

COLUMNS = ["run_id", "time", "generation", "device_kind", "iut", "iut_version", "backend",
           "layout_source", "probe", "case_id", "dtype", "dims", "layout", "physical_bytes",
           "slice_bytes", "legacy_slice_bytes", "predicted", "verdict", "detail", "host_bytes",
           "bytes_moved", "seconds", "gbps", "faults"]
# Columns a rerun of the same cases reproduces exactly (the committed baseline).
DETERMINISTIC = ["generation", "device_kind", "iut", "backend", "probe", "case_id", "dtype", "dims",
                 "layout", "physical_bytes", "slice_bytes", "legacy_slice_bytes", "predicted",
                 "verdict", "host_bytes", "bytes_moved", "faults"]


def new_run_id() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def to_frame(results: list[CaseResult], run_id: str) -> pd.DataFrame:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows = []
    for r in results:
        c, o = r.case, r.outcome
        facts = describe(c)
        rows.append({
            "run_id": run_id, "time": now, "generation": c.generation, "device_kind": o.device_kind,
            "iut": c.iut, "iut_version": o.iut_version, "backend": o.backend,
            "layout_source": facts["layout_source"], "probe": c.probe, "case_id": c.case_id,
            "dtype": facts["dtype"], "dims": facts["dims"], "layout": facts["layout"],
            "physical_bytes": facts["physical_bytes"], "slice_bytes": facts["slice_bytes"],
            "legacy_slice_bytes": facts["legacy_slice_bytes"], "predicted": facts["predicted"],
            "verdict": o.verdict, "detail": o.detail, "host_bytes": o.host_bytes,
            "bytes_moved": o.bytes_moved, "seconds": o.seconds, "gbps": o.gbps,
            "faults": ",".join(c.faults),
        })
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("slice_bytes", "host_bytes", "bytes_moved"):
        frame[col] = frame[col].astype("Int64")
    return frame


def write_runs(frame: pd.DataFrame, out: Path) -> list[Path]:
    """reports/<generation>/runs/<run_id>.csv for each generation in the frame."""
    paths = []
    for gen, part in frame.groupby("generation", sort=False):
        path = Path(out) / gen / "runs" / f"{part['run_id'].iloc[0]}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        part.to_csv(path, index=False)
        paths.append(path)
    return paths


def read_run(path) -> pd.DataFrame:
    """A run CSV (or a baseline, which has only the deterministic columns)."""
    frame = pd.read_csv(path, dtype={"faults": str, "detail": str}, keep_default_na=False,
                        na_values={"slice_bytes": [""], "host_bytes": [""], "bytes_moved": [""],
                                   "seconds": [""], "gbps": [""]})
    for col in ("slice_bytes", "host_bytes", "bytes_moved"):
        frame[col] = frame[col].astype("Int64")
    return frame


def latest_run(generation_dir: Path) -> Path | None:
    runs = sorted((Path(generation_dir) / "runs").glob("*.csv"))
    return runs[-1] if runs else None


def deterministic(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[DETERMINISTIC].sort_values("case_id").reset_index(drop=True)
