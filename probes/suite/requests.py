"""Transfer requests that use every parameter, not only its default: runs of
several blocks (ending exactly at the last block), one source copied to
several places, one block, every block. Each d2h and h2d is held to the
block model (probes.suite.block_model), byte for byte."""

from __future__ import annotations

import kvref
from probes.iut.adapter import Adapter
from probes.suite.block_model import BlockModel
from probes.suite.cases import Case
from probes.suite.verdicts import CORRUPT, PASS, Outcome

LAYERS = 2
HOST_CHECKED = 32  # host blocks read back (reading far into a pool can be slow)


def requests(rows: int) -> dict[str, list[tuple[bool, list, list, list | None]]]:
    """Per kind, its (d2h?, src, dst, sizes) requests, in order, over a pool
    of `rows` host blocks."""
    last, h, every = rows - 1, rows, list(range(rows))
    return {
        # Runs of 3 and 2 ending at the last device block and the last host block.
        "runs_to_the_end": [(True, [rows - 3, 0], [h - 3, 0], [3, 2]),
                            (False, [h - 3, 0], [1, rows - 2], [3, 2])],
        # One device block to three host blocks; one host block to two device blocks.
        "repeated_sources": [(True, [5, 5, 5, 7], [0, 4, 9, 2], None),
                             (False, [9, 9, 2], [0, last, 3], None)],
        "one_block": [(True, [last], [h - 1], None), (False, [h - 1], [0], None)],
        "every_block": [(True, every, every, None), (False, every, every[::-1], None)],
    }


TRANSFER_KINDS = tuple(requests(64))


def transfer_parameters(case: Case, iut: Adapter) -> Outcome:
    """The kind's requests (case.kind), each waited for, then every device
    block and every host block written is compared with the block model."""
    pairs = iut.make_caches(case.shape, [case.seed + i for i in range(LAYERS)], finite=True)
    caches = [c for c, _ in pairs]
    layout = iut.layout(case.shape)
    rows = case.shape.dims[0]
    packed = [kvref.pack(h, layout).reshape(rows, -1) for _, h in pairs]
    model = BlockModel([[row.tobytes() for row in layer] for layer in packed], host_blocks=rows,
                       zeroed_pool=False)
    manager = iut.manager(caches, rows)
    plan = requests(rows)[case.kind]
    for d2h, src, dst, sizes in plan:
        iut.transfer(manager, d2h, src, dst, sizes)
        model.apply(d2h, src, dst, sizes)
    for layer, cache in enumerate(caches):
        got = kvref.pack(iut.fetch(cache), layout).reshape(rows, -1)
        for block in range(rows):
            if got[block].tobytes() != model.device[layer][block]:
                return Outcome(CORRUPT, f"{case.kind}: device block {block} of layer {layer} is not what "
                               "the requests put there")
        for block in sorted({*range(min(HOST_CHECKED, rows)), rows - 2, rows - 1}):
            want = model.host[layer][block]
            if want is not None and manager.read_block_bytes(layer, block) != want:
                return Outcome(CORRUPT, f"{case.kind}: host block {block} of layer {layer} is not what "
                               "the requests put there")
    return Outcome(PASS, f"{case.kind}: {len(plan)} requests, every device and host block as the model says")
