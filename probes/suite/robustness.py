"""Robustness probes: bad input, the order arrays and manager are released in,
and concurrent transfers. Written for any implementation; the production
library's answers are findings, recorded whatever they are."""

from __future__ import annotations

import functools
import gc
import time

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.threads import unfinished
from probes.suite.verdicts import CORRUPT, ERROR, PASS, REJECTED, Outcome, nothing_in_flight

# Bad input a manager must refuse without changing device or host bytes:
# (direction, src, dst, sizes), in blocks; "rows"/"host" stand for the counts.
BAD_TRANSFERS = {
    "src_out_of_range": ("d2h", ["rows"], [0], None),
    "dst_out_of_range": ("d2h", [0], ["host"], None),
    "negative_offset": ("h2d", [0], [-1], None),
    "overlapping_destinations": ("d2h", [0, 1], [2, 2], None),
    "mismatched_lengths": ("d2h", [0, 1], [0], None),
    "zero_copy_size": ("d2h", [0], [0], [0]),
    "run_past_the_end": ("h2d", [0], ["rows-1"], [2]),
}
BAD_CONSTRUCTIONS = ("ragged_shards", "no_layers")
BAD_INPUTS = tuple(BAD_TRANSFERS) + BAD_CONSTRUCTIONS
HOST_BLOCKS = 8  # the host pool of every case, the valid transfer beside the bad ones too
RELEASE_ORDERS = ("arrays_first", "manager_first", "save_in_flight", "exit_in_flight")
CONCURRENCY = ("four_threads", "both_directions")
BOTH_WAYS_ROUNDS, BOTH_WAYS_SECONDS = 30, 20.0
FOUR_THREADS_MOST_SECONDS = 120.0  # four threads still completing transfers are waited for this long at most
# What the worker's interpreter still holds at exit (exit_in_flight).
_AT_EXIT: list = []
HOLD_SECONDS = 1.0  # the simulated link holds the save's first copy: still running when it is dropped


def bad_input(case: Case, iut: Adapter) -> Outcome:
    """One kind of bad input (case.kind): the library's clean refusal (as its
    Library.refuses says) and no byte changed is REJECTED; silent acceptance,
    or any other error, is ERROR; changed bytes CORRUPT."""
    kind, dims = case.kind, case.shape.dims
    pairs = [iut.make_cache(case.shape, case.seed + i, finite=True) for i in range(2)]
    caches = [c for c, _ in pairs]
    if kind in BAD_CONSTRUCTIONS:
        layers = [] if kind == "no_layers" else [[caches[0]], caches]
        try:
            iut.manager(layers, HOST_BLOCKS)
        except Exception as e:  # the library's refusal, or not
            return _judged(iut, kind, e)
        return Outcome(ERROR, f"{kind}: the manager was constructed")
    manager = iut.manager(caches, HOST_BLOCKS)
    iut.d2h(manager, list(range(HOST_BLOCKS)), list(range(HOST_BLOCKS)))
    before = _state(iut, manager, caches)
    direction, src, dst, sizes = BAD_TRANSFERS[kind]
    names = {"rows": dims[0], "host": HOST_BLOCKS, "rows-1": dims[0] - 1}
    src, dst = [names.get(x, x) for x in src], [names.get(x, x) for x in dst]
    try:
        iut.transfer(manager, direction == "d2h", src, dst, sizes)
        refused = None
    except Exception as e:  # compared with the state below
        refused = e
    if _state(iut, manager, caches) != before:
        what = f"then raised {first_line(refused)}" if refused else "accepted it silently"
        return Outcome(CORRUPT, f"{kind}: bytes changed, and the manager {what}")
    if refused is None:
        return Outcome(ERROR, f"{kind}: accepted {direction}(src={src}, dst={dst}, sizes={sizes}) silently")
    return _judged(iut, kind, refused)


def _judged(iut: Adapter, kind: str, e: Exception) -> Outcome:
    if iut.refuses(e):
        return Outcome(REJECTED, first_line(e))
    return Outcome(ERROR, f"{kind}: failed with {first_line(e)}, which is not one of {iut.name}'s refusals")


