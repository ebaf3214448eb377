"""The store of saved blocks beside the manager, as an offload connector
relies on it (kvref.kv_store has the rules): a lookup answers the leading
run of stored hashes; a pinned entry (a block being loaded) is never
evicted; an insert is all or nothing; eviction takes the least recently
used entry; a bad argument is refused with nothing changed."""

from __future__ import annotations

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

CAPACITY = 4


def h(i: int) -> bytes:
    """Block i's hash: 8 bytes with the high bit set, as a serving stack's are."""
    return (0x80 << 56 | i).to_bytes(8, "big")


def kv_store(case: Case, iut: Adapter) -> Outcome:
    """One rule of the store, by kind, on a store of CAPACITY entries filled
    with blocks 0..CAPACITY-1 (hash h(i) -> chunk 100+i), each inserted on its own."""
    try:
        store = iut.kv_store(CAPACITY)
    except NotImplementedError as e:
        return Outcome(SKIP, str(e))
    for i in range(CAPACITY):
        taken, _ = store.insert([h(i)], [100 + i])
        if not taken:
            return Outcome(ERROR, f"inserting block {i} into a store with room for {CAPACITY} was refused")
    return KINDS[case.kind](store)


def _stored(store, blocks) -> dict[int, int | None]:
    """Each block's chunk where the store has it, else None."""
    return {b: dict(store.lookup([h(b)])).get(h(b)) for b in blocks}


def prefix_lookup(store) -> Outcome:
    """A lookup of blocks 1, 2, 7 (never stored) and 3 must stop at block 7:
    a block after a missing one is useless to the request, and loading it
    would skip the missing one."""
    answer = store.lookup([h(1), h(2), h(7), h(3)])
    if answer != [(h(1), 101), (h(2), 102)]:
        return Outcome(CORRUPT, f"lookup of blocks 1, 2, 7 (never stored), 3 answered {_blocks(answer)}; "
                       "expected blocks 1 and 2 with chunks 101 and 102, stopping at block 7")
    if (missed := store.lookup([h(7), h(0)])) != []:
        return Outcome(CORRUPT, f"lookup starting with block 7 (never stored) answered {_blocks(missed)}; "
                       "expected nothing")
    return Outcome(PASS, "lookups answered the leading run of stored blocks, stopping at the first miss")


def pinned_kept(store) -> Outcome:
    """Block 0 is pinned (being loaded) while CAPACITY new blocks are
    inserted one by one: each insert evicts an unpinned block, never block 0."""
    store.pin([h(0)])
    for i in range(CAPACITY, 2 * CAPACITY):
        taken, evicted = store.insert([h(i)], [100 + i])
        if not taken:
            return Outcome(ERROR, f"inserting block {i} was refused with {CAPACITY - 1} unpinned blocks to evict")
        if evicted is not None and h(0) in evicted:
            return Outcome(CORRUPT, f"inserting block {i} evicted block 0, which was pinned")
    if _stored(store, [0])[0] != 100:
        return Outcome(CORRUPT, f"block 0 was pinned but is gone after {CAPACITY} inserts: a load of it would "
                       "read a chunk handed to another block")
    store.release([h(0)])
    return Outcome(PASS, f"a pinned block survived {CAPACITY} inserts that each evicted an unpinned one")


def all_or_nothing(store) -> Outcome:
    """Blocks 0..2 pinned, so one entry can be evicted: an insert of two new
    blocks must be refused whole (neither stored, nothing evicted), and one
    of one new block taken."""
    pinned = [h(i) for i in range(CAPACITY - 1)]
    store.pin(pinned)
    before = _stored(store, range(CAPACITY))
    taken, evicted = store.insert([h(10), h(11)], [110, 111])
    after = _stored(store, [*range(CAPACITY), 10, 11])
    if taken or evicted or after != {**before, 10: None, 11: None}:
        return Outcome(CORRUPT, f"an insert of 2 blocks with room for 1 answered taken={taken}, evicted="
                       f"{_names(evicted)}, and left {after} (before: {before}); expected refused, "
                       "nothing changed")
    taken, _ = store.insert([h(10)], [110])
    if not taken or _stored(store, [10])[10] != 110:
        return Outcome(ERROR, "an insert of 1 block with room for 1 was refused")
    store.release(pinned)
    return Outcome(PASS, "an insert too large for the unpinned room was refused whole; one that fit was taken")


def lru_order(store) -> Outcome:
    """Block 0, the oldest, is used (pinned and released, as a load does):
    the next insert must evict block 1, now the least recently used."""
    store.pin([h(0)])
    store.release([h(0)])
    taken, evicted = store.insert([h(20)], [120])
    left = _stored(store, [0, 1])
    if not taken or left != {0: 100, 1: None} or (evicted is not None and evicted != [h(1)]):
        return Outcome(CORRUPT, f"after block 0 was used, an insert evicted {_names(evicted)} and left blocks "
                       f"0 and 1 as {left}; expected block 1 evicted (least recently used), block 0 kept")
    return Outcome(PASS, "eviction took the least recently used block, not the oldest inserted")


BAD_CALLS = {
    "a str hash": lambda s: s.lookup(["block-0"]),
    "an int hash": lambda s: s.pin([0]),
    "chunks of another length": lambda s: s.insert([h(30), h(31)], [130]),
    "a hash twice in one insert": lambda s: s.insert([h(32), h(32)], [132, 133]),
}


def bad_arguments(store) -> Outcome:
    """Each bad call must raise, and leave every stored block as it was."""
    blocks = [*range(CAPACITY), 30, 31, 32]
    before = _stored(store, blocks)
    for what, call in BAD_CALLS.items():
        try:
            call(store)
        except Exception:  # the refusal under test; what it says is the library's
            changed = _stored(store, blocks) != before
            if changed:
                return Outcome(CORRUPT, f"{what}: refused, but the store changed to {_stored(store, blocks)}")
            continue
        if _stored(store, blocks) != before:
            return Outcome(CORRUPT, f"{what}: accepted, and the store changed to {_stored(store, blocks)} "
                           f"(before: {before})")
        return Outcome(ERROR, f"{what}: accepted silently")
    return Outcome(PASS, f"{len(BAD_CALLS)} bad calls refused, the store unchanged")


def _blocks(pairs) -> str:
    return "[" + ", ".join(f"block {int.from_bytes(p[0], 'big') & 0xFFFF} -> {p[1]}" for p in pairs) + "]"


def _names(hashes) -> str:
    return "unknown" if hashes is None else str([int.from_bytes(x, "big") & 0xFFFF for x in hashes])


KINDS = {"prefix_lookup": prefix_lookup, "pinned_kept": pinned_kept, "all_or_nothing": all_or_nothing,
         "lru_order": lru_order, "bad_arguments": bad_arguments}
STORE_KINDS = tuple(KINDS)
