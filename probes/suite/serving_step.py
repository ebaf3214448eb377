"""The cache moves on between transfers, as it does under a serving engine."""

from __future__ import annotations

from probes.iut.adapter import Adapter
from probes.iut.host_data import random_host
from probes.suite.cases import Case
from probes.suite.refusals import refused
from probes.suite.roundtrip import permuted_round_trip
from probes.suite.verdicts import PASS, Outcome

LAYERS = 2


def serving_step(case: Case, iut: Adapter) -> Outcome:
    """Blocks are moved, then every cache is updated the way a serving engine
    updates it (an in-place op under DEFER_AND_FUSE on the simulated device and
    TorchTPU; on JAX a jitted step that donates the cache and returns the new
    one, which XLA may give the same buffer), then every block round-trips
    again. The manager must move the current contents byte-exact, or refuse
    with a clean error; a step that never returns is a HANG."""
    built = managed_layers(case, iut, LAYERS)
    if isinstance(built, Outcome):
        return built
    caches, manager = built
    rows = case.shape.dims[0]
    iut.d2h(manager, list(range(rows)), list(range(rows)))
    updated = [random_host(case.shape, case.seed + 100 + i, finite=True) for i in range(LAYERS)]
    caches = [iut.serving_step(cache, new) for cache, new in zip(caches, updated)]
    try:
        outcome = permuted_round_trip(iut, manager, caches, updated, case.seed)
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e, "after the serving step: ")
    if outcome.verdict == PASS:
        outcome.detail = f"after a serving step: {outcome.detail}"
    return outcome


def managed_layers(case: Case, iut: Adapter, layers: int):
    """(`layers` caches of the case's shape with distinct finite contents, a
    manager over them with a host block per row), or the Outcome of its
    clean refusal."""
    caches = [c for c, _ in iut.make_caches(case.shape, [case.seed + i for i in range(layers)], finite=True)]
    try:
        return caches, iut.manager(caches, case.shape.dims[0])
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e)
