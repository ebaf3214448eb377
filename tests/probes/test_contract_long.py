"""A long run's growth per operation: the heap fitted to the operations
made, in all and per kind, on measured-alike samples made here."""

import numpy as np

from probes.suite.contract_long import Held, leaks

KINDS = ("transfer", "save", "wait", "load", "unlock", "fill", "rebuild", "store_call", "check")


def samples(per_kind: dict[str, float], phases: int = 200, seed: int = 0) -> list:
    """A run in phases of 50 steps, each favouring one kind (as long_run draws them): the heap grows by
    `per_kind` bytes per operation of each kind, plus 20 bytes per operation of any (what a correct manager
    and the harness show), plus an allocator's drift: a walk of some KiB a phase, as measured."""
    rng = np.random.default_rng(seed)
    counts, heap, made = dict.fromkeys(KINDS, 0), 50 << 20, []
    weights = np.array([1.0 if k != "rebuild" else 0.05 for k in KINDS])  # rebuilds are rare
    for phase in range(phases):
        favour = KINDS[phase % len(KINDS)]
        w = weights.copy()
        w[KINDS.index(favour)] += 4.0 * weights[KINDS.index(favour)]
        for kind in rng.choice(KINDS, 50, p=w / w.sum()):
            counts[kind] += 1
            heap += 20 + per_kind.get(kind, 0)
        heap += int(rng.normal(0, 8 << 10))
        made.append((dict(counts), Held(0, 0, 0, 0, heap)))
    return made


def test_a_correct_managers_run_shows_no_leak():
    for seed in range(5):
        assert leaks(samples({}, seed=seed)) == []


def test_a_leak_in_a_rare_kind_is_found_by_its_own_slope_where_the_total_hides_it():
    """4 KiB lost per rebuild, rebuilds rare, 40,000 steps: averaged over every operation the loss is under
    the total's bound, and the kind's own slope finds it in most runs (the drift hides it in some)."""
    by_kind = 0
    for seed in range(10):
        run = samples({"rebuild": 4096}, phases=800, seed=seed)
        later = run[len(run) // 2:]
        total = sum(later[-1][0].values()) - sum(later[0][0].values())
        rebuilds = later[-1][0]["rebuild"] - later[0][0]["rebuild"]
        assert 4096 * rebuilds / total + 20 < 64  # under the total's bound, averaged over every operation
        by_kind += any("bytes per rebuild" in said for said in leaks(run))
    assert by_kind >= 6


def test_a_leak_in_every_save_is_found_by_the_total():
    found = leaks(samples({"save": 1024, "fill": 1024}))
    assert found and "bytes per operation" in found[0], found
