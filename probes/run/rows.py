"""Probe results as rows of the results table (probes.report.results)."""

from __future__ import annotations

import datetime
import uuid

import pandas as pd

from probes.report.results import COLUMNS, typed
from probes.run.runner import CaseResult
from probes.suite.predict import describe


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
            "iut": c.iut, "iut_version": o.iut_version, "iut_options": c.options_text,
            "backend": o.backend,
            "layout_source": facts["layout_source"], "probe": c.probe, "case_id": c.case_id,
            "dtype": facts["dtype"], "shape": facts["shape"], "sharding": facts["sharding"],
            "layout": facts["layout"],
            "physical_bytes": facts["physical_bytes"], "slice_bytes": facts["slice_bytes"],
            "legacy_slice_bytes": facts["legacy_slice_bytes"], "predicted": facts["predicted"],
            "verdict": o.verdict, "detail": o.detail,
            "pending_at_construction": o.pending_at_construction, "host_bytes": o.host_bytes,
            "bytes_moved": o.bytes_moved, "seconds": o.seconds, "gbps": o.gbps, "baseline_gbps": o.baseline_gbps,
            "faults": str(c.faults), "host": r.host, "host_generation": r.host_generation,
        })
    return typed(pd.DataFrame(rows, columns=COLUMNS))
