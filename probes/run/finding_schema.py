"""What a finding file (and a bare contract sequence given to `--replay`)
must be before anything of it is used: a JSON Schema per model, checked by
jsonschema, and the size of the caches its sequence asks for. Findings are
shared between teams; a file from elsewhere is data to check, never trusted."""

from __future__ import annotations

import dataclasses

import jsonschema

import kvref
from probes.suite.cases import Case

MOST_CACHE_BYTES = 64 << 20  # one layer's cache a replayed sequence may ask for (the drawn ones are KiBs)
MOST_LAYERS = 16
MOST_HOST_BLOCKS = 4096
MOST_STEPS = 100_000

_TEXT = {"type": "string", "maxLength": 100_000}
_COUNT = {"type": "integer", "minimum": 0}
_SPEC = {"type": "object", "required": ["shape", "layers", "host_blocks", "mode"],
         "properties": {"shape": {"type": "string", "maxLength": 200},
                        "mixed": {"type": ["string", "null"], "maxLength": 200},
                        "layers": {"type": "integer", "minimum": 1, "maximum": MOST_LAYERS},
                        "host_blocks": {"type": "integer", "minimum": 0, "maximum": MOST_HOST_BLOCKS},
                        "mode": {"type": "string", "maxLength": 40},
                        "store": {"type": ["integer", "null"], "minimum": 0, "maximum": MOST_HOST_BLOCKS}}}
SEQUENCE = {"type": "object", "required": ["spec", "seed", "steps"],
            "properties": {"spec": _SPEC, "seed": _COUNT,
                           "steps": {"type": "array", "maxItems": MOST_STEPS,
                                     "items": {"type": "object", "required": ["rule"],
                                               "properties": {"rule": {"type": "string", "maxLength": 100}}}}}}
_CALLS = {"type": "object", "required": ["shape", "layers", "host_blocks", "mode", "calls"],
          "properties": {**_SPEC["properties"], "calls": {"type": "array", "maxItems": MOST_STEPS,
                                                          "items": {"type": "object"}}}}
_CASE = {"type": "object", "required": ["probe", "generation", "iut", "name", "shape", "faults", "timeout", "calls"],
         "propertyNames": {"enum": [field.name for field in dataclasses.fields(Case)]},  # a case's fields only
         "properties": {"probe": {"enum": ["call_sequence", "contract_sequences"]},
                        "generation": {"type": "string", "maxLength": 100}, "iut": {"type": "string", "maxLength": 200},
                        "name": {"type": "string", "maxLength": 200}, "shape": {"type": "string", "maxLength": 200},
                        "faults": {"type": "array", "items": {"type": "string", "maxLength": 100}},
                        "timeout": {"type": "number", "exclusiveMinimum": 0},
                        "startup_timeout": {"type": "number", "exclusiveMinimum": 0}, "seed": _COUNT,
                        "iut_options": {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2}}}}
_OPTION_SETS = {"type": "array", "items": {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2}}}


def finding_schema(model: str) -> dict:
    """The JSON Schema of a finding of `model` ("contract" or "blocks")."""
    calls = SEQUENCE if model == "contract" else _CALLS
    return {"type": "object",
            "required": ["model", "iut", "iut_version", "verdict", "detail", "found_in", "option_sets", "case"],
            "properties": {"model": {"const": model}, "iut": {"type": "string", "maxLength": 200},
                           "iut_version": _TEXT, "verdict": {"enum": ["ERROR", "CORRUPT", "CRASH", "HANG", "REJECTED"]},
                           "detail": _TEXT, "found_in": _TEXT, "option_sets": _OPTION_SETS,
                           "case": {**_CASE, "properties": {**_CASE["properties"], "calls": calls}}}}


def check(document, schema: dict, what: str) -> None:
    """ValueError naming where in `what` the document first breaks `schema`, and what was expected there."""
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(document))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the document"
        raise ValueError(f"{what}: at {where}: {error.message[:300]}")


def check_sizes(spec: dict, what: str) -> None:
    """ValueError where a sequence's spec asks for caches no replay should make."""
    for field in ("shape", "mixed"):
        if not spec.get(field):
            continue
        try:
            key = kvref.ShapeKey.parse(spec[field])
        except ValueError as e:
            raise ValueError(f"{what}: at spec/{field}: {e}") from None
        size = kvref.element_type(key.dtype).numpy.itemsize
        for dim in key.dims:
            size *= dim
        if size > MOST_CACHE_BYTES:
            raise ValueError(f"{what}: at spec/{field}: {spec[field]} is a cache of {size:,} bytes a layer; a "
                             f"replayed sequence's caches are at most {MOST_CACHE_BYTES:,}")


def check_finding(finding, model: str, what: str) -> None:
    check(finding, finding_schema(model), what)
    check_sizes(finding["case"]["calls"] if model == "blocks" else finding["case"]["calls"]["spec"], what)


def check_sequence(sequence, what: str) -> None:
    check(sequence, SEQUENCE, what)
    check_sizes(sequence["spec"], what)
