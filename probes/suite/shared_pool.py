"""Two managers, in two processes, attaching one shared-memory host pool
(tpu-sync's enable_shm with RAIDEN_SHM_KEY): refused, or sharing one
allocator, never two allocators handing out the same memory; and no segment
left behind once both are closed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kvref.compat.tpu_sync import SHM_KEY_VARIABLE
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.pull_sides import LAYERS, PEER_WAIT_S, SHARDED, Side
from probes.suite.refusals import first_line
from probes.suite.sharded import no_mesh
from probes.suite.verdicts import CORRUPT, ERROR, PASS, Outcome

SEGMENTS = Path("/dev/shm")
SAVED = 16  # blocks each manager saves, into as many host chunks
LAYER_COUNT = min(2, LAYERS)


def shared_pool(case: Case, iut: Adapter) -> Outcome:
    """Two managers in two processes attach the pool under one
    shared-memory key, each over caches of its own (two layers, each split
    over four devices). The second may be refused, by name. If both attach,
    the first saves its blocks into the chunks its allocator hands out, then
    the second saves its own, then each restores its chunks into other
    blocks: each must get back its own bytes in every layer and part (a
    chunk handed out by two allocators holds the other's bytes). Once both
    are closed no segment named after the key may remain in /dev/shm."""
    if iut.sharded_arrays() is None:
        return no_mesh(iut)
    key = Path(case.rendezvous).name  # unique to the case, the same on both sides
    os.environ[SHM_KEY_VARIABLE] = key
    side = Side(case, iut, None, keys=(SHARDED[0],) * LAYER_COUNT, sharding=SHARDED[1])
    rendezvous = side.rendezvous
    manager = None
    try:
        side.make_caches()
        if not side.producer:
            rendezvous.wait("attached", PEER_WAIT_S)
        try:
            manager = iut.manager(side.caches, SAVED, enable_shm=True)
        except Exception as e:
            if side.producer or not iut.refuses(e):
                return Outcome(ERROR, f"attaching the pool {key!r} {'first' if side.producer else 'second'}: "
                               f"{first_line(e)}")
            rendezvous.post("refused")
            rendezvous.wait("closed", PEER_WAIT_S)
            return _segments_left(key, f"the second manager was refused ({first_line(e)})")
        if side.producer:
            rendezvous.post("attached")
        else:
            rendezvous.wait("saved", PEER_WAIT_S)
        chunks, pending = iut.save(manager, list(range(SAVED)))
        pending.wait()
        rendezvous.post("saved")
        if side.producer:  # the second's save, or its refusal (then nothing of its to see)
            rendezvous.first("saved", "refused", seconds=PEER_WAIT_S)
        iut.transfer(manager, False, chunks, list(range(SAVED, 2 * SAVED)))
        wrong = _restored_wrong(side)
        del manager
        manager = None
        rendezvous.post("closed")
        if wrong:
            return Outcome(CORRUPT, f"{'first' if side.producer else 'second'} manager on the pool {key!r}: {wrong}")
        if side.producer:
            return Outcome(PASS, f"restored its own bytes from chunks {chunks[0]}..{chunks[-1]}")
        rendezvous.wait("closed", PEER_WAIT_S)
        return _segments_left(key, "both attached; each restored its own bytes")
    finally:
        manager = None
        side.close()


def _restored_wrong(side: Side) -> str:
    """"" when blocks SAVED..2*SAVED hold blocks 0..SAVED of this side's own contents."""
    for layer in range(len(side.caches)):
        got, own = side.contents(layer), side.expected(layer, side.seed)
        restored = np.ascontiguousarray(got[SAVED:2 * SAVED]).view(np.uint8)
        if not np.array_equal(restored, np.ascontiguousarray(own[:SAVED]).view(np.uint8)):
            return f"layer {layer}: the blocks restored from its chunks are not the blocks it saved"
    return ""


def _segments_left(key: str, what: str) -> Outcome:
    """Once both managers are closed: segments named after the key (removed here, so runs do not pile up)."""
    left = sorted(p.name for p in SEGMENTS.glob(f"*{key}*"))
    for name in left:
        (SEGMENTS / name).unlink(missing_ok=True)
    if left:
        return Outcome(ERROR, f"{what}, but with both managers closed /dev/shm still holds {', '.join(left)}")
    return Outcome(PASS, f"{what}; no segment left in /dev/shm")
