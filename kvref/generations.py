"""The TPU generations kvref ships layouts for, the topology each is compiled
for, and how any other TPU type is named.

A TPU type the shipped table does not know is written `chip:topology`
(`v2:2x2`) or as a bare chip (`v2`, compiled for the first of
DEFAULT_TOPOLOGIES the installed libtpu accepts); its layouts come live from
the compiler (kvref.oracle)."""

from __future__ import annotations

import re

GENERATIONS: tuple[str, ...] = ("v3", "v4", "v5e", "v5p", "v6e", "tpu7x")

TOPOLOGIES: dict[str, str] = {
    "v3": "v3:2x2",
    "v4": "v4:2x2x1",
    "v5e": "v5e:1x1",
    "v5p": "v5p:2x2x1",
    "v6e": "v6e:1x1",
    "tpu7x": "tpu7x:2x2x1",
}

# Tried in this order for a chip named without a topology.
DEFAULT_TOPOLOGIES: tuple[str, ...] = ("1x1", "2x2", "1x1x1", "2x2x1")
TPU_TYPE = re.compile(r"(?P<chip>[a-z][a-z0-9]*)(?::(?P<topology>[1-9][0-9]*(?:x[1-9][0-9]*)+))?")


def check_generation(generation: str) -> str:
    """A shipped generation, or any TPU type written chip or chip:topology;
    whether libtpu knows it is the compiler's to say."""
    if generation in TOPOLOGIES:
        return generation
    if not isinstance(generation, str) or not TPU_TYPE.fullmatch(generation):
        raise ValueError(f"unknown TPU generation {generation!r}; expected one of "
                         f"{', '.join(GENERATIONS)}, or a TPU type the installed libtpu compiles for, "
                         "written chip or chip:topology (v2, v2:2x2)")
    return generation


def chip_of(generation: str) -> str:
    return check_generation(generation).split(":")[0]


def is_shipped(generation: str) -> bool:
    return generation in TOPOLOGIES


def report_name(generation: str) -> str:
    """The folder a TPU type's reports go to: a new chip's name (`v2:2x2` ->
    `v2`); a shipped chip on another topology keeps it (`v4:2x2x2` -> `v4-2x2x2`)."""
    chip = chip_of(generation)
    if generation in TOPOLOGIES or chip not in TOPOLOGIES:
        return generation if generation in TOPOLOGIES else chip
    return generation.replace(":", "-")
