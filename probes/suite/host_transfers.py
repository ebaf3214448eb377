"""Host-to-host transfers between two managers' host pools (tpu-sync's
h2h_read and h2h_write), as a serving stack moves saved blocks between
hosts without a device. The producer worker listens; the consumer reads
from it ("read") or writes into it ("write"). The side whose chunks were
written judges the bytes, through its own device: each chunk is loaded
(h2d) into a device block and the caches are read back."""

from __future__ import annotations

import numpy as np

from probes.iut.adapter import Adapter
from probes.iut.protocol import HostTransferLibrary
from probes.suite.cases import Case
from probes.suite.pull_sides import PEER_WAIT_S, PULL_TIMEOUT_S, Side
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

HOST_KINDS = ("read", "write")
HOST_BLOCKS = 64  # each manager's host pool
MOVED = 24  # host blocks one transfer moves


def host_to_host(case: Case, iut: Adapter) -> Outcome:
    """The consumer reads MOVED of the producer's host blocks into chunks of
    its own (h2h_read), or writes MOVED of its own into chunks the producer
    takes (h2h_write). Both pools were used before (every chunk saved, then
    unlocked in a shuffled order), so the chunks a transfer takes are not
    in order. The chunk ids it reports must be distinct and in the pool,
    chunk i holding block i in every layer; the chunks written stay locked
    (the written side's saves, one block at a time until refused, take only
    the other chunks); and each chunk loaded onto the device holds its
    block, every other device block its own bytes."""
    lib = iut.library if isinstance(iut.library, HostTransferLibrary) else None
    if lib is None:
        return Outcome(SKIP, f"{iut.name}'s managers do not move host blocks to one another (its library has "
                       "no probes.iut.protocol.HostTransferLibrary)")
    side = Side(case, iut, lib)
    rng = np.random.default_rng(case.seed)
    blocks = rng.choice(HOST_BLOCKS, MOVED, replace=False).tolist()  # the side read from's host blocks
    targets = rng.choice(side.key.dims[0], MOVED, replace=False).tolist()  # device blocks the chunks load into
    try:
        side.make_caches()
        side.manager = lib.host_manager(side.caches, side.producer, PULL_TIMEOUT_S, HOST_BLOCKS)
        # The side read from: host block b holds its device block b.
        source = side.producer == (case.kind == "read")
        if source:
            lib.host_copy(side.manager, True, [0], [0], [HOST_BLOCKS])
        else:
            _use_every_chunk(lib, side.manager, rng)
        if side.producer:
            side.rendezvous.post("listening", side.manager.get_local_endpoints())
            if case.kind == "read":
                side.rendezvous.wait("finished", PEER_WAIT_S)
                return Outcome(PASS, f"served a read of {MOVED} host blocks")
            chunks = side.rendezvous.wait("written", PEER_WAIT_S)
            return _judge(side, lib, chunks, blocks, targets, "h2h_write")
        peer = side.rendezvous.wait("listening", PEER_WAIT_S)[0]["endpoint"]
        try:
            if case.kind == "read":
                chunks, pending = lib.host_read(side.manager, peer, blocks)
                pending.wait()
                return _judge(side, lib, chunks, blocks, targets, "h2h_read")
            chunks, pending = lib.host_write(side.manager, peer, blocks)
            pending.wait()
            side.rendezvous.post("written", [int(c) for c in chunks])
            return Outcome(PASS, f"wrote {MOVED} host blocks to the producer")
        finally:
            side.rendezvous.post("finished")
    finally:
        side.close()


def _use_every_chunk(lib: HostTransferLibrary, manager, rng) -> None:
    """Save into every chunk of the pool, then unlock them in a shuffled order."""
    chunks, pending = lib.host_save(manager, list(range(HOST_BLOCKS)))
    pending.wait()
    lib.host_unlock(manager, rng.permutation(chunks).tolist())


def _judge(side: Side, lib: HostTransferLibrary, chunks: list[int], blocks: list[int], targets: list[int],
           call: str) -> Outcome:
    """The written side: the chunk ids, that they stay locked, and their bytes on the device."""
    if len(chunks) != MOVED or len(set(chunks)) != MOVED or not all(0 <= c < HOST_BLOCKS for c in chunks):
        return Outcome(ERROR, f"{call} of {MOVED} blocks reported chunk ids {chunks}: expected {MOVED} distinct "
                       f"ids in [0, {HOST_BLOCKS})")
    taken = _save_until_refused(side, lib)
    if isinstance(taken, Outcome):
        return taken
    overlap = sorted(set(taken) & set(chunks))
    if overlap:
        return Outcome(CORRUPT, f"saves after {call} took chunks {overlap[:8]} it had written and not yet "
                       "unlocked: their blocks were overwritten before anyone used them")
    if len(taken) != HOST_BLOCKS - MOVED:
        return Outcome(ERROR, f"after {call} locked {MOVED} of {HOST_BLOCKS} chunks, saves took {len(taken)} "
                       f"before the pool refused one (expected the {HOST_BLOCKS - MOVED} others)")
    lib.host_copy(side.manager, False, chunks, targets, [1] * MOVED)
    wrong = side.check_blocks(list(zip(blocks, targets)))
    if wrong:
        return Outcome(CORRUPT, f"{call}'s chunks, loaded onto the device: {wrong}")
    lib.host_unlock(side.manager, chunks + taken)
    return Outcome(PASS, f"{call} landed {MOVED} blocks in the chunks it reported, every layer, and they stayed "
                   "locked until unlocked")


def _save_until_refused(side: Side, lib: HostTransferLibrary) -> list[int] | Outcome:
    """Save one device block at a time until the pool refuses one (at most one more than it has chunks)."""
    taken = []
    for block in range(HOST_BLOCKS + 1):
        try:
            chunks, pending = lib.host_save(side.manager, [block])
        except Exception as e:
            if side.lib.refuses(e):
                return taken
            return Outcome(ERROR, f"a save after the transfer failed: {type(e).__name__}: {e}")
        pending.wait()
        taken += chunks
    return Outcome(ERROR, f"{HOST_BLOCKS + 1} saves of one block each all went through a pool of {HOST_BLOCKS} "
                   "chunks")
