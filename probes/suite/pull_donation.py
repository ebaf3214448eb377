"""Pulls from a producer whose caches are donated to a model step in place
between pulls, as a prefill host's are: every forward donates them, and
the decode host pulls what the step wrote."""

from __future__ import annotations

import time

import numpy as np

from probes.iut.adapter import Adapter
from probes.iut.host_data import random_host
from probes.iut.protocol import NotInPlace
from probes.suite.cases import Case
from probes.suite.pull_sides import (PEER_WAIT_S, PRODUCER_SEED, PULL_TIMEOUT_S, SETTLE_GRACE_S, Side, endpoint_for,
                                     no_pulls, poll, pull_library, uuid_of)
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

STEPS = 12
BLOCKS = 16  # pulled after each step


def step_output(side: Side, layer: int, step: int) -> np.ndarray:
    """What the producer's step `step` leaves in a layer (both sides derive it)."""
    return random_host(side.layer_keys[layer], PRODUCER_SEED + layer + 1000 * (step + 1), finite=True)


def pull_across_donation(case: Case, iut: Adapter) -> Outcome:
    """The producer's manager is built once; then STEPS times its caches are
    donated to a step whose output aliases their storage, and a pull of
    BLOCKS blocks is registered while the step may still run. Each pull must
    land what that step wrote, byte-exact: PASS is the only correct verdict."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib)
    try:
        side.build()
        blocks = side.layer_keys[0].dims[0]
        for step in range(STEPS):
            rng = np.random.default_rng(case.seed + step)  # both sides draw the same pairs
            pairs = list(zip(*(rng.choice(blocks, BLOCKS, replace=False).tolist() for _ in range(2))))
            outcome = (_produce(side, step, [r for r, _ in pairs]) if side.producer
                       else _consume(side, step, pairs))
            if outcome is not None:
                return outcome
        return Outcome(PASS, f"{STEPS} in-place donating steps on the producer, each followed by a pull of "
                       f"{BLOCKS} blocks that landed what the step wrote, byte-exact")
    finally:
        side.close()


def _produce(side: Side, step: int, remote: list[int]) -> Outcome | None:
    outputs = [step_output(side, layer, step) for layer in range(len(side.caches))]
    try:
        side.caches = [side.iut.donating_step(c, o, True) for c, o in zip(side.caches, outputs)]
    except (NotInPlace, NotImplementedError) as e:
        side.rendezvous.post(f"registered-{step}", None)
        return Outcome(SKIP, f"this backend cannot make the step: {e}")
    uuid = uuid_of(side.case, step)
    try:
        if not side.manager.register_read(f"req-{step}", uuid, remote):
            raise RuntimeError("register_read said nothing needs to be transferred")
    except Exception as e:  # the peer must not wait out its limit for a registration that never comes
        side.rendezvous.post(f"registered-{step}", None)
        return Outcome(ERROR, f"after {step + 1} in-place donating steps, register_read failed: "
                       f"{type(e).__name__}: {e}")
    side.rendezvous.post(f"registered-{step}", side.manager.get_local_endpoints())
    side.rendezvous.wait(f"pulled-{step}", PEER_WAIT_S)
    return None


def _consume(side: Side, step: int, pairs: list[tuple[int, int]]) -> Outcome | None:
    endpoints = side.rendezvous.wait(f"registered-{step}", PEER_WAIT_S)
    if endpoints is None:
        return Outcome(SKIP, f"the producer stopped before registering pull {step} (its verdict says why)")
    try:
        started = time.monotonic()
        side.manager.start_read(f"req-{step}", uuid_of(side.case, step), endpoint_for(endpoints),
                                [r for r, _ in pairs], [l for _, l in pairs])
        settled = poll(side.manager, started, lambda s: s.state(f"req-{step}") != "unsettled",
                       PULL_TIMEOUT_S + SETTLE_GRACE_S)
    finally:
        side.rendezvous.post(f"pulled-{step}")
    if settled.state(f"req-{step}") != "done":
        return Outcome(ERROR, f"the pull after in-place donating step {step + 1} ended "
                       f"{settled.state(f'req-{step}')}")
    for layer in range(len(side.caches)):
        got = side.contents(layer)
        want = step_output(side, layer, step)
        for remote, local in pairs:
            if not np.array_equal(got[local].view(np.uint8), want[remote].view(np.uint8)):
                return Outcome(CORRUPT, f"after in-place donating step {step + 1}, layer {layer}: local block "
                               f"{local} does not hold what the step wrote to the producer's block {remote}")
    return None
