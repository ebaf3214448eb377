"""A probe case: what one worker runs, as a value that crosses to the worker
as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

import kvref
from probes.iut.adapter import STARTUP_SECONDS

PROBE_SECONDS = 30.0  # a case's probe, from its start to its worker's exit (`kvprobe run --timeout`)


@dataclass(frozen=True)
class Case:
    probe: str
    generation: str
    iut: str = "kvref-sim"
    name: str = ""
    shape: kvref.ShapeKey | None = None  # the subject: a matrix row's, or the probe's fixed one
    faults: kvref.Faults = kvref.Faults()
    timeout: float = PROBE_SECONDS  # the probe, from its start to the worker's exit
    startup_timeout: float = STARTUP_SECONDS  # imports, the device runtime and the adapter's checks
    seed: int = 0
    kind: str = ""  # robustness probes: which kind of input
    iut_options: tuple[tuple[str, object], ...] = ()  # how the IUT's manager is built; () = its defaults
    calls: dict | None = None  # a call sequence (probes.fuzz.sequences), for call_sequence
    sharding: str = ""  # a matrix row's cache over a device mesh (kvref.Sharding's text); "": one device
    role: str = ""  # a two-process probe's side (probes.suite.rendezvous.ROLES); "": one process
    rendezvous: str = ""  # the folder a two-process case's workers post to each other in

    @property
    def options_text(self) -> str:
        """`unsafe_skip_buffer_lock=False`, or `defaults`."""
        return ",".join(f"{k}={v!r}" for k, v in self.iut_options) or "defaults"

    @property
    def faults_text(self) -> str:
        return str(self.faults)

    @property
    def case_id(self) -> str:
        return f"{self.generation}/{self.probe}/{self.name or self.probe}"

    def to_json(self) -> str:
        return json.dumps({
            "probe": self.probe, "generation": self.generation, "iut": self.iut,
            "name": self.name, "shape": str(self.shape) if self.shape else None,
            "faults": list(self.faults.names), "timeout": self.timeout,
            "startup_timeout": self.startup_timeout, "seed": self.seed,
            "kind": self.kind, "iut_options": [list(o) for o in self.iut_options],
            "calls": self.calls, "sharding": self.sharding, "role": self.role,
            "rendezvous": self.rendezvous})

    @classmethod
    def from_json(cls, text: str) -> "Case":
        data = json.loads(text)
        data["shape"] = kvref.ShapeKey.parse(data["shape"]) if data.get("shape") else None
        data["faults"] = kvref.Faults.parse(data.get("faults", ()), environ={})
        data["iut_options"] = tuple(tuple(o) for o in data.get("iut_options", ()))
        return cls(**data)
