"""Caches split over a device mesh, as serving stacks shard them: by kv heads
(tensor parallelism), replicated along a mesh axis, by blocks (tpu-inference
splits the block dimension over its data axis), and layers of different
shardings in one manager. Block ids are global (kvref.sharding says what
that means); every device's part is read back on its own."""

from __future__ import annotations

import numpy as np

import kvref
from kvref.oracle.table_shapes import FOUR_CHIP_SPLITS
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line, refused
from probes.suite.permutations import expected_after, has_equal_rows, moving_permutations, wrong_rows
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

SUBJECT = kvref.ShapeKey("bf16", (64, 16, 8, 128))  # addressable per shard on every generation
SHARDINGS = FOUR_CHIP_SPLITS  # by kind of case
MESH_DEVICES = max(kvref.Sharding.parse(text).devices for text in SHARDINGS.values())
HEAD_KINDS = ("heads", "replicated")
BLOCK_KINDS = ("blocks", "blocks_and_heads", "mixed_layers")
# One layer split across heads, one along blocks, on the same four devices,
# with blocks of one size on every device.
MIXED_LAYERS = (("heads", SUBJECT), ("blocks", kvref.ShapeKey("bf16", (64, 16, 2, 128))))


def sharded_roundtrip(case: Case, iut: Adapter) -> Outcome:
    """A cache split across its heads (or replicated too): every block d2h in
    one permutation and h2d back in another, then one host block into one
    device block, then a run of blocks out and back as one run each; every
    device's part, replicas included, must hold exactly its part of the
    expected contents after each."""
    return round_trips(case, iut, [(SHARDINGS[case.kind], case.shape)])


def block_sharded(case: Case, iut: Adapter) -> Outcome:
    """A cache split along its blocks (and its heads), or two layers sharded
    differently: refusing it when the manager is built is right; a manager
    that takes it must move global blocks, each only on the devices that
    hold it, as sharded_roundtrip checks (its runs cross the shards' boundaries)."""
    layers = MIXED_LAYERS if case.kind == "mixed_layers" else ((case.kind, case.shape),)
    return round_trips(case, iut, [(SHARDINGS[kind], key) for kind, key in layers])


SAME_BLOCKS = "two blocks hold the same bytes, so a block that did not move could pass"
RUN = 8  # blocks moved as one run (copy_sizes) in the last step
UNEVEN = (2, 3)  # the kv heads (dimension 2) of the subject over three devices: 2, 2 and 4


def no_mesh(iut: Adapter) -> Outcome:
    """The SKIP of a probe whose caches split over devices, on arrays that cannot split them."""
    return Outcome(SKIP, f"{iut.name}'s arrays make no sharded caches (no probes.iut.protocol.ShardedArrays)")


def uneven_shards(case: Case, iut: Adapter) -> Outcome:
    """A layer handed over as one array per device whose parts differ in size
    (8 kv heads over 3 devices: 2, 2 and 4). Refusing it is right; a manager
    that takes it must move every device's part of every block exactly."""
    arrays = iut.sharded_arrays()
    if arrays is None:
        return no_mesh(iut)
    dim, parts = UNEVEN
    shards, host, index = arrays.make_uneven_shards(case.shape, dim, parts, case.seed)
    blocks = case.shape.dims[0]
    sizes = [host[where].shape[dim] for where in index]
    if has_equal_rows(host):
        return Outcome(ERROR, SAME_BLOCKS)
    try:
        manager = iut.manager([shards], blocks)
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, f"parts of {sizes} along dimension {dim}: ")
    perm_a, perm_b = moving_permutations(blocks, case.seed + 1)
    expected = expected_after(host, perm_a, perm_b)
    try:
        iut.d2h(manager, perm_a, np.arange(blocks))
        iut.h2d(manager, np.arange(blocks), perm_b)
    except Exception as e:  # it took the parts: moving every block is its to do
        return Outcome(ERROR, f"the manager took parts of {sizes}, then failed a round trip: {first_line(e)}")
    for device, (cache, where) in enumerate(zip(shards, index)):
        wrong = wrong_rows(np.ascontiguousarray(arrays.fetch(cache)), np.ascontiguousarray(expected[where]))
        if wrong.any():
            return Outcome(CORRUPT, f"device {device} (holding {_index_text(where)}, parts {sizes}): "
                           f"{int(wrong.sum())} of {blocks} blocks differ after a permuted round trip")
    return Outcome(PASS, f"{blocks} blocks round-tripped over parts of {sizes}, every device's part exact")


