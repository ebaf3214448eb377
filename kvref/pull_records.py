"""What a consumer records of each pull it started, for telemetry: the
request, its blocks and bytes, and when each stage ended. The records are
dumped as a JSON array in the order the pulls started, one object per pull
(tpu-sync-jax's `dump_metrics_to_string` keys), the newest MAX_RECORDS kept.

Stages, in microseconds from the pull's start: connection_setup_us (the
producer's first answer), network_transit_us (its first answer to its last
byte), staging_queue_us (the last byte to the write into the caches
starting), h2d_copy_us (the write), e2e_duration_us (start to settled). A
stage the pull never reached is null. nic_wire_bandwidth_gbps is empty: the
reference reads no NIC counters."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from kvref.faults import Faults

MAX_RECORDS = 1024


@dataclass
class PullRecord:
    uuid: int
    req_id: str
    num_blocks: int
    total_bytes: int  # every layer's and part's bytes of its blocks
    started: float  # time.monotonic() of each stage
    connected: float | None = None
    last_byte: float | None = None
    writing: float | None = None
    written: float | None = None
    settled: float | None = None

    def stamp(self, stage: str) -> None:
        """`stage` ended now (the first time only: parallel streams each reach it)."""
        if getattr(self, stage) is None:
            setattr(self, stage, time.monotonic())

    def as_dict(self, last_byte_unset: bool = False) -> dict:
        """The record's object; `last_byte_unset` (a fault model): transit
        measured to a last byte that was never stamped."""
        last_byte = 0.0 if last_byte_unset else self.last_byte
        return {"uuid": self.uuid, "req_id": self.req_id, "num_blocks": self.num_blocks,
                "total_bytes": self.total_bytes,
                "connection_setup_us": _micros(self.started, self.connected),
                "network_transit_us": _micros(self.connected, last_byte),
                "staging_queue_us": _micros(self.last_byte, self.writing),
                "h2d_copy_us": _micros(self.writing, self.written),
                "e2e_duration_us": _micros(self.started, self.settled),
                "nic_wire_bandwidth_gbps": {}}


def _micros(start: float | None, end: float | None) -> int | None:
    return None if start is None or end is None else round((end - start) * 1e6)


class PullRecords:
    def __init__(self, faults: Faults):
        self._faults = faults
        self._lock = threading.Lock()
        self._records: OrderedDict[object, PullRecord] = OrderedDict()
        self._started = 0

    def add(self, record: PullRecord) -> None:
        with self._lock:
            self._started += 1
            # metrics_by_uuid_slot: a slot per uuid % MAX_RECORDS, a later pull taking an earlier one's
            key = record.uuid % MAX_RECORDS if self._faults.metrics_by_uuid_slot else self._started
            self._records.pop(key, None)
            self._records[key] = record
            while len(self._records) > MAX_RECORDS:
                self._records.popitem(last=False)

    def dump(self) -> str:
        """Every record kept, oldest first, as a JSON array."""
        with self._lock:
            records = [r.as_dict(self._faults.metrics_last_byte_unset) for r in self._records.values()]
        if self._faults.metrics_json_unescaped:  # each object written by hand, the request id as given
            return "[" + ",".join(json.dumps(r).replace(json.dumps(r["req_id"]), f'"{r["req_id"]}"', 1)
                                  for r in records) + "]"
        return json.dumps(records)
