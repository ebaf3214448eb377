"""Each probe earns PASS only for the property it is named for. Stand-ins
built from the reference break one thing at a time, in process, and each
probe must then refuse its PASS."""

import dataclasses
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvref
from probes.iut.adapter import IUT, Adapter
from probes.iut.reference import KvrefLibrary, SimArrays
from probes.suite.cases import Case
from probes.suite.construction import deferred_construction, host_transferred_construction
from probes.suite.host_budget import REBUILD_HOST_BLOCKS, host_budget
from probes.suite.plan_binding import plan_binding
from probes.suite.registry import PLAN_SHAPE, PROBES
from probes.suite.permutations import moving_permutations
from probes.suite.roundtrip import roundtrip

SHAPE = kvref.ShapeKey("bf16", (64, 8, 128))


def stand_in(arrays=SimArrays, library=KvrefLibrary, generation="tpu7x") -> Adapter:
    return Adapter(IUT("stand-in", arrays, library, targets=(generation,)), generation)


def case(probe, shape=SHAPE):
    return Case(probe, "tpu7x", "stand-in", probe, shape)


class ReadyArrays(SimArrays):
    """Caches that are materialized before anyone can see them pending."""

    def make_caches(self, key, seeds, mode="put", finite=False):
        made = super().make_caches(key, seeds, mode, finite)
        for cache, _ in made:
            cache.materialize()
            cache.await_buffer()
        return made


def test_deferred_construction_with_nothing_deferred_is_an_error():
    outcome = deferred_construction(case("deferred_construction"), stand_in(ReadyArrays))
    assert outcome.verdict == "ERROR" and outcome.detail.startswith("nothing deferred")
    assert outcome.pending_at_construction is False


def test_deferred_construction_passes_only_over_pending_caches():
    outcome = deferred_construction(case("deferred_construction"), stand_in())
    assert outcome.verdict == "PASS" and outcome.pending_at_construction is True
    assert "64 blocks round-tripped byte-exact" in outcome.detail


def test_landed_copies_skip_host_transferred_construction():
    outcome = host_transferred_construction(case("host_transferred_construction"), stand_in(ReadyArrays))
    assert outcome.verdict == "SKIP" and "none was in flight" in outcome.detail
    assert outcome.pending_at_construction is False


class IdleLibrary(KvrefLibrary):
    """A manager whose h2d moves nothing."""

    def transfer(self, manager, d2h, src, dst, sizes=None):
        if d2h:
            super().transfer(manager, d2h, src, dst, sizes)


class NoScrambleArrays(SimArrays):
    scrambles_in_place = False

    def scramble(self, cache):
        pass


def test_a_block_that_never_moves_is_seen_without_a_scramble():
    """With no in-place scramble and an h2d that does nothing, every block
    still holds its own old contents, and none of them is where it should be."""
    outcome = roundtrip(case("roundtrip"), stand_in(NoScrambleArrays, IdleLibrary))
    assert outcome.verdict == "CORRUPT" and "64 of 64 rows differ" in outcome.detail


@pytest.mark.parametrize("rows", [2, 3, 64, 513])
@pytest.mark.parametrize("seed", range(5))
def test_every_block_moves(rows, seed):
    perm_a, perm_b = moving_permutations(rows, seed)
    assert sorted(perm_a) == sorted(perm_b) == list(range(rows))
    assert (perm_a != perm_b).all()


def test_identical_blocks_cannot_prove_movement(monkeypatch):
    class FlatArrays(SimArrays):
        def make_caches(self, key, seeds, mode="put", finite=False):
            return [(self.device.zeros(key.dims, key.dtype), np.zeros(key.dims, kvref.element_type(key.dtype).numpy))
                    for _ in seeds]

    outcome = roundtrip(case("roundtrip"), stand_in(FlatArrays))
    assert outcome.verdict == "ERROR" and "two blocks hold the same bytes" in outcome.detail


class ForgetfulLibrary(KvrefLibrary):
    """Registers plans, and reads every one back as the first it was given."""

    def manager(self, caches, host_blocks, **options):
        manager = super().manager(caches, host_blocks, **options)
        first = []

        def active_plan(uuid):
            first.append(uuid)
            return kvref.KVCacheManager.active_plan(manager, first[0])

        manager.active_plan = active_plan
        return manager


