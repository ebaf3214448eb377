"""Pulls among more than two managers, as a disaggregated fleet makes them:
one producer's blocks to several consumers (a registration each), one
consumer pulling from several producers at once, and a registration that
settled with one consumer refused to the next. A worker runs each side's
managers (Side.another), so the probe stays a producer and a consumer worker."""

from __future__ import annotations

import time

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.pull_sides import (FAILING_TIMEOUT_S, PEER_WAIT_S, PULL_TIMEOUT_S, SETTLE_GRACE_S, Side,
                                     endpoint_for, no_pulls, poll, pull_library, uuid_of)
from probes.suite.pulls import SUBSET, pairs_for, produce
from probes.suite.verdicts import CORRUPT, ERROR, PASS, Outcome

FAN_KINDS = ("fan_out", "fan_in", "settled_once")
FANS = 2  # consumers of one producer (fan_out), producers of one consumer (fan_in)


def pull_fan(case: Case, iut: Adapter) -> Outcome:
    """fan_out: one producer registers the same blocks for FANS consumer
    managers, one request each, and both pull at once: each must land its
    own pairing exactly, reported done once, and the producer tell each
    request done sending once. fan_in: one consumer pulls from FANS
    producer managers at once (other contents, other blocks), a request
    each: every local block must hold the block of the producer it was
    pulled from. settled_once: a second consumer pulls a registration that
    already settled with the first (its blocks are the producer's to reuse
    again): that pull must fail and write nothing, and the producer tell
    the request done sending once."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    sides = [Side(case, iut, lib)]
    sides.append(sides[0].another())
    try:
        return _FLOWS[case.kind][0 if sides[0].producer else 1](sides)
    finally:
        for side in sides[:0:-1]:
            side.drop()
        sides[0].close()


def _fan_out_producer(sides: list[Side]) -> Outcome:
    side = sides[0]
    side.build()
    blocks = [r for r, _ in pairs_for(side.case, side.layer_keys[0].dims[0], SUBSET)]
    return produce(side, [(f"req-{n}", uuid_of(side.case, n), blocks) for n in range(FANS)])


def _fan_out_consumer(sides: list[Side]) -> Outcome:
    """Each consumer pulls the registered blocks into its own pairing."""
    pairs = pairs_for(sides[0].case, sides[0].layer_keys[0].dims[0], SUBSET)
    remote, local = [r for r, _ in pairs], [l for _, l in pairs]
    pairings = [list(zip(remote, local[n:] + local[:n])) for n in range(FANS)]  # another pairing each
    for side in sides:
        side.build()
    endpoints = sides[0].rendezvous.wait("registered", PEER_WAIT_S)
    try:
        started = time.monotonic()
        for n, (side, pairs) in enumerate(zip(sides, pairings)):
            side.manager.start_read(f"req-{n}", uuid_of(side.case, n), endpoint_for(endpoints),
                                    [r for r, _ in pairs], [l for _, l in pairs])
        settled = [poll(side.manager, started, lambda s, n=n: s.state(f"req-{n}") != "unsettled",
                        PULL_TIMEOUT_S + SETTLE_GRACE_S) for n, side in enumerate(sides)]
    finally:
        sides[0].rendezvous.post("finished")
    for n, (side, pairs, seen) in enumerate(zip(sides, pairings, settled)):
        problem = _one_done(side, seen, f"req-{n}", f"consumer manager {n}")
        if problem:
            return Outcome(ERROR, problem)
        wrong = side.check_blocks(pairs)
        if wrong:
            return Outcome(CORRUPT, f"consumer manager {n}, after its pull reported done: {wrong}")
    return Outcome(PASS, f"{FANS} consumers pulled one producer's {len(remote)} blocks, a request each, "
                   "each landing its own pairing exactly, reported once")


def _fan_in_requests(side: Side) -> list[tuple[int, list[tuple[int, int]]]]:
    """(producer manager, its pairs) of each request: other remote blocks of
    each producer, into disjoint local blocks."""
    blocks = side.layer_keys[0].dims[0]
    taken: list[int] = []
    requests = []
    for n in range(FANS):
        pairs = pairs_for(side.case, blocks, SUBSET // FANS, avoid=taken)
        requests.append((n, pairs))
        taken += [l for _, l in pairs]
    return requests


def _fan_in_producer(sides: list[Side]) -> Outcome:
    requests = _fan_in_requests(sides[0])
    for side in sides:
        side.build()
    for n, pairs in requests:
        if not sides[n].manager.register_read(f"req-{n}", uuid_of(sides[n].case, n), [r for r, _ in pairs]):
            return Outcome(ERROR, f"producer manager {n}: register_read said nothing needs to be transferred")
    sides[0].rendezvous.post("registered", [side.manager.get_local_endpoints() for side in sides])
    sides[0].rendezvous.wait("finished", PEER_WAIT_S)
    for n, side in enumerate(sides):
        told = poll(side.manager, time.monotonic(), lambda s, n=n: f"req-{n}" in s.sent, SETTLE_GRACE_S)
        if f"req-{n}" not in told.sent or told.twice:
            return Outcome(ERROR, f"producer manager {n}: done_sending "
                           + ("never reported req-{n}" if f"req-{n}" not in told.sent
                              else f"reported {sorted(set(told.twice))} more than once"))
    return Outcome(PASS, f"{FANS} producers each reported their request done sending once")


def _fan_in_consumer(sides: list[Side]) -> Outcome:
    """One consumer manager pulls from every producer at once."""
    side = sides[0]
    requests = _fan_in_requests(side)
    side.build()
    endpoints = side.rendezvous.wait("registered", PEER_WAIT_S)
    try:
        started = time.monotonic()
        for n, pairs in requests:
            side.manager.start_read(f"req-{n}", uuid_of(side.case, n), endpoint_for(endpoints[n]),
                                    [r for r, _ in pairs], [l for _, l in pairs])
        names = [f"req-{n}" for n, _ in requests]
        settled = poll(side.manager, started, lambda s: all(s.state(r) != "unsettled" for r in names),
                       PULL_TIMEOUT_S + SETTLE_GRACE_S)
    finally:
        side.rendezvous.post("finished")
    for name in names:
        problem = _one_done(side, settled, name, "the consumer")
        if problem:
            return Outcome(ERROR, problem)
    wrong = side.check_landed({l: (Side.seed_of(True, n), r) for n, pairs in requests for r, l in pairs})
    if wrong:
        return Outcome(CORRUPT, f"after pulls from {FANS} producers reported done: {wrong}")
    return Outcome(PASS, f"one consumer pulled from {FANS} producers at once, each block from its own producer")


def _settled_once_producer(sides: list[Side]) -> Outcome:
    side = sides[0]
    side.build()
    blocks = [r for r, _ in pairs_for(side.case, side.layer_keys[0].dims[0], SUBSET)]
    return produce(side, [("req-0", uuid_of(side.case), blocks)])


def _settled_once_consumer(sides: list[Side]) -> Outcome:
    """The first consumer's pull lands; then the second's, of the same
    registration, must fail and leave its blocks as they were."""
    first, second = sides
    pairs = pairs_for(first.case, first.layer_keys[0].dims[0], SUBSET)
    first.build()
    second.build(timeout_s=FAILING_TIMEOUT_S)
    endpoints = first.rendezvous.wait("registered", PEER_WAIT_S)
    try:
        started = time.monotonic()
        first.manager.start_read("req-0", uuid_of(first.case), endpoint_for(endpoints), [r for r, _ in pairs],
                                 [l for _, l in pairs])
        settled = poll(first.manager, started, lambda s: s.state("req-0") != "unsettled",
                       PULL_TIMEOUT_S + SETTLE_GRACE_S)
        problem = _one_done(first, settled, "req-0", "the first consumer")
        if problem:
            return Outcome(ERROR, problem)
        # Done on the consumer's side: the producer hears it at once, or within its timeout_s.
        time.sleep(SETTLE_GRACE_S)
        started = time.monotonic()
        second.manager.start_read("req-0", uuid_of(second.case), endpoint_for(endpoints), [r for r, _ in pairs],
                                  [l for _, l in pairs])
        again = poll(second.manager, started, lambda s: s.state("req-0") != "unsettled",
                     FAILING_TIMEOUT_S + SETTLE_GRACE_S)
    finally:
        first.rendezvous.post("finished")
    wrong = first.check_blocks(pairs)
    if wrong:
        return Outcome(CORRUPT, f"the first consumer, after its pull reported done: {wrong}")
    if again.state("req-0") != "failed" or again.twice:
        return Outcome(ERROR, f"a second consumer's pull of a registration that had settled ended "
                       f"{again.state('req-0')}" + (" and was reported twice" if again.twice else "")
                       + "; it must fail: the producer may reuse those blocks once it is done sending")
    wrong = second.unchanged()
    if wrong:
        return Outcome(CORRUPT, f"the second consumer's refused pull wrote its blocks: {wrong}")
    return Outcome(PASS, "a registration settled with one consumer was refused to the next, which kept its blocks")


def _one_done(side: Side, settled, name: str, who: str) -> str:
    """"" when `name` was reported done, once; else what happened instead."""
    if settled.state(name) != "done":
        reason = side.lib.pull_failure(side.manager, name) if settled.state(name) == "failed" else ""
        return (f"{who}: request {name} ended {settled.state(name)} (expected done within timeout_s="
                f"{PULL_TIMEOUT_S}s + {SETTLE_GRACE_S}s)" + (f": {reason}" if reason else ""))
    if settled.twice:
        return f"{who}: poll_stats reported {sorted(set(settled.twice))} more than once"
    return ""


_FLOWS = {"fan_out": (_fan_out_producer, _fan_out_consumer), "fan_in": (_fan_in_producer, _fan_in_consumer),
          "settled_once": (_settled_once_producer, _settled_once_consumer)}
assert tuple(_FLOWS) == FAN_KINDS
