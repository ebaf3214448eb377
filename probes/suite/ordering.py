"""Transfers that overlap device work and each other, as a serving engine
issues them: a save while the step that writes the cache still runs, a load
whose future is not awaited before the next step reads the cache, and
un-awaited transfers on the same blocks. Each must move the bytes program
order says (or be refused by name)."""

from __future__ import annotations

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.iut.host_data import random_host
from probes.suite.cases import Case
from probes.suite.permutations import wrong_after, wrong_rows
from probes.suite.refusals import refused
from probes.suite.verdicts import CORRUPT, ERROR, PASS, Outcome, nothing_in_flight

LAYERS = 2
SAVED = 8  # blocks saved while the step runs
CHECKED = 16  # host blocks read back after a d2h of every block
UNHELD_ROUNDS = 8  # rounds where copies cannot be held in flight
STEP_ROUNDS = 3  # inflight_step's tries at a save while its step still runs
# How long the simulated link holds a copy in flight: longer than a step
# computes, with room for a loaded machine to be slow issuing the next call.
HOLD_SECONDS = 2.0
# The bound of a copy held until the step after it takes its place (an
# event ends it; this only keeps a manager that waits for the copy from
# waiting for ever).
GATE_SECONDS = 30.0
ORDERING_KINDS = ("h2d_then_step", "d2h_then_h2d_same_chunk", "d2h_then_overwrite")


def inflight_step(case: Case, iut: Adapter) -> Outcome:
    """As the offload connector: a step that writes every cache is dispatched
    (on JAX it donates the cache), and while it runs SAVED blocks are saved
    with d2h_auto_allocate; the chunks must hold what the step leaves, not
    the bytes before it, or the save is refused by name. Then the chunks are
    loaded into other blocks and, without awaiting the load, the next step
    reads the cache: it must see the loaded blocks. Where the step had
    already ended (a device whose steps cannot be held), a round is tried
    again on fresh caches, up to STEP_ROUNDS, then ERROR: nothing in flight."""
    rows = case.shape.dims[0]
    new = [random_host(case.shape, case.seed + 100 + i, finite=True) for i in range(LAYERS)]
    overlapped = []
    for _ in range(STEP_ROUNDS):  # where no step can be held, a round whose step ended first is tried again
        pairs = iut.make_caches(case.shape, [case.seed + i for i in range(LAYERS)], finite=True)
        try:
            manager = iut.manager([c for c, _ in pairs], rows)
        except Exception as e:  # a clean refusal, or the worker's ERROR
            return refused(iut, e)
        caches = [iut.dispatch_step(cache, n) for (cache, _), n in zip(pairs, new)]
        overlapped.append(all(iut.is_pending(c) for c in caches))
        if overlapped[-1]:
            break
    else:
        return Outcome(ERROR, nothing_in_flight(overlapped, "the dispatched step had ended before the save"))
    blocks = [int(b) for b in np.random.default_rng(case.seed).choice(rows, SAVED, replace=False)]
    try:
        chunks, pending = iut.save(manager, blocks)
        pending.wait()
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, "a save while the step runs: ")
    packed = np.empty(iut.layout(case.shape).physical_size_bytes, np.uint8)  # one layer at a time
    for layer in range(LAYERS):
        physical = _packed(iut, case.shape, new[layer], packed)
        for chunk, block in zip(chunks, blocks):
            got = manager.read_block_bytes(layer, chunk)
            if got != physical[block].tobytes():
                old = _packed(iut, case.shape, pairs[layer][1], packed)
                what = "the bytes from before the step" if got == old[block].tobytes() else \
                    "neither the step's bytes nor the old ones"
                return Outcome(CORRUPT, f"a save while the step ran: chunk {chunk} (layer {layer}, block "
                               f"{block}) holds {what}")
    del packed, physical
    targets = blocks[1:] + blocks[:1]  # each chunk into another saved block's place
    load = iut.start(manager, False, chunks, targets)
    seen = [iut.read_by_step(c) for c in caches]
    load.wait()
    came_from = np.arange(rows)  # block r of the step's output, but for the loaded targets
    came_from[targets] = blocks
    for layer, got in enumerate(seen):
        wrong = [int(i) for i in np.flatnonzero(wrong_after(got, new[layer], came_from, np.arange(rows)))]
        if wrong:
            return Outcome(CORRUPT, f"the step after an un-awaited load read layer {layer} with {len(wrong)} "
                           f"loaded blocks missing (first: block {wrong[0]})")
    return Outcome(PASS, f"{SAVED} blocks saved while the step ran held its bytes; the next step saw "
                   "the un-awaited load")


