"""Constructing a manager over caches whose contents are not there yet:
deferred computations, and host->device copies still landing."""

from __future__ import annotations

import kvref
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import CLEAN_REFUSALS, first_line
from probes.suite.verdicts import CORRUPT, ERROR, PASS, REJECTED, Outcome


def deferred_construction(case: Case, iut: Adapter) -> Outcome:
    """A manager over caches straight from DEFER_AND_FUSE must construct (the
    watchdog turns a hang into HANG) and leave the caches materialized."""
    caches = [iut.make_cache(case.shape, case.seed + i, mode="deferred")[0] for i in range(2)]
    try:
        manager = iut.manager(caches, 4)
    except CLEAN_REFUSALS as e:
        return Outcome(REJECTED, first_line(e))
    if not all(iut.is_materialized(c) for c in caches):
        return Outcome(ERROR, "constructed, but the caches are not materialized")
    return Outcome(PASS, "constructed over deferred caches", host_bytes=manager.host_bytes)


def host_transferred_construction(case: Case, iut: Adapter) -> Outcome:
    """Caches whose host->device copies are still landing: construction must
    wait for them, and the first blocks moved must be the landed bytes."""
    pairs = [iut.make_cache(case.shape, case.seed + i, mode="put", finite=True) for i in range(2)]
    caches = [c for c, _ in pairs]
    try:
        manager = iut.manager(caches, 4)
        iut.d2h(manager, [0, 1], [0, 1])
    except CLEAN_REFUSALS as e:
        return Outcome(REJECTED, first_line(e))
    for layer, (_, host) in enumerate(pairs):
        expected = kvref.pack(host, iut.layout(case.shape))
        block = manager.layer_bytes_per_block[layer]
        got = manager.read_block_bytes(layer, 1)
        if got != expected[block:2 * block].tobytes():
            return Outcome(CORRUPT, f"layer {layer}: block 1 moved before its host copy landed")
    return Outcome(PASS, "constructed over landing caches", host_bytes=manager.host_bytes)
