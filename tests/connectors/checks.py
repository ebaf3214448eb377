"""Byte-for-byte checks of device blocks and host chunks against the
mirror, and the tally a case reports (counts, mismatches, exceptions, what
the connectors logged at WARNING and above)."""

from __future__ import annotations

import hashlib
import logging
import traceback
from dataclasses import dataclass, field

import numpy as np

from tests.connectors.engine import ZERO, Content, Mirror, ModelRunner

CONNECTOR_LOGGER = "vllm.tpu_inference"  # tpu_inference.logger prefixes every module's name with "vllm."
KEPT = 5  # first messages kept per kind


@dataclass
class Tally:
    connector: str
    shape: str
    counts: dict = field(default_factory=dict)
    transfers_checked: int = 0
    blocks_compared: int = 0
    mismatches: int = 0
    mismatch_details: list = field(default_factory=list)
    exceptions: list = field(default_factory=list)
    logged: list = field(default_factory=list)
    logged_count: int = 0
    logged_errors: int = 0
    aliasing: dict = field(default_factory=dict)
    at: str = "setup"  # where the case is: the step an exception came from

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def mismatch(self, text: str) -> None:
        self.mismatches += 1
        if len(self.mismatch_details) < KEPT:
            self.mismatch_details.append(text)

    def exception(self, e: BaseException, where: str = "") -> None:
        self.exceptions.append({"type": type(e).__name__, "message": str(e)[:2000], "where": where or self.at,
                                "traceback": traceback.format_exception(e)[-6:]})


