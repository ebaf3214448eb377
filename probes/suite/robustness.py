"""Robustness probes: bad input, the order arrays and manager are released in,
and concurrent transfers. Written for any implementation; the production
library's answers are findings, recorded whatever they are."""

from __future__ import annotations

import gc
import threading

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.verdicts import CORRUPT, ERROR, PASS, REJECTED, Outcome

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
BAD_HOST_BLOCKS = 8
RELEASE_ORDERS = ("arrays_first", "manager_first")
CONCURRENCY = ("four_threads",)


def bad_input(case: Case, iut: Adapter) -> Outcome:
    """One kind of bad input (case.kind): a clean error and no byte changed is
    REJECTED; silent acceptance is ERROR; changed bytes CORRUPT."""
    kind, dims = case.kind, case.shape.dims
    pairs = [iut.make_cache(case.shape, case.seed + i, finite=True) for i in range(2)]
    caches = [c for c, _ in pairs]
    if kind in BAD_CONSTRUCTIONS:
        layers = [] if kind == "no_layers" else [[caches[0]], caches]
        try:
            iut.manager(layers, BAD_HOST_BLOCKS)
        except Exception as e:  # any clean refusal will do
            return Outcome(REJECTED, first_line(e))
        return Outcome(ERROR, f"{kind}: the manager was constructed")
    manager = iut.manager(caches, BAD_HOST_BLOCKS)
    iut.d2h(manager, list(range(BAD_HOST_BLOCKS)), list(range(BAD_HOST_BLOCKS)))
    before = _state(iut, manager, caches)
    direction, src, dst, sizes = BAD_TRANSFERS[kind]
    names = {"rows": dims[0], "host": BAD_HOST_BLOCKS, "rows-1": dims[0] - 1}
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
    return Outcome(REJECTED, first_line(refused))


def release_order(case: Case, iut: Adapter) -> Outcome:
    """Drop the caller's arrays before the manager (kind "arrays_first") or the
    manager before the arrays ("manager_first"); nothing may crash, and the
    manager must never write into memory the arrays gave back."""
    pairs = [iut.make_cache(case.shape, case.seed + i) for i in range(2)]
    manager = iut.manager([c for c, _ in pairs], BAD_HOST_BLOCKS)
    blocks = list(range(BAD_HOST_BLOCKS))
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


def concurrent_transfers(case: Case, iut: Adapter) -> Outcome:
    """Four threads moving disjoint blocks at once; every host byte checked."""
    dims = case.shape.dims
    pairs = [iut.make_cache(case.shape, case.seed + i, finite=True) for i in range(2)]
    manager = iut.manager([c for c, _ in pairs], 64)
    expected = [kvref.pack(h, iut.layout(case.shape)).reshape(dims[0], -1) for _, h in pairs]
    wrong, errors = [], []

    def work(t: int):
        rng = np.random.default_rng(t)
        try:
            for _ in range(40):
                host = t * 16 + rng.choice(16, 4, replace=False)
                device = rng.choice(np.arange(t, dims[0], 4), 4, replace=False)
                iut.d2h(manager, device, host)
                for layer in range(2):
                    for d, h in zip(device, host):
                        if manager.read_block_bytes(layer, int(h)) != expected[layer][d].tobytes():
                            wrong.append((t, layer, int(d)))
        except Exception as e:  # reported as the outcome
            errors.append(first_line(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        return Outcome(ERROR, errors[0])
    if wrong:
        return Outcome(CORRUPT, f"{len(wrong)} blocks read back wrong, first {wrong[0]}")
    return Outcome(PASS, "4 threads x 40 transfers of disjoint blocks, every byte checked")


def _state(iut, manager, caches) -> tuple:
    """Every device and host byte the manager can touch."""
    device = tuple(iut.fetch(c).tobytes() for c in caches)
    host = tuple(manager.read_block_bytes(layer, block) for layer in range(len(caches))
                 for block in range(BAD_HOST_BLOCKS))
    return device, host