def release_order(case: Case, iut: Adapter) -> Outcome:
    """Drop the caller's arrays before the manager (kind "arrays_first"), the
    manager before the arrays ("manager_first"), the manager and the future
    of a save still in flight ("save_in_flight"), or leave a manager and an
    un-awaited save to the interpreter's exit ("exit_in_flight": the worker's
    exit is the verdict, so a crash or hang there is CRASH or HANG); nothing
    may crash, and the manager must never write into memory given back."""
    pairs = [iut.make_cache(case.shape, case.seed + i) for i in range(2)]
    manager = iut.manager([c for c, _ in pairs], HOST_BLOCKS)
    blocks = list(range(HOST_BLOCKS))
    if case.kind in ("save_in_flight", "exit_in_flight"):
        return _drop_in_flight(case, iut, manager, pairs, blocks)
    iut.d2h(manager, blocks, blocks)
    if case.kind == "manager_first":
        del manager
        gc.collect()
        for cache, host in pairs:
            if iut.fetch(cache).tobytes() != host.tobytes():
                return Outcome(CORRUPT, "releasing the manager changed its caches")
        return Outcome(PASS, "manager released first; caches intact")
    del pairs
    gc.collect()
    fresh = [iut.make_cache(case.shape, case.seed + 10 + i) for i in range(2)]  # may reuse the memory
    iut.h2d(manager, blocks, blocks)
    for cache, host in fresh:
        if iut.fetch(cache).tobytes() != host.tobytes():
            return Outcome(CORRUPT, "h2d after the caches were released wrote into new arrays' memory")
    return Outcome(PASS, "arrays released first; later transfers touched nothing else")


def _drop_in_flight(case, iut, manager, pairs, blocks) -> Outcome:
    """A PASS needs the save seen still running (its future, asked without
    waiting) when it was dropped; ERROR "nothing in flight" otherwise."""
    iut.hold_copies(pairs[0][0], HOLD_SECONDS)
    chunks, pending = iut.save(manager, blocks)
    overlapped = iut.in_flight(pending)
    if case.kind == "exit_in_flight":
        _AT_EXIT.append((manager, pending, pairs))
        if not overlapped:
            return Outcome(ERROR, nothing_in_flight([overlapped], "the save had ended before it was left"))
        return Outcome(PASS, f"a manager and an un-awaited save of {len(chunks)} blocks, still running, left "
                       "to the interpreter's exit, which ended cleanly")
    del manager, pending
    gc.collect()
    fresh = [iut.make_cache(case.shape, case.seed + 10 + i) for i in range(2)]  # may reuse freed memory
    for cache, host in pairs + fresh:
        if iut.fetch(cache).tobytes() != host.tobytes():
            return Outcome(CORRUPT, "dropping a manager with a save in flight changed a cache's bytes")
    if not overlapped:
        return Outcome(ERROR, nothing_in_flight([overlapped], "the save had ended before it was dropped"))
    return Outcome(PASS, "manager and future dropped with a save still running; no bytes changed")


def concurrent_transfers(case: Case, iut: Adapter) -> Outcome:
    """Four threads moving disjoint blocks at once ("four_threads"), or one
    thread saving some blocks while another loads others ("both_directions");
    every byte checked, every thread bounded in time (a lock taken in
    opposite orders is a HANG)."""
    if case.kind == "both_directions":
        return _both_directions(case, iut)
    dims = case.shape.dims
    pairs = [iut.make_cache(case.shape, case.seed + i, finite=True) for i in range(2)]
    manager = iut.manager([c for c, _ in pairs], 64)
    expected = [kvref.pack(h, iut.layout(case.shape)).reshape(dims[0], -1) for _, h in pairs]
    wrong, errors, done = [], [], []

    def work(t: int):
        rng = np.random.default_rng(t)
        try:
            for _ in range(40):
                host = t * 16 + rng.choice(16, 4, replace=False)
                device = rng.choice(np.arange(t, dims[0], 4), 4, replace=False)
                iut.d2h(manager, device, host)
                done.append(t)
                for layer in range(2):
                    for d, h in zip(device, host):
                        if manager.read_block_bytes(layer, int(h)) != expected[layer][d].tobytes():
                            wrong.append((t, layer, int(d)))
        except Exception as e:  # reported as the outcome
            errors.append(first_line(e))

    # Bounded by progress: a slow machine's transfers finish; none completing for the window is a stop.
    if unfinished([functools.partial(work, t) for t in range(4)], BOTH_WAYS_SECONDS + 5, lambda: len(done),
                  FOUR_THREADS_MOST_SECONDS):
        return Outcome(ERROR, f"a thread was still moving blocks after {len(done)} of 160 transfers, none "
                       f"completing in the last {BOTH_WAYS_SECONDS + 5:.0f}s (or {FOUR_THREADS_MOST_SECONDS:.0f}s "
                       "in all)")
    if errors:
        return Outcome(ERROR, errors[0])
    if wrong:
        return Outcome(CORRUPT, f"{len(wrong)} blocks read back wrong, first {wrong[0]}")
    return Outcome(PASS, "4 threads x 40 transfers of disjoint blocks, every byte checked")


