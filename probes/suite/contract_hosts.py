"""Host-to-host transfers in the contract (kvref.host_transfers states the
rules the host_to_host probe checks): two managers with host pools of
their own, each listening, save device blocks into their pools, read
host blocks from the other's pool into chunks they lock (h2h_read), and
write their own host blocks into chunks the other locks (h2h_write). In a
sequence both live in the worker beside the offload manager, over caches
of their own, each with a contract model of its own (its device and host
blocks, its locked chunks).

What holds: a transfer of host blocks in the pool that hold bytes (a
transfer of blocks never written is not drawn: a manager may refuse it, or
fail it at the peer) into as many free chunks
as the receiving side has lands exactly (block i into the i-th chunk
reported), and those chunks are locked until unlocked (no save takes
them); one naming a block outside the pool, a block twice, or more blocks
than the receiving side has free chunks is refused and changes nothing.
The receiving side's chunks are judged through its own device: loaded
(h2d) into device blocks, and every device block compared."""

from __future__ import annotations

from dataclasses import dataclass

from probes.iut.protocol import HostTransferLibrary
from probes.suite.block_model import BlockModel
from probes.suite.contract import ContractModel, Judgment, Must
from probes.suite.contract_rules import REFUSED, Broken, Session, check_handed_out, exported, judged, landed
from probes.suite.verdicts import CORRUPT, ERROR

HOST_BLOCKS = 8  # each side's pool: small, so transfers meet a full one
TIMEOUT_S = 10.0
MOST = 4  # the most blocks one drawn transfer moves


@dataclass
class HostWorld:
    lib: HostTransferLibrary
    managers: list
    caches: list[list]
    models: list[ContractModel]
    endpoints: list[str]


def world(session: Session) -> HostWorld:
    """The session's two host managers, built at the first host rule."""
    if session.hosts is None:
        lib = session.iut.library
        caches, models, managers = [], [], []
        for side in (0, 1):
            own, blocks = session.own_caches(session.key, session.spec.get("seed", 0) + 1000 * (side + 1))
            caches.append(own)
            models.append(ContractModel(BlockModel(blocks, host_blocks=HOST_BLOCKS, zeroed_pool=False)))
            try:
                managers.append(lib.host_manager(own, True, TIMEOUT_S, HOST_BLOCKS))
            except Exception as e:  # these caches are addressable: building the manager must work
                raise Broken(ERROR, f"a host manager could not be built: {type(e).__name__}: {e}") from e
            session.closers.append(lambda m=managers[-1]: lib.close_manager(m))
            exported(session, lambda e: e.pool(("host", side),
                                               HOST_BLOCKS * session.block_bytes(session.key) * len(own)))
        endpoints = [m.get_local_endpoints()[0]["endpoint"] for m in managers]
        session.hosts = HostWorld(lib, managers, caches, models, endpoints)
    return session.hosts


def host_save(session: Session, index: int, step: dict) -> None:
    """d2h_auto_allocate on one side: its device blocks into chunks it locks."""
    w, side = world(session), step["side"]
    model = w.models[side]
    what = f"side {side}: save {step['blocks']}"
    answer = judged(session, model.judge_save(step["blocks"], None), what,
                    lambda: w.lib.host_save(w.managers[side], step["blocks"]))
    if answer is REFUSED:
        return
    chunks, pending = answer
    chunks = check_handed_out(what, chunks, len(step["blocks"]), model)
    landed(pending, Judgment(Must.DO), what)
    exported(session, lambda e: e.moved(True, _row_bytes(session, side) * len(chunks)))
    model.saved(index, step["blocks"], None, chunks, None, awaited=True)


def host_move(session: Session, index: int, step: dict) -> None:
    """h2h_read (side reads the other's host blocks) or h2h_write (side
    writes its own host blocks into the other's pool)."""
    w, side = world(session), step["side"]
    source, target = (1 - side, side) if step["read"] else (side, 1 - side)
    blocks, receiver = step["blocks"], w.models[target]
    call = "h2h_read" if step["read"] else "h2h_write"
    what = f"side {side}: {call} {blocks}"
    judgment = _judge_move(step["read"], blocks, receiver)
    move = w.lib.host_read if step["read"] else w.lib.host_write
    answer = judged(session, judgment, what, lambda: move(w.managers[side], w.endpoints[1 - side], blocks))
    if answer is REFUSED:
        return
    chunks, pending = answer
    exported(session, lambda e: e.may_cross(_row_bytes(session, source) * len(blocks),
                                            len(session.hosts.caches[source])))
    chunks = check_handed_out(what, chunks, len(blocks), receiver)
    done = landed(pending, judgment, what)
    if done or step["read"]:  # a write that failed leaves the chunks the peer took free
        receiver.received(index, chunks, [[layer[b] if 0 <= b < HOST_BLOCKS else None for b in blocks]
                                          for layer in w.models[source].blocks.host])
    if not done and step["read"]:  # its chunks locked, their bytes unknown, loads from them refused
        receiver.save_failed(index)


def _row_bytes(session: Session, side: int) -> int:
    """What one block of a side's transfer moves: a block of each of its layers."""
    return session.block_bytes(session.key) * len(session.hosts.caches[side])