def test_plan_binding_reads_each_plan_back():
    outcome = plan_binding(case("plan_binding", PLAN_SHAPE), stand_in(library=ForgetfulLibrary))
    assert outcome.verdict == "CORRUPT" and "message plan p1 reads back as" in outcome.detail
    assert plan_binding(case("plan_binding", PLAN_SHAPE), stand_in()).verdict == "PASS"


class UnreportedPoolLibrary(KvrefLibrary):
    """A manager on dense arrays that reports no pool and allocates none."""

    def manager(self, caches, host_blocks, **options):
        return dataclasses.make_dataclass("NoPool", [("host_bytes", object, None)])()


class DenseSimArrays(SimArrays):
    layout_of = staticmethod(lambda generation, key: (kvref.Shape(key.dtype, key.dims), "dense"))

    def make_caches(self, key, seeds, mode="put", finite=False):
        return [(None, None) for _ in seeds]


def test_host_budget_judges_a_pool_it_is_not_told_by_its_growth():
    outcome = host_budget(case("host_budget", PROBES["host_budget"].subject),
                          stand_in(DenseSimArrays, UnreportedPoolLibrary))
    assert outcome.verdict == "ERROR" and "its size cannot be judged" in outcome.detail


class SilentPoolLibrary(KvrefLibrary):
    """The reference's manager, but it does not report its pool: its size is
    judged by the address space, as for a library that reports none. With
    `extra`, each manager also maps that share of its pool again and keeps it."""

    extra = 0.0
    kept: list = []

    def manager(self, caches, host_blocks, **options):
        manager = super().manager(caches, host_blocks, **options)
        if self.extra:
            self.kept.append(np.zeros(int(manager.host_bytes * self.extra), np.uint8))  # mapped, untouched
        return dataclasses.replace(SilentView(manager), host_bytes=None)


@dataclasses.dataclass(frozen=True)
class SilentView:
    manager: kvref.KVCacheManager
    host_bytes: int | None = 0

    @property
    def layer_bytes_per_block(self):
        return self.manager.layer_bytes_per_block

    @property
    def num_shards(self):
        return self.manager.num_shards


class OversizedPoolLibrary(SilentPoolLibrary):
    extra = 0.5


class ShortMeasuredPoolLibrary(SilentPoolLibrary):
    """Each manager of twice the blocks is built while two pages mapped
    before it are given back: its growth measures 8 KiB short, as when
    another mapping of the process ends during the measurement."""

    spare: list = []

    def manager(self, caches, host_blocks, **options):
        if host_blocks == 2 * REBUILD_HOST_BLOCKS:
            self.spare.pop().close()
        manager = super().manager(caches, host_blocks, **options)
        self.spare.extend(mmap.mmap(-1, 8192) for _ in range(2))
        return manager