def _state(iut, manager, caches) -> tuple:
    """Every device and host byte the manager can touch."""
    device = tuple(iut.fetch(c).tobytes() for c in caches)
    host = tuple(manager.read_block_bytes(layer, block) for layer in range(len(caches))
                 for block in range(HOST_BLOCKS))
    return device, host


def _both_directions(case: Case, iut: Adapter) -> Outcome:
    """d2h of the first half of the blocks and h2d into the second half, from
    two threads at once, BOTH_WAYS_ROUNDS times each."""
    pairs = [iut.make_cache(case.shape, case.seed + i, finite=True) for i in range(2)]
    caches, hosts = [c for c, _ in pairs], [h for _, h in pairs]
    rows = case.shape.dims[0]
    half = rows // 2
    manager = iut.manager(caches, rows)
    iut.d2h(manager, list(range(rows)), list(range(rows)))  # host block j holds device block j
    layout = iut.layout(case.shape)
    expected = [kvref.pack(h, layout).reshape(rows, -1) for h in hosts]
    errors, wrong = [], []
    deadline = time.monotonic() + BOTH_WAYS_SECONDS

    def saving():
        for r in range(BOTH_WAYS_ROUNDS):
            if time.monotonic() > deadline:
                return errors.append(f"saving thread: {r} rounds in {BOTH_WAYS_SECONDS}s")
            iut.d2h(manager, list(range(half)), list(range(half)))
            for layer in range(2):
                block = r % half
                if manager.read_block_bytes(layer, block) != expected[layer][block].tobytes():
                    wrong.append(f"host block {block} (layer {layer}) after round {r}")

    def loading():
        for r in range(BOTH_WAYS_ROUNDS):
            if time.monotonic() > deadline:
                return errors.append(f"loading thread: {r} rounds in {BOTH_WAYS_SECONDS}s")
            iut.h2d(manager, list(range(half, rows)), list(range(half, rows))[::-1])

    def guarded(work):
        try:
            work()
        except Exception as e:  # reported as the outcome
            errors.append(first_line(e))

    if unfinished([functools.partial(guarded, w) for w in (saving, loading)], BOTH_WAYS_SECONDS + 5):
        return Outcome(ERROR, f"a thread was still moving blocks after {BOTH_WAYS_SECONDS + 5:.0f}s")
    if errors:
        return Outcome(ERROR, errors[0])
    if wrong:
        return Outcome(CORRUPT, f"{len(wrong)} blocks read back wrong, first {wrong[0]}")
    for layer, (cache, host) in enumerate(zip(caches, hosts)):
        want = host.copy()
        want[half:] = host[half:][::-1]  # every load puts the second half back reversed
        if _differs(iut.fetch(cache), want):
            return Outcome(CORRUPT, f"layer {layer}'s device blocks are not what the loads put there")
    return Outcome(PASS, f"{BOTH_WAYS_ROUNDS} saves and {BOTH_WAYS_ROUNDS} loads from two threads at once, "
                   "every byte checked")


def _differs(got: np.ndarray, want: np.ndarray) -> bool:
    return np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(want).tobytes()
