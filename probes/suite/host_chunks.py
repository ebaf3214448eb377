"""Host chunks as the offload connector uses them: saved into with
d2h_auto_allocate (the manager picks free chunks and locks them), given back
with unlock_blocks, loaded from with h2d. One case per kind (case.kind).

What a correct manager must do: hand out only unlocked chunks, never one
chunk twice while it is locked; refuse a request it cannot carry out (a pool
too small, a bad source, a bad unlock) with a clean error that takes no chunk
and moves no byte; keep a locked chunk's bytes until it is unlocked."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.threads import unfinished
from probes.suite.verdicts import CORRUPT, ERROR, PASS, Outcome

CHUNKS = 16  # the host pool, in chunks
LAYERS = 2
THREADS, THREAD_ROUNDS, THREAD_SECONDS = 8, 20, 20.0


class Broken(Exception):
    """A property of the pool did not hold: the case's verdict and detail."""

    def __init__(self, verdict: str, detail: str):
        super().__init__(detail)
        self.verdict, self.detail = verdict, detail


class Pool:
    """A manager over LAYERS caches of the case's shape with CHUNKS host
    chunks, and what every device block and every locked chunk must hold."""

    def __init__(self, case: Case, iut: Adapter):
        self.iut = iut
        pairs = iut.make_caches(case.shape, [case.seed + i for i in range(LAYERS)], finite=True)
        self.caches = [c for c, _ in pairs]
        self.hosts = [h for _, h in pairs]
        self.rows = case.shape.dims[0]
        layout = iut.layout(case.shape)
        self.blocks = [kvref.pack(h, layout).reshape(self.rows, -1) for h in self.hosts]
        self.manager = iut.manager(self.caches, CHUNKS)
        self.locked: dict[int, int] = {}  # chunk -> the device block it holds

    def save(self, blocks, sizes=None) -> list[int]:
        """Save and wait; every chunk must be new, in range, and hold its block."""
        chunks, pending = self.iut.save(self.manager, blocks, sizes)
        pending.wait()
        sources = [b + k for b, n in zip(blocks, sizes or [1] * len(blocks)) for k in range(n)]
        if len(chunks) != len(sources):
            raise Broken(ERROR, f"saving {len(sources)} blocks returned {len(chunks)} chunk ids")
        for chunk, block in zip(chunks, sources):
            if not 0 <= chunk < CHUNKS:
                raise Broken(ERROR, f"chunk id {chunk} is outside the {CHUNKS}-chunk pool")
            if chunk in self.locked:
                raise Broken(CORRUPT, f"chunk {chunk} was handed out while still locked (it holds "
                             f"device block {self.locked[chunk]})")
            self.locked[chunk] = block
        if len(set(chunks)) != len(chunks):
            raise Broken(CORRUPT, f"one save handed out a chunk twice: {chunks}")
        self.check_chunks()
        return chunks

    def unlock(self, chunks) -> None:
        self.iut.unlock(self.manager, chunks)
        for chunk in chunks:
            self.locked.pop(chunk)

    def check_chunks(self, context: str = "") -> None:
        """Every locked chunk still holds the block saved into it."""
        for chunk, block in self.locked.items():
            for layer in range(LAYERS):
                if self.manager.read_block_bytes(layer, chunk) != self.blocks[layer][block].tobytes():
                    raise Broken(CORRUPT, f"{context}chunk {chunk} (layer {layer}) no longer holds "
                                 f"device block {block}")

    def check_device(self, context: str = "") -> None:
        for layer, (cache, host) in enumerate(zip(self.caches, self.hosts)):
            if self.iut.fetch(cache).tobytes() != host.tobytes():
                raise Broken(CORRUPT, f"{context}layer {layer}'s device bytes changed")

    def refuses(self, what: str, call) -> str:
        """`call()` must be refused cleanly and change nothing: the refusal."""
        try:
            call()
        except Broken:
            raise
        except Exception as e:  # judged below
            if not self.iut.refuses(e):
                raise
            refusal = first_line(e)
        else:
            refusal = None
        self.check_chunks(f"after {what}: ")
        self.check_device(f"after {what}: ")
        if refusal is None:
            raise Broken(ERROR, f"{what} was accepted silently")
        return refusal

    def take_the_rest(self, context: str) -> list[int]:
        """Every chunk not locked must still be free: saving exactly that many works."""
        free = CHUNKS - len(self.locked)
        try:
            return self.save(list(range(free)))
        except Broken:
            raise
        except Exception as e:  # a refusal here means chunks were lost
            raise Broken(ERROR, f"{context}: {free} chunks should be free, but saving {free} blocks "
                         f"failed: {first_line(e)}") from None