def repeated_construction_alone(library: str) -> tuple[str, str]:
    """The probe over `library` in a process of its own, as a worker runs it:
    it measures the process's memory, which this one's leftover threads
    (other tests' listeners and pulls) change when they end."""
    script = ("from probes.suite.host_budget import repeated_construction\n"
              f"from tests.probes.test_earned_verdicts import PROBES, {library}, case, stand_in\n"
              "outcome = repeated_construction(case('repeated_construction', "
              "PROBES['repeated_construction'].subject), "
              f"stand_in(library={library}))\n"
              "print(outcome.verdict.value, outcome.detail)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    verdict, _, detail = done.stdout.strip().splitlines()[-1].partition(" ")
    return verdict, detail


def test_repeated_construction_measures_a_pool_it_is_not_told():
    verdict, detail = repeated_construction_alone("SilentPoolLibrary")
    assert verdict == "PASS", detail
    verdict, detail = repeated_construction_alone("OversizedPoolLibrary")
    assert verdict == "ERROR" and "bytes of memory per host block" in detail, detail
    verdict, detail = repeated_construction_alone("ShortMeasuredPoolLibrary")  # within 1% short: judged
    assert verdict == "PASS", detail


class TrustingPlansLibrary(KvrefLibrary):
    """Registers any plan that parses, without looking at what it names."""

    def manager(self, caches, host_blocks, **options):
        manager = super().manager(caches, host_blocks, **options)
        plans = {}

        def register_active_plan(uuid, request, is_sender):
            if isinstance(request, str):
                raise TypeError("str")
            try:
                message = request if hasattr(request, "SerializeToString") else \
                    kvref.StartTransferRequest.FromString(request)
            except Exception as e:  # a clean refusal of bytes that do not parse
                raise ValueError(f"malformed: {e}") from None
            plans[uuid] = {"uuid": message.uuid, "peer": message.peer, "layer_ids": list(message.layer_ids),
                           "src_block_ids": list(message.src_block_ids),
                           "dst_block_ids": list(message.dst_block_ids), "is_sender": is_sender}

        def active_plan(uuid):
            return plans[uuid]

        manager.register_active_plan, manager.active_plan = register_active_plan, active_plan
        return manager


def test_plan_binding_needs_invalid_plans_refused():
    outcome = plan_binding(case("plan_binding", PLAN_SHAPE), stand_in(library=TrustingPlansLibrary))
    assert outcome.verdict == "ERROR" and "out-of-range block plan was accepted" in outcome.detail


class UnheldArrays(SimArrays):
    """The simulated device, whose copies cannot be held from outside (as a TPU's)."""

    def hold_copies(self, cache, seconds, until_step=False):
        return False


class LandedLibrary(KvrefLibrary):
    """The reference, whose every transfer has landed when its call returns."""

    def start(self, manager, d2h, src, dst, sizes=None):
        pending = super().start(manager, d2h, src, dst, sizes)
        pending.wait()
        return pending

    def save(self, manager, src, sizes=None):
        chunks, pending = super().save(manager, src, sizes)
        pending.wait()
        return chunks, pending


class SilentFutures(KvrefLibrary):
    """The reference, whose futures cannot say whether they are done."""

    def start(self, manager, d2h, src, dst, sizes=None):
        return _Opaque(super().start(manager, d2h, src, dst, sizes))


class _Opaque:
    def __init__(self, pending):
        self.pending = pending

    def wait(self):
        self.pending.wait()


ORDERING_KINDS = ("h2d_then_step", "d2h_then_h2d_same_chunk", "d2h_then_overwrite")


@pytest.mark.parametrize("kind", ORDERING_KINDS)
def test_unawaited_transfers_that_never_overlapped_are_an_error(kind):
    """Copies that land before the next thing is issued exercise no ordering:
    ERROR "nothing in flight", whatever the bytes say; and where the future
    cannot tell, the overlap is not assumed."""
    from probes.suite.ordering import unawaited_transfers

    probe_case = dataclasses.replace(case("unawaited_transfers"), kind=kind)
    landed = unawaited_transfers(probe_case, stand_in(UnheldArrays, LandedLibrary))
    assert landed.verdict == "ERROR" and landed.detail.startswith("nothing in flight: "), landed.detail
    silent = unawaited_transfers(probe_case, stand_in(UnheldArrays, SilentFutures))
    assert silent.verdict == "ERROR" and "cannot say whether it is done" in silent.detail, silent.detail
    held = unawaited_transfers(probe_case, stand_in())
    assert held.verdict == "PASS", held.detail


@pytest.mark.parametrize("kind", ["save_in_flight", "exit_in_flight"])
def test_a_save_dropped_after_it_landed_is_an_error(kind):
    """Dropping a manager with a save in flight needs the save seen running."""
    from probes.suite.robustness import release_order

    probe_case = dataclasses.replace(case("release_order", PLAN_SHAPE), kind=kind)
    landed = release_order(probe_case, stand_in(UnheldArrays, LandedLibrary))
    assert landed.verdict == "ERROR" and landed.detail.startswith("nothing in flight: "), landed.detail
    if kind == "save_in_flight":  # the other leaves its save to this process's exit
        held = release_order(probe_case, stand_in())
        assert held.verdict == "PASS" and "still running" in held.detail, held.detail


def test_a_save_against_a_step_that_has_ended_is_an_error():
    from probes.suite.ordering import inflight_step

    class DoneSteps(SimArrays):
        def dispatch_step(self, cache, new):
            cache = super().dispatch_step(cache, new)
            cache.await_buffer()
            return cache

    outcome = inflight_step(case("inflight_step"), stand_in(DoneSteps))
    assert outcome.verdict == "ERROR" and outcome.detail.startswith("nothing in flight"), outcome.detail
    assert "in each of 3 round(s)" in outcome.detail, outcome.detail


def test_a_step_that_ended_first_is_tried_again_on_fresh_caches():
    """Where no step can be held (JAX), a loaded machine may let the first
    one end before the save: the next round's step still runs, and is probed."""
    from probes.suite.ordering import inflight_step

    class FirstStepsDone(SimArrays):
        ended = 0

        def dispatch_step(self, cache, new):
            cache = super().dispatch_step(cache, new)
            if FirstStepsDone.ended < 2:  # both layers of the first round
                FirstStepsDone.ended += 1
                cache.await_buffer()
            return cache

    outcome = inflight_step(case("inflight_step"), stand_in(FirstStepsDone))
    assert FirstStepsDone.ended == 2 and outcome.verdict == "PASS", outcome.detail


class ZeroedSaveLibrary(KvrefLibrary):
    """Its save lands, then its first chunk is zeroed."""

    def save(self, manager, src, sizes=None):
        chunks, pending = super().save(manager, src, sizes)
        pending.wait()
        manager.write_block_bytes(0, chunks[0], bytes(len(manager.read_block_bytes(0, chunks[0]))))
        return chunks, pending


class ShortLoadLibrary(KvrefLibrary):
    """Its load leaves out the first block it is given."""

    def start(self, manager, d2h, src, dst, sizes=None):
        if not d2h:
            src, dst = src[1:], dst[1:]
        return super().start(manager, d2h, src, dst, sizes)


def test_inflight_step_sees_a_wrong_save_and_a_short_load():
    from probes.suite.ordering import inflight_step

    zeroed = inflight_step(case("inflight_step"), stand_in(library=ZeroedSaveLibrary))
    assert zeroed.verdict == "CORRUPT" and "neither the step's bytes nor the old ones" in zeroed.detail, \
        zeroed.detail
    short = inflight_step(case("inflight_step"), stand_in(library=ShortLoadLibrary))
    assert short.verdict == "CORRUPT" and "with 1 loaded blocks missing" in short.detail, short.detail


def test_a_producer_killed_before_its_pull_moved_anything_says_so(monkeypatch):
    """The producer of pull_failures/producer_killed dies once a share of the
    pull has crossed lo, or at a deadline; it tells its consumer which, and
    the consumer's PASS needs the first (else ERROR "nothing in flight")."""
    from probes.suite import pull_failures
    from probes.iut.sockets import loopback_bytes

    monkeypatch.setattr(pull_failures, "KILL_WAIT_S", 0.05)
    assert pull_failures._until_under_way(loopback_bytes() + 1e18) is False
    assert pull_failures._until_under_way(0) is True


@pytest.mark.parametrize("rows, dtype", [(1, np.uint8), (7, np.float32), (300, np.uint16), (129, np.int8)])
def test_a_round_trip_is_judged_row_by_row_as_against_the_whole_expected_copy(rows, dtype):
    from probes.suite.permutations import expected_after, moving_permutations, wrong_after, wrong_rows

    rng = np.random.default_rng(rows)
    host = rng.integers(0, 100, size=(rows, 3, 40)).astype(dtype)
    perm_a, perm_b = moving_permutations(rows, rows)
    got = expected_after(host, perm_a, perm_b)
    assert not wrong_after(got, host, perm_a, perm_b).any()
    broken = rng.choice(rows, max(1, rows // 5), replace=False)
    got[broken, 1, 7] += 1
    assert (wrong_after(got, host, perm_a, perm_b) == wrong_rows(got, expected_after(host, perm_a, perm_b))).all()
    assert set(np.flatnonzero(wrong_after(got, host, perm_a, perm_b))) == set(broken)
