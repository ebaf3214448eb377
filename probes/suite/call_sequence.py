"""A random call sequence against an implementation under test: caches made
ready or pending, a manager over them, then d2h and h2d requests, valid and
invalid, some split between two threads, every one held to BlockModel. A
valid request must move exactly its blocks; an invalid one must be refused
cleanly (the library's own refusal) with no byte changed. The sequences come
from probes.fuzz.sequences (`kvprobe fuzz`)."""

from __future__ import annotations

import threading

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.suite.block_model import BlockModel
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.verdicts import CORRUPT, ERROR, PASS, Outcome


def call_sequence(case: Case, iut: Adapter) -> Outcome:
    """One random call sequence (case.calls) against the IUT, every call held
    to a model of the blocks; the first call that breaks it is the verdict."""
    spec = case.calls
    key = kvref.ShapeKey.parse(spec["shape"])
    pairs = iut.make_caches(key, [case.seed + i for i in range(spec["layers"])], spec["mode"], finite=True)
    caches = [c for c, _ in pairs]
    if spec["mode"] != "deferred":
        # Ready before the first call: a copy still landing would make the
        # sequence's verdict depend on the machine's speed (the landing race
        # has its own probes, which open its window on purpose).
        for cache in caches:
            iut.fetch(cache)
    try:
        manager = iut.manager(caches, spec["host_blocks"])
    except Exception as e:  # a clean refusal here is a finding too: these layouts are addressable
        return Outcome(ERROR, f"construction refused or failed: {first_line(e)}")
    layout = iut.layout(key)
    block = manager.layer_bytes_per_block[0]
    # From what the caches were made of: reading them now would wait for them.
    model = BlockModel([_physical_blocks(host, layout, block) for _, host in pairs],
                       host_blocks=spec["host_blocks"], zeroed_pool=False)
    wrong = held(spec["calls"], model,
                 transfer=lambda r: iut.transfer(manager, r["d2h"], r["src"], r["dst"], r["sizes"]),
                 refuses=iut.refuses,
                 device_blocks=lambda: [_physical_blocks(iut.fetch(cache), layout, block) for cache in caches],
                 host_block=manager.read_block_bytes)
    if wrong is not None:
        return Outcome(*wrong)
    return Outcome(PASS, f"{len(spec['calls'])} calls held to the model")


# The sequence's one runner: call_sequence's, and (copied by
# probes.run.reproducers) a reproducer's against the library alone. It knows
# the manager only through the four functions it is given.
def held(calls: list, model, transfer, refuses, device_blocks, host_block) -> tuple[str, str] | None:
    """Each call made (`transfer(request)`) and held to `model`, then every
    device block (`device_blocks()`: per layer, its blocks' bytes) and every
    host block written so far (`host_block(layer, block)`); the verdict and
    why for the first call that breaks it, or None."""
    for index, call in enumerate(calls):
        wrong = _one(call, model, transfer, refuses) or _check(model, device_blocks, host_block)
        if wrong is not None:
            return wrong[0], f"call {index} {call}: {wrong[1]}"
    return None


def _one(call: dict, model, transfer, refuses) -> tuple[str, str] | None:
    """What is wrong with one call (a request, or two at once on two threads), or None."""
    if "concurrent" in call:
        errors = []

        def run(request):
            try:
                transfer(request)
            except Exception as e:  # collected: a valid request must not fail
                errors.append(first_line(e))

        threads = [threading.Thread(target=run, args=(r,)) for r in call["concurrent"]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            return ERROR, f"a valid request on one of two threads failed: {errors[0]}"
        for request in call["concurrent"]:
            model.apply(request["d2h"], request["src"], request["dst"], request["sizes"])
        return None
    problem = model.problem(call["d2h"], call["src"], call["dst"], call["sizes"])
    try:
        transfer(call)
    except Exception as e:  # a refusal, judged against the model
        if problem is None:
            return ERROR, f"a valid request was refused: {first_line(e)}"
        if not refuses(e):
            return ERROR, f"refused with a failure, not a clean refusal: {first_line(e)}"
        return None
    if problem is not None:
        return ERROR, f"accepted silently; it should be refused: {problem}"
    model.apply(call["d2h"], call["src"], call["dst"], call["sizes"])
    return None


def _check(model, device_blocks, host_block) -> tuple[str, str] | None:
    """Every device block and every host block written so far, against the model, or None."""
    for layer, device in enumerate(device_blocks()):
        wrong = [i for i, (got, want) in enumerate(zip(device, model.device[layer]))
                 if want is not None and got != want]
        if wrong:
            return CORRUPT, f"layer {layer}: device blocks {wrong[:8]} differ from the model"
        host = [i for i in range(model.host_blocks)
                if model.host[layer][i] is not None and host_block(layer, i) != model.host[layer][i]]
        if host:
            return CORRUPT, f"layer {layer}: host blocks {host[:8]} differ from the model"
    return None


def _physical_blocks(logical: np.ndarray, layout: kvref.Shape, block: int) -> list[bytes]:
    physical = kvref.pack(logical, layout)
    return [physical[i:i + block].tobytes() for i in range(0, physical.size, block)]
