"""What the reference predicts for a case, and the layout facts behind it."""

from __future__ import annotations

import kvref
from probes.iut.registry import iut
from probes.suite.cases import Case
from probes.suite.ownership import row_byte_ranges
from probes.suite.registry import probe


def describe(case: Case) -> dict:
    """Layout columns and the predicted verdicts for one case: the verdicts a
    correct manager may earn, `|`-separated, the reference's first."""
    shape, source = iut(case.iut).layout_of(case.generation, case.shape)
    return {
        "layout_source": source,
        "dtype": shape.dtype,
        "shape": str(case.shape),
        "layout": str(shape),
        "physical_bytes": shape.physical_size_bytes,
        "slice_bytes": row_byte_ranges(str(shape)).slice_bytes,
        "legacy_slice_bytes": kvref.legacy_major_slice_byte_size(shape),
        "predicted": "|".join(probe(case.probe).predict(shape)),
    }
