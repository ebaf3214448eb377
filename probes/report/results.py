"""Probe results as tables: one CSV row per case, written per generation."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

COLUMNS = ["run_id", "time", "generation", "device_kind", "iut", "iut_version", "backend",
           "layout_source", "probe", "case_id", "dtype", "shape", "layout", "physical_bytes",
           "slice_bytes", "legacy_slice_bytes", "predicted", "verdict", "detail", "host_bytes",
           "bytes_moved", "seconds", "gbps", "faults"]
# Columns a rerun of the same cases reproduces exactly (the committed baseline).
DETERMINISTIC = ["generation", "device_kind", "iut", "backend", "probe", "case_id", "dtype", "shape",
                 "layout", "physical_bytes", "slice_bytes", "legacy_slice_bytes", "predicted",
                 "verdict", "host_bytes", "bytes_moved", "faults"]


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
