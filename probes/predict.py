"""What the reference predicts for a case, and the layout facts behind it."""

from __future__ import annotations

import kvref
from probes.cases import SHAPE_PROBES, Case
from probes import definitions, robustness
from probes.iut import adapter_class
from probes.verdicts import PASS, REJECTED

FIXED_PREDICTIONS = {"mixed_slices": REJECTED, "plan_binding": PASS,
                     "bad_input": REJECTED, "release_order": PASS, "concurrent_transfers": PASS}


def subject(case: Case) -> tuple[str, tuple[int, ...]]:
    if case.probe in SHAPE_PROBES:
        return case.dtype, case.dims
    return {**definitions.SUBJECT_SHAPES, **robustness.SUBJECT_SHAPES}[case.probe]


def describe(case: Case) -> dict:
    """Layout columns and the predicted verdict for one case."""
    dtype, dims = subject(case)
    shape, source = adapter_class(case.iut).layout_of(case.generation, dtype, dims)
    info = kvref.major_slice(shape)
    if case.probe in SHAPE_PROBES or case.probe == "host_budget":
        predicted = PASS if info.addressable else REJECTED
    else:
        predicted = FIXED_PREDICTIONS[case.probe]
    return {
        "layout_source": source,
        "dtype": dtype,
        "dims": "x".join(map(str, dims)),
        "layout": str(shape),
        "physical_bytes": shape.physical_size_bytes,
        "slice_bytes": info.slice_bytes,
        "legacy_slice_bytes": kvref.legacy_major_slice_byte_size(shape),
        "reason": info.reason,
        "predicted": predicted,
    }
