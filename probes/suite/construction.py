"""Constructing a manager over caches whose contents are not there yet:
deferred computations, and host->device copies still landing. Each probe
first checks that the caches really are pending at that moment, and says so
in its outcome; a probe with nothing pending earns no PASS."""

from __future__ import annotations

import kvref
from probes.iut.adapter import Adapter
from probes.iut.protocol import CacheMode, NoViews
from probes.suite.cases import Case
from probes.suite.refusals import refused
from probes.suite.roundtrip import permuted_round_trip
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

LAYERS = 2


def deferred_construction(case: Case, iut: Adapter) -> Outcome:
    """Caches whose contents are still being computed when the manager is
    built (DEFER_AND_FUSE on the simulated device and TorchTPU; a jitted
    computation still running on JAX): construction must not hang (the
    watchdog turns a hang into HANG), and every block must then round-trip
    byte-exact as the computation produced it."""
    pairs = iut.make_caches(case.shape, [case.seed + i for i in range(LAYERS)], mode=CacheMode.DEFERRED)
    caches, hosts = [c for c, _ in pairs], [h for _, h in pairs]
    ready = sum(not iut.is_pending(c) for c in caches)
    if ready:
        return Outcome(ERROR, f"nothing deferred: {ready} of {LAYERS} caches were already "
                       f"materialized when the manager was built ({iut.backend})",
                       pending_at_construction=False)
    try:
        manager = iut.manager(caches, case.shape.dims[0])
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, pending_at_construction=True)
    outcome = permuted_round_trip(iut, manager, caches, hosts, case.seed)
    outcome.pending_at_construction = True
    if outcome.verdict == PASS:
        outcome.detail = f"constructed over {LAYERS} pending caches; {outcome.detail}"
    return outcome


def host_transferred_construction(case: Case, iut: Adapter) -> Outcome:
    """Caches whose host->device copies are still landing when the manager is
    built: construction must wait for them, and the first blocks moved must
    be the landed bytes. Where the backend lands copies before handing the
    array back, there is nothing in flight to probe: SKIP."""
    pairs = iut.make_caches(case.shape, [case.seed + i for i in range(LAYERS)], mode=CacheMode.LANDING, finite=True)
    caches = [c for c, _ in pairs]
    landed = sum(not iut.is_pending(c) for c in caches)
    if landed:
        return Outcome(SKIP, f"{iut.backend}: {landed} of {LAYERS} host->device copies had landed "
                       "before the manager could be built, so none was in flight to probe",
                       pending_at_construction=False)
    try:
        manager = iut.manager(caches, 4)
        iut.d2h(manager, [0, 1], [0, 1])
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, pending_at_construction=True)
    for layer, (_, host) in enumerate(pairs):
        expected = kvref.pack(host, iut.layout(case.shape))
        block = manager.layer_bytes_per_block[layer]
        got = manager.read_block_bytes(layer, 1)
        if got != expected[block:2 * block].tobytes():
            return Outcome(CORRUPT, f"layer {layer}: block 1 moved before its host copy landed",
                           host_bytes=manager.host_bytes, pending_at_construction=True)
    return Outcome(PASS, f"constructed over {LAYERS} landing caches; blocks moved are the landed bytes",
                   host_bytes=manager.host_bytes, pending_at_construction=True)


def pending_views(case: Case, iut: Adapter) -> Outcome:
    """Layers that are views of one stacked cache (layer i is `stacked[i]`),
    still pending when the manager is built: a correct manager refuses them
    cleanly, or moves blocks so that the stacked cache itself holds them
    afterwards (read back through the stacked cache, not the views). SKIP on
    a backend without views."""
    try:
        pairs, read_stacked = iut.arrays.views(case.shape, [case.seed + i for i in range(LAYERS)])
    except NoViews as e:
        return Outcome(SKIP, str(e))
    caches, hosts = [c for c, _ in pairs], [h for _, h in pairs]
    ready = sum(not iut.is_pending(c) for c in caches)
    if ready:
        return Outcome(ERROR, f"nothing pending: {ready} of {LAYERS} views were already materialized "
                       f"when the manager was built ({iut.backend})", pending_at_construction=False)
    try:
        manager = iut.manager(caches, case.shape.dims[0])
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, pending_at_construction=True)
    outcome = permuted_round_trip(iut, manager, caches, hosts, case.seed, fetch=read_stacked)
    outcome.pending_at_construction = True
    return outcome
