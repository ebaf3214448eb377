"""Model steps that donate the caches, as a serving engine's runner makes
every forward: the manager is built once, and each step's output either
aliases the donated storage (XLA writes it in place) or lives elsewhere."""

from __future__ import annotations

import numpy as np

import kvref
from kvref.oracle.table_shapes import SMALL_CACHES
from probes.iut.adapter import Adapter
from probes.iut.host_data import random_host
from probes.iut.protocol import NotInPlace
from probes.suite.cases import Case
from probes.suite.permutations import has_equal_rows, wrong_rows
from probes.suite.refusals import refused
from probes.suite.serving_step import managed_layers
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

SUBJECT = kvref.ShapeKey(*SMALL_CACHES[-1])  # a small serving cache, bf16[64,16,8,128]: its layouts ship in the table
LAYERS = 2
STEPS = 12  # as many forwards as the connectors are driven through
MOVED = 4  # blocks saved and loaded back elsewhere after each step


def donation_in_place(case: Case, iut: Adapter) -> Outcome:
    """The manager is built once; then STEPS model steps each take the
    caches donated and write their outputs into the same storage (XLA's
    aliasing of a donated buffer, checked by the arrays). After each step,
    while it may still run, MOVED blocks are saved (d2h_auto_allocate) and
    loaded back into other blocks (h2d from the saved chunks): the cache
    must then hold the step's output with those blocks replaced by what the
    save read, byte-exact. Refusing is a failure: this is the pattern
    serving is built on. Where no step was still running when its save was
    issued, the overlap was not exercised: ERROR "nothing in flight"."""
    return _across_steps(case, iut, in_place=True)


def donation_moved(case: Case, iut: Adapter) -> Outcome:
    """A model step whose output does not alias the donated cache: the output
    lives in storage of its own and the cache's is given up. The next save
    and load must be refused cleanly, or move the output's blocks exactly;
    a manager that still addresses the storage given up saves what the step
    left behind and loads where nothing reads (CORRUPT)."""
    return _across_steps(case, iut, in_place=False)


def _across_steps(case: Case, iut: Adapter, in_place: bool) -> Outcome:
    built = managed_layers(case, iut, LAYERS)
    if isinstance(built, Outcome):
        return built
    caches, manager = built
    rows = case.shape.dims[0]
    steps = STEPS if in_place else 1
    running = 0
    for step in range(steps):
        outputs = [random_host(case.shape, case.seed + 1000 * (step + 1) + i, finite=True) for i in range(LAYERS)]
        if any(has_equal_rows(output) for output in outputs):
            return Outcome(ERROR, f"step {step}: two blocks of a step's output hold the same bytes, so a block "
                           "that did not move could pass")
        try:
            caches = [iut.donating_step(cache, output, in_place) for cache, output in zip(caches, outputs)]
        except (NotInPlace, NotImplementedError) as e:
            return Outcome(SKIP, f"this backend cannot make the step: {e}")
        running += any(iut.is_pending(cache) for cache in caches)
        saved, loaded = _blocks(rows, case.seed + step)
        try:
            chunks, pending = iut.save(manager, saved)
            pending.wait()
            iut.h2d(manager, chunks, loaded)
            iut.unlock(manager, chunks)
        except Exception as e:  # a clean refusal, or the worker's ERROR
            return refused(iut, e, f"after {step + 1} {_kind(in_place)} steps: ")
        for layer, (cache, output) in enumerate(zip(caches, outputs)):
            expected = output.copy()
            expected[loaded] = output[saved]
            wrong = wrong_rows(iut.fetch(cache), expected)
            if wrong.any():
                return Outcome(CORRUPT, f"after {step + 1} {_kind(in_place)} steps, layer {layer}: "
                               f"{int(wrong.sum())} of {rows} blocks differ (first: block {int(np.argmax(wrong))}; "
                               f"blocks {list(saved)} saved and loaded into {list(loaded)})",
                               host_bytes=manager.host_bytes)
    if in_place and not running:
        return Outcome(ERROR, f"nothing in flight: none of {steps} steps was still running when its save was "
                       "issued, so saving beside a running step was not exercised")
    overlap = f", {running} of them still running when their save was issued" if in_place else ""
    return Outcome(PASS, f"{steps} {_kind(in_place)} step(s){overlap}: {MOVED} blocks a step saved and "
                   "loaded elsewhere, byte-exact", host_bytes=manager.host_bytes)


def _blocks(rows: int, seed: int) -> tuple[list[int], list[int]]:
    """MOVED blocks to save and MOVED others to load them into."""
    chosen = np.random.default_rng(seed).choice(rows, 2 * MOVED, replace=False)
    return [int(b) for b in chosen[:MOVED]], [int(b) for b in chosen[MOVED:]]


def _kind(in_place: bool) -> str:
    return "in-place donating" if in_place else "non-aliasing donating"