def _judge_move(read: bool, blocks: list[int], receiver: ContractModel) -> Judgment:
    """The sender's blocks are the peer's for a read, the receiver's chunks the peer's for a write:
    what only the peer knows may be refused at the call, or fail."""
    if not blocks:
        return Judgment(Must.EITHER, "a transfer of no blocks: refused, or nothing moved")
    if len(set(blocks)) != len(blocks):
        return Judgment(Must.REFUSE, "a block named twice")
    if any(not 0 <= b < HOST_BLOCKS for b in blocks):
        return Judgment(Must.FAIL if read else Must.REFUSE, "a block outside the pool")
    if len(blocks) > receiver.free_chunks:
        return Judgment(Must.REFUSE if read else Must.FAIL, f"{len(blocks)} chunks asked, {receiver.free_chunks} free")
    return Judgment(Must.DO)


def host_unlock(session: Session, index: int, step: dict) -> None:
    """unlock_blocks on one side, of the chunks an earlier step locked
    there, in the order drawn (so that the free chunks a pool hands out
    next are out of order)."""
    w, side = world(session), step["side"]
    model = w.models[side]
    chunks = list(model.saves[step["of"]].chunks)
    chunks = [chunks[i] for i in step.get("order", ()) if i < len(chunks)] or chunks
    if judged(session, model.judge_unlock(chunks), f"side {side}: unlock {chunks}",
              lambda: w.lib.host_unlock(w.managers[side], chunks)) is not REFUSED:
        model.unlocked(chunks)


def host_check(session: Session, index: int, step: dict) -> None:
    """Load some of one side's host blocks onto its device, then compare
    every device block of that side with the model."""
    w, side = world(session), step["side"]
    model = w.models[side]
    chunks = [c for c in step["chunks"] if all(layer[c] is not None for layer in model.blocks.host)]
    targets = step["targets"][:len(chunks)]
    if chunks:
        ones = [1] * len(chunks)
        if judged(session, model.judge_transfer(False, chunks, targets, ones), f"side {side}: h2d {chunks} -> "
                  f"{targets}", lambda: w.lib.host_copy(w.managers[side], False, chunks, targets, ones)) is not REFUSED:
            model.blocks.apply(False, chunks, targets, ones)
            exported(session, lambda e: e.moved(False, _row_bytes(session, side) * len(chunks)))
    for layer, cache in enumerate(w.caches[side]):
        wrong = session.wrong_blocks(session.key, cache, model.blocks.device[layer])
        if wrong:
            raise Broken(CORRUPT, f"side {side} layer {layer}: device blocks {wrong[:8]} differ from the model "
                                  f"after host blocks {chunks} were loaded into {targets}")


def draw_host_step(rng, session: Session) -> dict:
    """One of the host rules, from what the two sides hold now."""
    w, side = session.hosts, int(rng.integers(2))
    rows = session.key.dims[0]
    kind = rng.random()
    sources = [_written(w.models[1 - side]), _written(w.models[side])] if w else [[], []]
    if w is None or kind < 0.3 or (kind < 0.7 and not any(sources)):
        n = int(rng.integers(1, MOST + 1))
        free = w.models[side].free_chunks if w else 0
        if 0 < free <= rows and rng.random() < 0.3:  # the pool filled to its last chunk
            n = free
        return {"rule": "host_save", "side": side, "blocks": [int(b) for b in rng.choice(rows, n, replace=False)]}
    model = w.models[side]
    if kind < 0.7:
        read = bool(rng.random() < 0.5) if all(sources) else bool(sources[0])
        written = sources[0] if read else sources[1]
        n = int(rng.integers(1, min(MOST, len(written)) + 1))
        blocks = [int(b) for b in rng.choice(written, n, replace=False)]
        if rng.random() < 0.1:  # a block outside the pool
            blocks[-1] = HOST_BLOCKS if rng.random() < 0.5 else -1
        return {"rule": "host_move", "side": side, "read": read, "blocks": blocks}
    locked = sorted(k for k, s in model.saves.items() if not s.unlocked)
    if locked and kind < 0.85:
        of = locked[int(rng.integers(len(locked)))]
        return {"rule": "host_unlock", "side": side, "of": of,
                "order": [int(i) for i in rng.permutation(len(model.saves[of].chunks))]}
    n = int(rng.integers(1, min(MOST, rows) + 1))
    chunks = [int(c) for c in rng.choice(HOST_BLOCKS, n, replace=False)]
    if locked and rng.random() < 0.5:  # what the latest call locked there
        chunks = list(model.saves[locked[-1]].chunks)[:MOST]
    return {"rule": "host_check", "side": side, "chunks": chunks,
            "targets": [int(b) for b in rng.choice(rows, len(chunks), replace=False)]}


def _written(model: ContractModel) -> list[int]:
    """The host blocks that hold bytes the model knows."""
    return [c for c in range(HOST_BLOCKS) if all(layer[c] is not None for layer in model.blocks.host)]


def applies(session: Session, step: dict) -> bool:
    """Whether a replayed host step's precondition still holds: a transfer's
    blocks in the pool hold bytes, an unlock's chunks are still locked."""
    w = session.hosts
    if step["rule"] == "host_move":
        source = w.models[1 - step["side"] if step["read"] else step["side"]] if w else None
        return source is not None and set(step["blocks"]) & set(range(HOST_BLOCKS)) <= set(_written(source))
    if step["rule"] == "host_unlock":
        save = w.models[step["side"]].saves.get(step["of"]) if w else None
        return save is not None and not save.unlocked
    return True


RULES = {"host_save": host_save, "host_move": host_move, "host_unlock": host_unlock, "host_check": host_check}
# What exercises each call of probes.iut.protocol's HostTransferLibrary.
CALLS = {"host_manager": "world", "host_read": "host_move", "host_write": "host_move", "host_copy": "host_check",
         "host_save": "host_save", "host_unlock": "host_unlock"}
