"""Probe results as rows of the results table (probes.report.results)."""

from __future__ import annotations

import datetime
import uuid

import pandas as pd

from probes.report.results import COLUMNS, SCHEMA, agrees, typed
from probes.run.runner import CaseResult
from probes.suite.predict import describe


def new_run_id() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def to_frame(results: list[CaseResult], run_id: str) -> pd.DataFrame:
    """One row per case result, its columns as probes.report.results.SCHEMA declares them."""
    run = {"run_id": run_id,
           "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    rows = []
    for r in results:
        facts = describe(r.case)
        sources = {"run": run, "case": r.case, "outcome": r.outcome, "result": r, "facts": facts,
                   "judged": {"agrees": agrees(r.outcome.verdict, facts["predicted"])}}
        rows.append([column.value(sources) for column in SCHEMA])
    return typed(pd.DataFrame(rows, columns=COLUMNS))