def round_trips(case: Case, iut: Adapter, layers: list[tuple[str, kvref.ShapeKey]]) -> Outcome:
    """Each layer (sharding text, shape) made, then moved as one manager."""
    arrays = iut.sharded_arrays()
    if arrays is None:
        return no_mesh(iut)
    shardings = [text for text, _ in layers]
    pairs = [arrays.make_sharded_caches(key, kvref.Sharding.parse(text), [case.seed + i])[0]
             for i, (text, key) in enumerate(layers)]
    caches, hosts = [c for c, _ in pairs], [h for _, h in pairs]
    blocks = case.shape.dims[0]
    if any(has_equal_rows(h) for h in hosts):
        return Outcome(ERROR, SAME_BLOCKS)
    try:
        manager = iut.manager(caches, blocks)
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, f"{'; '.join(shardings)}: ")
    perm_a, perm_b = moving_permutations(blocks, case.seed + 1)
    target = 1  # then host block `source` into device block 1, which held another block
    source = (int(np.flatnonzero(perm_b == target)[0]) + 1) % blocks
    expected = [expected_after(h, perm_a, perm_b) for h in hosts]
    # Last, one run of RUN blocks across the middle out, and back as one run
    # across the three-quarter mark: each crosses where a split puts a shard boundary.
    run_from, run_to = blocks // 2 - RUN // 2, 3 * blocks // 4 - RUN // 2
    steps = [("a permuted round trip of every block", lambda: _round_trip(iut, manager, blocks, perm_a, perm_b)),
             (f"host block {source} into device block {target}",
              lambda: iut.h2d(manager, [source], [target])),
             (f"blocks [{run_from}, {run_from + RUN}) out as one run and back into [{run_to}, {run_to + RUN})",
              lambda: (iut.d2h(manager, [run_from], [0], [RUN]), iut.h2d(manager, [0], [run_to], [RUN])))]
    for i, (what, run) in enumerate(steps):
        try:
            run()
        except Exception as e:  # the manager took the cache: every global block id is its to move
            return Outcome(ERROR, f"the manager took {'; '.join(shardings)}, then failed {what}: {first_line(e)}")
        for want, host in zip(expected, hosts):
            if i == 1:
                want[target] = host[perm_a[source]]
            if i == 2:
                want[run_to: run_to + RUN] = want[run_from: run_from + RUN]
        wrong = _first_wrong_part(arrays, caches, expected)
        if wrong:
            return Outcome(CORRUPT, f"after {what}: {wrong}")
    return Outcome(PASS, f"{blocks} global blocks round-tripped, one moved alone and a run of {RUN} across shard "
                   f"boundaries, every device's part exact, over {'; '.join(shardings)}")


def _round_trip(iut: Adapter, manager, blocks: int, perm_a, perm_b) -> None:
    iut.d2h(manager, perm_a, np.arange(blocks))
    iut.h2d(manager, np.arange(blocks), perm_b)


def _first_wrong_part(arrays, caches, expected) -> str | None:
    """Where a device's part differs from its part of the expected contents."""
    for layer, (cache, want) in enumerate(zip(caches, expected)):
        for device, (index, got) in enumerate(arrays.fetch_shards(cache)):
            wrong = wrong_rows(np.ascontiguousarray(got), np.ascontiguousarray(want[index]))
            if wrong.any():
                first = int(np.argmax(wrong)) + (index[0].start or 0)
                return (f"layer {layer} device {device} (holding {_index_text(index)}): {int(wrong.sum())} "
                        f"of its {len(wrong)} blocks differ (first: global block {first})")
    return None


def _index_text(index: tuple[slice, ...]) -> str:
    return "[" + ",".join(f"{s.start or 0}:{s.stop}" if s.stop is not None else ":" for s in index) + "]"