def host_chunks(case: Case, iut: Adapter) -> Outcome:
    """One way of using the pool as the offload connector does (case.kind): saved into with
    d2h_auto_allocate, unlocked, loaded from; the module docstring says what must hold."""
    try:
        pool = Pool(case, iut)
        detail = KINDS[case.kind](pool)
    except Broken as b:
        return Outcome(b.verdict, b.detail)
    return Outcome(PASS, detail)


def fill_then_one_more(pool: Pool) -> str:
    """Fill all but four chunks in three saves; ask for eight (more than
    free), which must be refused whole; the four are still there; then one
    more than the pool holds is refused too."""
    pool.save([0, 1, 2, 3])
    pool.save([4, 5, 6, 7, 8])
    pool.save([9], [3])
    asked = pool.refuses("saving 8 blocks with 4 chunks free", lambda: pool.iut.save(pool.manager, list(range(20, 28))))
    pool.take_the_rest("after a refused save of 8")
    full = pool.refuses("saving into a full pool", lambda: pool.iut.save(pool.manager, [30]))
    return f"{CHUNKS} chunks saved and read back byte-exact; too large a save refused whole ({asked}); " \
           f"a full pool refused ({full})"


def refused_saves(pool: Pool) -> str:
    """Bad save requests with half the pool locked: each refused, taking no
    chunk; then the other half can still be saved exactly."""
    pool.save(list(range(CHUNKS // 2)))
    rows = pool.rows
    bad = {"a source past the last block": ([rows], None), "a negative source": ([-1], None),
           "a run past the end": ([rows - 1], [2]), "a zero-block run": ([0], [0]),
           "copy_sizes of another length": ([0, 1], [1])}
    for what, (src, sizes) in bad.items():
        pool.refuses(f"a save of {what}", lambda: pool.iut.save(pool.manager, src, sizes))
    empty = _empty_save(pool)
    pool.take_the_rest("after the refused saves")
    return f"{len(bad)} bad saves refused, nothing taken; {empty}; the rest of the pool saved exactly"


def _empty_save(pool: Pool) -> str:
    """A save of no blocks may be refused, or return no chunks; nothing changes."""
    try:
        chunks, pending = pool.iut.save(pool.manager, [])
        pending.wait()
    except Exception as e:  # judged below
        if not pool.iut.refuses(e):
            raise
        return f"an empty save refused ({first_line(e)})"
    if chunks:
        raise Broken(ERROR, f"an empty save returned chunks {chunks}")
    pool.check_chunks("after an empty save: ")
    return "an empty save returned no chunks"


def bad_unlocks(pool: Pool) -> str:
    """Unlocks of ids that are not locked (already unlocked, never handed
    out, out of range, negative, repeated in one call, mixed with a locked
    one): each refused, unlocking nothing, so no locked chunk is handed out."""
    chunks = pool.save(list(range(8)))
    pool.unlock([chunks[0]])
    never = next(c for c in range(CHUNKS) if c not in chunks)
    bad = {"a chunk unlocked before": [chunks[0]], "a chunk never handed out": [never],
           "an id past the pool": [CHUNKS + 3], "a negative id": [-1],
           "one id twice in a call": [chunks[1], chunks[1]],
           "a locked chunk with an unlocked one": [chunks[2], chunks[0]]}
    for what, ids in bad.items():
        pool.refuses(f"unlocking {what} ({ids})", lambda: pool.iut.unlock(pool.manager, ids))
    pool.take_the_rest("after the refused unlocks")  # would hand out a chunk freed twice
    return f"{len(bad)} bad unlocks refused; no locked chunk handed out after them"


def reuse_after_unlock(pool: Pool) -> str:
    """Fill the pool, unlock every other chunk, save as many new blocks: they
    must land in exactly the unlocked chunks; then every chunk loads back
    into the device, each block somewhere else, byte-exact."""
    first = pool.save(list(range(CHUNKS)))
    freed = first[::2]
    pool.unlock(freed)
    again = pool.save(list(range(CHUNKS, CHUNKS + len(freed))))
    if sorted(again) != sorted(freed):
        raise Broken(ERROR, f"after unlocking {sorted(freed)} a save took {sorted(again)}")
    chunks = sorted(pool.locked)
    targets = [(pool.locked[c] + pool.rows // 2) % pool.rows for c in chunks]  # never where it came from
    pool.iut.h2d(pool.manager, chunks, targets)
    for layer, cache in enumerate(pool.caches):
        got = pool.iut.fetch(cache).reshape(pool.rows, -1).view(np.uint8)
        want = pool.hosts[layer].reshape(pool.rows, -1).view(np.uint8)
        for chunk, target in zip(chunks, targets):
            if not np.array_equal(got[target], want[pool.locked[chunk]]):
                raise Broken(CORRUPT, f"chunk {chunk} loaded into block {target} (layer {layer}) did not "
                             f"bring device block {pool.locked[chunk]}")
    return f"{len(freed)} unlocked chunks reused exactly; all {CHUNKS} loaded back byte-exact"


def eight_threads(pool: Pool) -> str:
    """THREADS threads each save two blocks, check them, unlock, THREAD_ROUNDS
    times: no chunk is ever handed out while another thread holds it."""
    held: dict[int, int] = {}
    guard, problems = threading.Lock(), []
    deadline = time.monotonic() + THREAD_SECONDS

    def work(t: int):
        rng = np.random.default_rng(t)
        try:
            for _ in range(THREAD_ROUNDS):
                if time.monotonic() > deadline or problems:
                    return
                blocks = [int(b) for b in rng.choice(pool.rows, 2, replace=False)]
                chunks, pending = pool.iut.save(pool.manager, blocks)
                with guard:
                    twice = [c for c in chunks if c in held]
                    held.update({c: t for c in chunks})
                if twice:
                    problems.append((CORRUPT, f"thread {t} was handed chunk(s) {twice} that another "
                                     "thread still held"))
                    return
                pending.wait()
                for chunk, block in zip(chunks, blocks):
                    for layer in range(LAYERS):
                        if pool.manager.read_block_bytes(layer, chunk) != pool.blocks[layer][block].tobytes():
                            problems.append((CORRUPT, f"thread {t}: chunk {chunk} does not hold block {block}"))
                            return
                with guard:
                    for c in chunks:
                        held.pop(c)
                pool.iut.unlock(pool.manager, chunks)
        except Exception as e:  # reported as the outcome
            problems.append((ERROR, f"thread {t}: {first_line(e)}"))

    stuck = unfinished([functools.partial(work, t) for t in range(THREADS)], THREAD_SECONDS + 5)
    if stuck:
        raise Broken(ERROR, f"{stuck} threads still running after {THREAD_SECONDS + 5:.0f}s")
    if problems:
        raise Broken(*problems[0])
    if time.monotonic() > deadline:
        raise Broken(ERROR, f"{THREADS} threads did not finish {THREAD_ROUNDS} rounds in {THREAD_SECONDS}s")
    return f"{THREADS} threads x {THREAD_ROUNDS} saves and unlocks; no chunk held twice, every byte checked"


def locked_d2h(pool: Pool) -> str:
    """A plain d2h into a chunk that is locked: refused, changing nothing; or
    carried out, the chunk then holding the new block (and nothing else
    changed)."""
    chunks = pool.save([0, 1])
    try:
        pool.iut.d2h(pool.manager, [5], [chunks[0]])
    except Exception as e:  # judged below
        if not pool.iut.refuses(e):
            raise
        pool.check_chunks("after a refused d2h into a locked chunk: ")
        return f"a d2h into a locked chunk was refused ({first_line(e)}); nothing changed"
    pool.locked[chunks[0]] = 5
    pool.check_chunks("after a d2h into a locked chunk: ")
    return "a d2h into a locked chunk overwrote exactly it"


def unwritten_h2d(pool: Pool) -> str:
    """An h2d from chunks never written: refused, or carried out touching
    only its destination blocks."""
    before = [pool.iut.fetch(c).reshape(pool.rows, -1).view(np.uint8).copy() for c in pool.caches]
    targets = [3, 4]
    try:
        pool.iut.h2d(pool.manager, [0, 1], targets)
        outcome = "carried out"
    except Exception as e:  # judged below
        if not pool.iut.refuses(e):
            raise
        outcome = f"refused ({first_line(e)})"
    others = np.ones(pool.rows, bool)
    if outcome == "carried out":
        others[targets] = False
    for layer, cache in enumerate(pool.caches):
        now = pool.iut.fetch(cache).reshape(pool.rows, -1).view(np.uint8)
        changed = np.nonzero((now != before[layer]).any(1) & others)[0]
        if changed.size:
            raise Broken(CORRUPT, f"an h2d from unwritten chunks ({outcome}) changed block "
                         f"{int(changed[0])} of layer {layer}, which it was not asked to write")
    return f"an h2d from unwritten chunks was {outcome}; no other block changed"


KINDS = {kind.__name__: kind for kind in (fill_then_one_more, refused_saves, bad_unlocks, reuse_after_unlock,
                                          eight_threads, locked_d2h, unwritten_h2d)}
HOST_CHUNK_KINDS = tuple(KINDS)
