"""A consumer's telemetry of its pulls (`dump_metrics_to_string()`, the
wrapper's: a JSON array, one object per pull), read after pulls that landed.
A serving fleet's dashboards and transfer alarms are built on it."""

from __future__ import annotations

import json
import time

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.pull_sides import (PEER_WAIT_S, PULL_TIMEOUT_S, SETTLE_GRACE_S, SUBJECT, Side, endpoint_for, no_pulls,
                                     poll, pull_library, uuid_of)
from probes.suite.pulls import HALF_HEADS, SUBSET, pairs_for, produce
from probes.suite.verdicts import ERROR, PASS, SKIP, Outcome

TELEMETRY_KINDS = ("sizes", "stages", "uuid_slots", "req_id_text")
SLOT_SPAN = 1024  # uuid_slots: uuids this far apart (a table of that many slots keyed by uuid puts them in one)
REQ_ID_TEXT = 'req "quoted" \\ back\u00e9'  # req_id_text: what JSON escapes, and a character beyond ASCII
STAGES = ("connection_setup_us", "network_transit_us", "staging_queue_us", "h2d_copy_us")
END_TO_END = "e2e_duration_us"
SLACK_US = 1000  # stages measured by separate clock readings may each round past the whole


def requests_for(case: Case) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """(request, uuid, pairs) of the kind's pulls: two of different sizes into disjoint blocks."""
    first = pairs_for(case, SUBJECT.dims[0], SUBSET)
    second = pairs_for(case, SUBJECT.dims[0], SUBSET // 2, avoid=[l for _, l in first])
    uuids = [uuid_of(case), uuid_of(case) + SLOT_SPAN] if case.kind == "uuid_slots" else \
        [uuid_of(case), uuid_of(case, 1)]
    names = [REQ_ID_TEXT, "req-1"] if case.kind == "req_id_text" else ["req-0", "req-1"]
    return list(zip(names, uuids, [first, second]))


def pull_telemetry(case: Case, iut: Adapter) -> Outcome:
    """Two pulls land on the consumer (layers of two block sizes; in
    uuid_slots their uuids 1024 apart, in req_id_text one request id with a
    quote, a backslash and a character beyond ASCII); then its
    dump_metrics_to_string() must parse as JSON and hold one object for
    each pull with its uuid and req_id as given; in sizes, its num_blocks
    and total_bytes of every layer's block bytes; in stages, each stage a
    non-negative number of microseconds within e2e_duration_us, or null
    for one not reached."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib, keys=(SUBJECT, HALF_HEADS) * 2)
    requests = requests_for(case)
    try:
        side.build()
        if side.producer:
            return produce(side, [(req, uuid, [r for r, _ in pairs]) for req, uuid, pairs in requests])
        if not callable(getattr(side.manager, "dump_metrics_to_string", None)):
            side.rendezvous.post("finished")
            return Outcome(SKIP, f"{iut.name}'s manager has no dump_metrics_to_string")
        endpoints = side.rendezvous.wait("registered", PEER_WAIT_S)
        try:
            started = time.monotonic()
            for req, uuid, pairs in requests:
                side.manager.start_read(req, uuid, endpoint_for(endpoints), [r for r, _ in pairs],
                                        [l for _, l in pairs])
            names = [req for req, _, _ in requests]
            settled = poll(side.manager, started, lambda s: all(s.state(r) != "unsettled" for r in names),
                           PULL_TIMEOUT_S + SETTLE_GRACE_S)
        finally:
            side.rendezvous.post("finished")
        unsettled = {r: settled.state(r) for r in names if settled.state(r) != "done"}
        if unsettled:
            return Outcome(ERROR, f"the pulls telemetry is read after ended {unsettled}, not done")
        return _judge(case.kind, side.manager.dump_metrics_to_string(), requests, side)
    finally:
        side.close()


def _judge(kind: str, text: str, requests, side: Side) -> Outcome:
    records = records_in(text)
    if isinstance(records, str):
        return Outcome(ERROR, records)
    for req, uuid, pairs in requests:
        mine = [r for r in records if r.get("uuid") == uuid]
        if len(mine) != 1:
            return Outcome(ERROR, f"{len(mine)} records of the pull under uuid {uuid} (request {req!r}); expected "
                           f"one, among {len(records)}: uuids {[r.get('uuid') for r in records][:8]}")
        sizes = (len(pairs), side.pull_bytes(len(pairs))) if kind == "sizes" else None
        problem = record_problem(mine[0], req, sizes, stages=kind == "stages")
        if problem:
            return Outcome(ERROR, f"the record of uuid {uuid}: {problem}")
    held = {"sizes": ", blocks and bytes", "stages": ", and stages within the whole"}.get(kind, "")
    return Outcome(PASS, f"{len(requests)} pulls, one record each, with their uuid and req_id{held}")


def records_in(text: str) -> list[dict] | str:
    """The records of dump_metrics_to_string()'s text, or what is wrong with it."""
    try:
        records = json.loads(text)
    except ValueError as e:
        return f"dump_metrics_to_string() is not JSON ({e}): {text[:160]!r}"
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        return f"dump_metrics_to_string() is not an array of objects: {text[:160]!r}"
    return records


def record_problem(record: dict, req: str, sizes: tuple[int, int] | None, stages: bool) -> str:
    """What is wrong with the record of a pull that landed: its req_id, its
    (num_blocks, total_bytes) where `sizes` is given, its stages where
    `stages`; "" if nothing."""
    want = {"req_id": req} | ({"num_blocks": sizes[0], "total_bytes": sizes[1]} if sizes else {})
    wrong = {key: record.get(key) for key, value in want.items() if record.get(key) != value}
    if wrong:
        return f"it says {wrong}; the pull was {want}"
    return _stage_problem(record) if stages else ""


def _stage_problem(record: dict) -> str:
    whole = record.get(END_TO_END)
    if not _micros(whole):
        return f"{END_TO_END} is {whole!r}; expected a positive number of microseconds for a pull that landed"
    for stage in STAGES:
        value = record.get(stage)
        if value is not None and not (_micros(value) is not None and value <= whole + SLACK_US):
            return f"{stage} is {value!r}; expected null or 0 to {END_TO_END} ({whole}) microseconds"
    return ""


def _micros(value) -> float | None:
    """`value` if it is a non-negative number (bool is not), else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    return value if ok else None
