"""The host slots a pull's blocks pass through on their way off or onto the
device: `slots` slots of `slot_blocks` blocks each, in a host pool of their
own beside the offload pool, so a pull never takes a chunk the offload
connector counts on. A pull of more blocks than one slot holds goes through
in pieces; each piece holds one slot while it is copied."""

from __future__ import annotations

import operator
import queue
import time
from typing import Callable

import numpy as np

from kvref import _core
from kvref.futures import TransferFuture
from kvref.polling import wait_for

STILL_POLL_SECONDS = 0.001  # between looks at caches a step holds

Parts = dict[tuple[int, int, int], bytes]  # (layer, part, position in the pull) -> one part of one block


class SlotWaitTimeout(TimeoutError):
    """Every slot stayed busy until the pull's deadline."""


class Staging:
    def __init__(self, mover: Callable, still: Callable, slots: int, slot_blocks: int,
                 layer_parts: tuple[int, ...]):
        """`mover()`: the staging BlockMover now (it is replaced when a cache's
        storage moves); `still()`: the arrays that hold the caches now, once
        moved storage is re-addressed, or None while a step holds one of them.
        Both are the manager's, held weakly by the caller (kvref.pulls), so
        a manager dropped mid-pull can still be collected."""
        self._mover, self._still = mover, still
        self.slots, self.slot_blocks, self.layer_parts = slots, slot_blocks, layer_parts
        self._free: queue.Queue[int] = queue.Queue()
        for slot in range(slots):
            self._free.put(slot)

    def read(self, block_ids: list[int], parts: list[int] | None, deadline: float):
        """Yield ((layer, part, position), bytes of a run of blocks) for every
        layer, each part in `parts` (None: all) and the device blocks in
        `block_ids` from `position` on, a slot's worth at a time."""
        for start, piece, base in self._pieces(block_ids, deadline):
            try:
                self._copy(_core.Direction.DEVICE_TO_HOST, piece, base, deadline)
                mover = self._mover()
                for layer, count in enumerate(self.layer_parts):
                    for part in (range(count) if parts is None else parts):
                        yield (layer, part, start), b"".join(mover.read_host_block(layer, part, base + j)
                                                             for j in range(len(piece)))
            finally:
                self._release(base)

    def write(self, block_ids: list[int], received: Parts, parts: list[int] | None, deadline: float,
              layers: list[int] | None = None) -> None:
        """Put `received` ((layer, part, position) -> one block's bytes) into
        device blocks `block_ids`, of `layers` (None: all) and `parts` (None: all)."""
        for start, piece, base in self._pieces(block_ids, deadline):
            try:
                mover = self._mover()
                for layer, count in enumerate(self.layer_parts):
                    if layers is not None and layer not in layers:
                        continue
                    for part in (range(count) if parts is None else parts):
                        for j in range(len(piece)):
                            data = np.frombuffer(received[layer, part, start + j], np.uint8)
                            mover.write_host_block(layer, part, base + j, data)
                self._copy(_core.Direction.HOST_TO_DEVICE, piece, base, deadline)
            finally:
                self._release(base)

    def _pieces(self, block_ids: list[int], deadline: float):
        """(position of the piece's first block, its blocks, its slot's first host block), a slot held each."""
        for start in range(0, len(block_ids), self.slot_blocks):
            yield start, block_ids[start:start + self.slot_blocks], self._take(deadline) * self.slot_blocks

    def _take(self, deadline: float) -> int:
        try:
            return self._free.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise SlotWaitTimeout(f"all {self.slots} pull slots stayed busy until the deadline") from None

    def _release(self, base: int) -> None:
        self._free.put(base // self.slot_blocks)

    def _copy(self, direction: _core.Direction, piece: list[int], base: int, deadline: float) -> None:
        """Copy while no step holds the caches, from start to end.

        A pull copies from its own thread, which the serving thread's steps do
        not wait for: a JAX CPU step copies the whole cache through itself, so
        a copy made while a step holds the caches may be undone when the step
        writes back what it read. So a copy counts only when the same arrays,
        each live and ready, hold the caches before and after it; otherwise it
        is made again once they are. (A step run inline on the dispatching
        thread shows only once it has ended: kvref.pulls reads a landed pull
        back before reporting it. A simulated step dispatched between the look
        and the copy still computes the caches: the copy cannot be made then,
        and is made again in the same way.)"""
        device = np.asarray(piece, dtype=np.int64)
        host = np.arange(base, base + len(piece), dtype=np.int64)
        src, dst = (device, host) if direction == _core.Direction.DEVICE_TO_HOST else (host, device)

        def copied_while_still() -> bool:
            before = None if time.monotonic() > deadline else self._still()
            if before is None:
                return False
            try:
                core = self._mover().copy(direction, src, dst, np.ones_like(device))
            except _core.BufferNotReady:  # a simulated step, dispatched since the look, computes them now
                return False
            TransferFuture(core).result(timeout=max(0.001, deadline - time.monotonic()))
            after = self._still()
            return after is not None and len(after) == len(before) and all(map(operator.is_, after, before))

        if not wait_for(copied_while_still, max(0.0, deadline - time.monotonic()), STILL_POLL_SECONDS):
            raise TimeoutError("the caches were not still for a whole copy of the pull's blocks until its "
                               "timeout: a step held them each time, or took them and no poll_stats came "
                               "since to re-address them")
