"""A probe case: what one worker runs, as a value that crosses to the worker
as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

import kvref


@dataclass(frozen=True)
class Case:
    probe: str
    generation: str
    iut: str = "kvref-sim"
    name: str = ""
    shape: kvref.ShapeKey | None = None  # the subject: a matrix row's, or the probe's fixed one
    faults: kvref.Faults = kvref.Faults()
    timeout: float = 30.0
    seed: int = 0
    kind: str = ""  # robustness probes: which kind of input

    @property
    def case_id(self) -> str:
        return f"{self.generation}/{self.probe}/{self.name or self.probe}"

    def to_json(self) -> str:
        return json.dumps({
            "probe": self.probe, "generation": self.generation, "iut": self.iut,
            "name": self.name, "shape": str(self.shape) if self.shape else None,
            "faults": list(self.faults.names), "timeout": self.timeout, "seed": self.seed,
            "kind": self.kind})

    @classmethod
    def from_json(cls, text: str) -> "Case":
        data = json.loads(text)
        data["shape"] = kvref.ShapeKey.parse(data["shape"]) if data.get("shape") else None
        data["faults"] = kvref.Faults.parse(data.get("faults", ()), environ={})
        return cls(**data)
