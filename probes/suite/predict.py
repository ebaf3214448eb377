"""What the reference predicts for a case, and the layout facts behind it."""

from __future__ import annotations

import kvref
from probes.iut.registry import iut
from probes.suite.cases import Case
from probes.suite.ownership import row_byte_ranges
from probes.suite.registry import probe
from probes.suite.verdicts import REJECTED, Prediction


def describe(case: Case) -> dict:
    """Layout columns and the predicted verdicts for one case (`PASS|REJECTED`,
    the reference's first). A cache over a mesh is described by one device's
    shard, whose layout decides."""
    shape, source, predicted = _predicted(case)
    return {
        "layout_source": source,
        "dtype": shape.dtype,
        "shape": str(case.shape),
        "sharding": case.sharding,
        "layout": str(shape),
        "physical_bytes": shape.physical_size_bytes,
        "slice_bytes": row_byte_ranges(str(shape)).slice_bytes,
        "legacy_slice_bytes": kvref.legacy_major_slice_byte_size(shape),
        "predicted": str(predicted),
    }


def prediction(case: Case) -> Prediction:
    """The verdicts a correct manager may earn on one case."""
    return _predicted(case)[2]


def _predicted(case: Case) -> tuple[kvref.Shape, str, Prediction]:
    """The layout the case's IUT gives its cache (and where that answer came
    from), and the prediction made from it."""
    sharding = kvref.Sharding.parse(case.sharding) if case.sharding else None
    shape, source = iut(case.iut).layout_of(case.generation, case.shape, sharding)
    predicted = probe(case.probe).predict(shape)
    if sharding and sharding.splits_blocks:  # refusing a cache split along blocks is right too (probes.suite.sharded)
        predicted = predicted.admitting(REJECTED)
    return shape, source, predicted
