"""Probe cases: what one worker runs, and the shape matrices they come from."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

MATRIX_DIR = Path(__file__).with_name("matrices")

SHAPE_PROBES = ("roundtrip", "deferred_construction", "host_transferred_construction")
# Probes with fixed inputs, run once per generation.
GENERATION_PROBES = ("mixed_slices", "plan_binding", "host_budget")
# Probes of an implementation's robustness, one case per kind of input.
ROBUSTNESS_PROBES = ("bad_input", "release_order", "concurrent_transfers")
PROBES = SHAPE_PROBES + GENERATION_PROBES + ROBUSTNESS_PROBES
# What `kvprobe run` runs unless told otherwise.
DEFAULT_PROBES = SHAPE_PROBES + GENERATION_PROBES
ROBUSTNESS_KINDS = {"release_order": ("arrays_first", "manager_first"),
                    "concurrent_transfers": ("four_threads",)}


@dataclass(frozen=True)
class MatrixRow:
    name: str
    dtype: str
    dims: tuple[int, ...]
    kind: str
    probes: tuple[str, ...] = ("roundtrip",)


@dataclass(frozen=True)
class Case:
    probe: str
    generation: str
    iut: str = "kvref-sim"
    name: str = ""
    dtype: str = ""
    dims: tuple[int, ...] = ()
    faults: tuple[str, ...] = ()
    timeout: float = 30.0
    seed: int = 0
    options: dict = field(default_factory=dict)

    @property
    def case_id(self) -> str:
        return f"{self.generation}/{self.probe}/{self.name or self.probe}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Case":
        data = json.loads(text)
        data["dims"] = tuple(data.get("dims", ()))
        data["faults"] = tuple(data.get("faults", ()))
        return cls(**data)


def matrix_path(name_or_path: str) -> Path:
    """A matrix by name (`default`, `seed`) or a CSV file of the same columns."""
    candidate = MATRIX_DIR / f"{name_or_path}.csv"
    path = candidate if candidate.exists() else Path(name_or_path)
    if not path.exists():
        known = sorted(p.stem for p in MATRIX_DIR.glob("*.csv"))
        raise ValueError(f"no shape matrix {name_or_path!r}: expected one of {known} or a CSV file")
    return path


def load_matrix(name_or_path: str) -> list[MatrixRow]:
    path = matrix_path(name_or_path)
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"name", "dtype", "dims"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {sorted(missing)}; expected "
                             "name,dtype,dims[,kind,probes]")
        for line, row in enumerate(reader, start=2):
            try:
                dims = tuple(int(d) for d in row["dims"].split("x"))
            except ValueError:
                raise ValueError(f"{path}:{line}: dims {row['dims']!r} must look like 512x3x2048") from None
            probes = tuple((row.get("probes") or "roundtrip").split())
            unknown = set(probes) - set(SHAPE_PROBES)
            if unknown:
                raise ValueError(f"{path}:{line}: unknown probe(s) {sorted(unknown)}; expected "
                                 f"any of {list(SHAPE_PROBES)}")
            rows.append(MatrixRow(row["name"], row["dtype"], dims, row.get("kind") or "", probes))
    return rows


def build_cases(generations, matrix: list[MatrixRow], probes=DEFAULT_PROBES, iut="kvref-sim",
                faults=(), timeout=30.0) -> list[Case]:
    cases = []
    for gen in generations:
        for row in matrix:
            for probe in row.probes:
                if probe in probes:
                    cases.append(Case(probe, gen, iut, row.name, row.dtype, row.dims,
                                      tuple(faults), timeout))
        for probe in GENERATION_PROBES:
            if probe in probes:
                cases.append(Case(probe, gen, iut, probe, faults=tuple(faults), timeout=timeout))
        for probe in ROBUSTNESS_PROBES:
            if probe in probes:
                for kind in robustness_kinds(probe):
                    cases.append(Case(probe, gen, iut, f"{probe}-{kind}", faults=tuple(faults),
                                      timeout=timeout, options={"kind": kind}))
    return cases


def robustness_kinds(probe: str) -> tuple[str, ...]:
    if probe == "bad_input":
        from probes.robustness import BAD_INPUTS

        return BAD_INPUTS
    return ROBUSTNESS_KINDS[probe]