def unawaited_transfers(case: Case, iut: Adapter) -> Outcome:
    """Two things in program order with nothing awaited between them
    (case.kind): an h2d then the next step reading the cache
    (h2d_then_step); a d2h then an h2d from the same host chunks
    (d2h_then_h2d_same_chunk); a d2h then a step overwriting the blocks it
    copies (d2h_then_overwrite). Where the device allows, the first layer's
    first copy is held in flight (HOLD_SECONDS) while the rest go on, so the
    second thing really overlaps the first; elsewhere the first two kinds
    are repeated UNHELD_ROUNDS times. A PASS needs the overlap seen: the
    first transfer still running (its future, asked without waiting) when
    the second thing was issued, in some round; ERROR "nothing in flight"
    where it never was."""
    pairs = iut.make_caches(case.shape, [case.seed + i for i in range(LAYERS)], finite=True)
    caches, hosts = [c for c, _ in pairs], [h for _, h in pairs]
    rows = case.shape.dims[0]
    try:
        manager = iut.manager(caches, rows)
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e)
    if case.kind == "d2h_then_overwrite":
        return _d2h_then_overwrite(case, iut, manager, caches, hosts)
    every = list(range(rows))
    shifted = every[rows // 2:] + every[:rows // 2]  # block j goes to j + rows/2
    if case.kind == "h2d_then_step":
        iut.d2h(manager, every, every)  # host block j holds device block j, from here on
    held = iut.hold_copies(caches[0], HOLD_SECONDS)
    # A copy that cannot be held may still win its race: then try again, each
    # round leaving other bytes than the round before, so a stale read shows.
    rounds = 1 if held else UNHELD_ROUNDS
    overlapped = []  # per round: the first transfer still running when the second thing was issued
    for r in range(rounds):
        before = [iut.fetch(c) for c in caches]
        if case.kind == "h2d_then_step":
            targets = shifted if r % 2 == 0 else every
            load = iut.start(manager, False, every, targets)
            overlapped.append(iut.in_flight(load))
            seen = [iut.read_by_step(c) for c in caches]
            load.wait()
            expected = [_moved(host, targets) for host in hosts]
            what, second = "the step after an un-awaited h2d", "the step was issued"
        else:
            save = iut.start(manager, True, every, every)
            overlapped.append(iut.in_flight(save))
            load = iut.start(manager, False, every, shifted)
            save.wait()
            load.wait()
            seen = [iut.fetch(c) for c in caches]
            expected = [_moved(b, shifted) for b in before]
            what, second = "an h2d from host blocks whose d2h was not awaited", "the h2d was issued"
        for layer, (got, want) in enumerate(zip(seen, expected)):
            wrong = np.flatnonzero(wrong_rows(np.ascontiguousarray(got), np.ascontiguousarray(want)))
            if len(wrong):
                return Outcome(CORRUPT, f"{what}: {len(wrong)} of {rows} blocks of layer {layer} wrong in "
                               f"round {r + 1} (first: block {wrong[0]})")
    if not any(overlapped):
        return Outcome(ERROR, nothing_in_flight(overlapped, f"the first transfer had ended before {second}"))
    return Outcome(PASS, f"{what}: every block as program order says, {rounds} round(s), "
                   f"{sum(map(bool, overlapped))} with the first still in flight{_held(held)}")


def _moved(blocks: np.ndarray, targets: list[int]) -> np.ndarray:
    """Block j of `blocks` moved to targets[j]."""
    out = np.empty_like(blocks)
    out[targets] = blocks
    return out


def _d2h_then_overwrite(case, iut, manager, caches, hosts) -> Outcome:
    """A d2h of every block, then at once a step overwriting the cache: the
    host blocks must hold the bytes from before the step. A PASS needs the
    d2h seen still copying when the step was dispatched."""
    rows = case.shape.dims[0]
    new = [random_host(case.shape, case.seed + 100 + i, finite=True) for i in range(len(caches))]
    # Held until the step has taken its place: a correct manager's step waits
    # for the copy, a wrong one's overwrites it first, on any machine.
    held = iut.hold_copies(caches[0], GATE_SECONDS, until_step=True)
    every = list(range(rows))
    save = iut.start(manager, True, every, every)
    overlapped = iut.in_flight(save)  # still copying as the step is dispatched
    caches = [iut.dispatch_step(c, n) for c, n in zip(caches, new)]
    save.wait()
    old = [_packed(iut, case.shape, h) for h in hosts]
    # The first block (the held copy's, on the simulated link) and a sample of
    # the first few dozen (reading far into a pool can be slow).
    sample = np.random.default_rng(case.seed).choice(min(rows, 4 * CHECKED), min(CHECKED, rows), replace=False)
    checked = sorted({0, *map(int, sample)})
    for layer in range(len(caches)):
        for block in checked:
            if manager.read_block_bytes(layer, block) != old[layer][block].tobytes():
                return Outcome(CORRUPT, f"a d2h followed at once by a step overwriting the cache: host "
                               f"block {block} (layer {layer}) does not hold the bytes from before the step")
    for layer, (cache, n) in enumerate(zip(caches, new)):
        if wrong_rows(np.ascontiguousarray(iut.fetch(cache)), np.ascontiguousarray(n)).any():
            return Outcome(CORRUPT, f"the step after a d2h did not leave its bytes in layer {layer}")
    if not overlapped:
        return Outcome(ERROR, nothing_in_flight([overlapped], "the d2h had ended before the step was dispatched"))
    return Outcome(PASS, f"a d2h then a step overwriting the cache: {len(checked)} host blocks checked "
                   f"per layer hold the bytes from before the step{_held(held)}")


def _held(held: bool) -> str:
    return "" if held else " (copies not held in flight on this device: the overlap is as it falls)"


def _packed(iut: Adapter, key: kvref.ShapeKey, host: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The cache's physical bytes (into `out`, if given), one row per block."""
    return kvref.pack(host, iut.layout(key), out=out).reshape(key.dims[0], -1)