class LogCapture(logging.Handler):
    """What the connectors log at WARNING and above (a save that failed, a
    failed pull), counted into the tally; never swallowed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.tally: Tally | None = None

    def emit(self, record):
        if self.tally is None:
            return
        self.tally.logged_count += 1
        if record.levelno >= logging.ERROR:
            self.tally.logged_errors += 1
        if len(self.tally.logged) < 3 * KEPT:
            self.tally.logged.append(f"{record.levelname} {record.name}: {record.getMessage()[:600]}")


def install_log_capture() -> LogCapture:
    handler = LogCapture()
    logger = logging.getLogger(CONNECTOR_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


class Describer:
    """Says what a row key was (which request's which token) and, for bytes
    that match no expectation, whose row they are if any."""

    def __init__(self, content: Content):
        self.content = content
        self.origin: dict[bytes, str] = {ZERO: "zeros (never written)"}

    def name(self, key: bytes, text: str) -> None:
        self.origin.setdefault(key, text)

    def found(self, row: np.ndarray, layer: int) -> str:
        if not row.any():
            return "zeros"
        digest = hashlib.sha1(row.tobytes()).digest()
        for (key, lay), value in list(self.content.known()):
            if hashlib.sha1(value.tobytes()).digest() == digest:
                said = self.origin.get(key, key.hex()[:12])
                return said if lay == layer else f"layer {lay}'s {said}"
        return "bytes of no row the engine wrote"


class DeviceCheck:
    """A runner's caches against a mirror, block by block, every layer."""

    def __init__(self, side: str, runner: ModelRunner, mirror: Mirror, content: Content, describer: Describer):
        self.side, self.runner, self.mirror, self.content, self.describe = side, runner, mirror, content, describer

    def check(self, tally: Tally, where: str, blocks=None, previous: dict | None = None) -> int:
        """Compares `blocks` (default: every block not in flux), every replica
        of each; returns the mismatching blocks."""
        data, replicas = self.runner.read()
        layout = self.content.layout
        wanted = range(1, len(self.mirror.blocks)) if blocks is None else blocks
        if blocks is None:
            wanted = [b for b in wanted if b not in self.mirror.in_flux and b not in self.mirror.tainted]
        wanted = list(wanted)
        bad = 0
        for layer, differing, device, first in replicas:
            checked = sorted(set(differing) & set(wanted))
            if checked:
                bad += len(checked)
                tally.mismatch(f"{where}: {self.side} replicas differ: layer {layer}: {device}'s copy of block "
                               f"{checked[0]} (and {len(checked) - 1} more) differs from {first}'s")
                self.mirror.tainted.update(checked)
                wanted = [b for b in wanted if b not in checked]
        for b in wanted:
            keys = self.mirror.blocks[b]
            tally.blocks_compared += 1
            for layer, array in enumerate(data):
                expected = self.content.block(keys, layer)
                if np.array_equal(array[b], expected):
                    continue
                bad += 1
                got_rows, want_rows = layout.rows_of(array[b][None])[0], layout.rows_of(expected[None])[0]
                rows = [r for r in range(layout.rows) if not np.array_equal(got_rows[r], want_rows[r])]
                row = rows[0]
                differing = np.count_nonzero(got_rows[row] != want_rows[row])
                parts = part_indices(self.runner.kv_caches[layer])
                wrong = [(index, devices) for index, devices in parts
                         if not np.array_equal(array[b][index], expected[index])]
                before = ""
                if previous and b in previous:  # what the block held before it was rewritten
                    old = self.content.block(previous[b], layer)
                    kept = sum(np.array_equal(array[b][index], old[index]) for index, _ in wrong)
                    before = f"; {kept} of the {len(wrong)} wrong parts hold what the block held before"
                tally.mismatch(f"{where}: {self.side} device block {b} layer {layer}: {len(rows)} of "
                               f"{layout.rows} rows differ, in {len(wrong)} of the block's {len(parts)} parts "
                               f"(devices {[d for _, d in wrong][:4]}){before}; row {row} ({differing} of "
                               f"{want_rows[row].size} elements): expected "
                               f"{self.describe.origin.get(keys[row], keys[row].hex()[:12])}, found "
                               f"{self.describe.found(got_rows[row], layer)}")
                self.mirror.tainted.add(b)  # said once: checked again only once wholly rewritten
                break
        return bad


def quiet_compare(runner: ModelRunner, mirror: Mirror, content: Content, blocks) -> list[int]:
    """The blocks among `blocks` whose device bytes (any layer, any replica)
    differ from the mirror now; tallies nothing."""
    data, replicas = runner.read()
    split = {b for _, differing, _, _ in replicas for b in differing}
    return [b for b in blocks
            if b in split or any(not np.array_equal(array[b], content.block(mirror.blocks[b], layer))
                                 for layer, array in enumerate(data))]


def part_indices(cache) -> list[tuple[tuple, list[str]]]:
    """The parts of a block of this cache: one per distinct placement of the
    non-block dimensions, ordered by where it starts (kvref.sharding's host
    slots), each with the devices holding it. Read from the sharding's index
    map: no per-device array is made."""
    parts: dict[tuple, tuple[tuple, list[str]]] = {}
    for device, index in cache.sharding.devices_indices_map(cache.shape).items():
        rest = tuple(index[1:])
        start = tuple(s.start or 0 for s in rest)
        parts.setdefault(start, (rest, []))[1].append(str(device))
    return [parts[s] for s in sorted(parts)]


def block_parts(cache, block: np.ndarray) -> list[bytes]:
    """A block's parts as a host block holds them, each the bytes of that part."""
    return [np.ascontiguousarray(block[index]).view(np.uint8).tobytes() for index, _ in part_indices(cache)]


class HostCheck:
    """Host chunks against the mirror, through the facade's
    reference.read_block_bytes (the library's host blocks, part by part);
    None where the library has no way to read them."""

    def __init__(self, manager, runner: ModelRunner, mirror: Mirror, content: Content, describer: Describer):
        self.reference = getattr(manager, "reference", None)
        self.runner, self.mirror, self.content, self.describe = runner, mirror, content, describer

    @property
    def available(self) -> bool:
        return self.reference is not None and hasattr(self.reference, "read_block_bytes")

    def check(self, tally: Tally, where: str, chunk: int, keys: list[bytes]) -> bool:
        ok = True
        for layer, cache in enumerate(self.runner.kv_caches):
            expected = block_parts(cache, self.content.block(keys, layer))
            for part, want in enumerate(expected):
                got = self.reference.read_block_bytes(layer, chunk, shard=part)
                if got != want:
                    tally.mismatch(f"{where}: host chunk {chunk} layer {layer} part {part} differs from the "
                                   f"block it should hold (first row: {self.describe.origin.get(keys[0], '?')})")
                    ok = False
                    break
            if not ok:
                break
        return ok
