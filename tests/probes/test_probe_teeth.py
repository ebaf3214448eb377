"""Every probe, run through the watched runner, fails against the fault model
it exists for and earns the predicted verdict against the fixed reference."""

import pytest

from kvref import Faults, ShapeKey
from probes.suite.cases import Case
from probes.suite.predict import describe, prediction
from probes.suite.registry import probe as declared
from probes.suite.verdicts import Prediction
from tests.batch import BATCH_SECONDS, run_selected

pytestmark = pytest.mark.timeout(BATCH_SECONDS)  # the first test waits for the module's cases

TEETH = [
    # probe, dtype, dims, fault models, verdict under them
    ("roundtrip", "bf16", (512, 6144), ["legacy_slice_formula"], "CORRUPT"),
    ("roundtrip", "s8", (512, 12288), ["legacy_slice_formula"], "CORRUPT"),
    ("roundtrip", "bf16", (512, 16, 128), ["loads_neighbouring_chunk"], "CORRUPT"),
    ("roundtrip", "bf16", (512, 16, 128), ["saves_neighbouring_block"], "CORRUPT"),
    ("deferred_construction", "bf16", (512, 16, 2048), ["no_materialize_before_await"], "HANG"),
    ("host_transferred_construction", "bf16", (512, 16, 2048), ["no_await_before_transfer"], "ERROR"),
    ("mixed_slices", "", (), ["allow_mixed_slices"], "CORRUPT"),
    ("plan_binding", "", (), ["str_only_plan_binding"], "ERROR"),
    ("host_budget", "", (), ["legacy_slice_formula", "no_host_budget"], "ERROR"),
    # The simulated DMA engine refuses a buffer with in-place ops still pending.
    ("serving_step", "", (), ["buffer_resolved_once"], "ERROR"),
    # Donating steps: an address kept from construction after the storage was given up, and
    # aliased storage refused.
    ("donation_moved", "", (), ["stale_storage_address"], "CORRUPT"),
    ("donation_in_place", "", (), ["refuses_donated_storage"], "REJECTED"),
    # The offload connector's calls (probe/kind).
    ("host_chunks/fill_then_one_more", "", (), ["leaky_refused_allocation"], "ERROR"),
    ("host_chunks/refused_saves", "", (), ["leaky_refused_allocation"], "ERROR"),
    ("host_chunks/bad_unlocks", "", (), ["unchecked_unlock"], "ERROR"),
    ("inflight_step", "", (), ["no_await_before_transfer"], "ERROR"),
    ("unawaited_transfers/h2d_then_step", "", (), ["unfenced_copies"], "CORRUPT"),
    ("unawaited_transfers/d2h_then_h2d_same_chunk", "", (), ["unordered_transfers"], "CORRUPT"),
    # The step overwrites the bytes a copy held until the step has run (CORRUPT), or the device refuses
    # the copies that meet the running step (ERROR); never a PASS, however loaded the machine.
    ("unawaited_transfers/d2h_then_overwrite", "", (), ["unfenced_copies"], "CORRUPT|ERROR"),
    ("transfer_parameters/runs_to_the_end", "", (), ["runs_as_single_blocks"], "CORRUPT"),
    ("settings/timeout_nan", "", (), ["unchecked_settings"], "ERROR"),
    ("settings/parallelism_zero", "", (), ["unchecked_settings"], "ERROR"),
    ("repeated_construction", "", (), ["leaked_pool"], "ERROR"),
    # Caches over a mesh: the other devices' parts never move, or a global
    # block id is taken as every device's own.
    ("sharded_roundtrip/heads", "", (), ["first_shard_only"], "CORRUPT"),
    ("sharded_roundtrip/replicated", "", (), ["first_shard_only"], "CORRUPT"),
    ("block_sharded/blocks", "", (), ["block_ids_on_every_shard"], "ERROR"),
    ("block_sharded/blocks_and_heads", "", (), ["first_shard_only"], "CORRUPT"),
    ("block_sharded/mixed_layers", "", (), ["block_ids_on_every_shard"], "ERROR"),
    ("uneven_shards", "", (), ["unchecked_shard_shapes"], "CORRUPT|ERROR"),
    ("block_sharded/blocks", "", (), ["runs_as_single_blocks"], "CORRUPT"),  # a run across shard boundaries
    # The port a serving stack names for a manager.
    ("constructor_ports/named_port", "", (), ["named_port_ignored"], "ERROR"),
    ("constructor_ports/port_of_a_manager", "", (), ["shared_listen_port"], "ERROR"),
    ("constructor_ports/port_held_elsewhere", "", (), ["busy_port_falls_back"], "ERROR"),
    # Managers across os.fork(): a child left with its parent's copy threads.
    ("fork_forms/pool_in_child", "", (), ["pool_kept_across_fork"], "HANG"),
    ("fork_forms/slots_in_child", "", (), ["pool_kept_across_fork"], "HANG"),
    ("fork_forms/inherited_call", "", (), ["pool_kept_across_fork"], "HANG"),
    # Pulls between two managers, each case a producer and a consumer worker.
    ("pull_blocks/permuted", "", (), ["pull_pairs_sorted"], "CORRUPT"),
    ("pull_blocks/permuted", "", (), ["pull_written_one_block_off"], "CORRUPT"),
    ("pull_blocks/subset", "", (), ["pull_never_reports"], "ERROR"),
    ("pull_blocks/mixed_block_sizes", "", (), ["duplicate_reports"], "ERROR"),
    ("pull_reuse", "", (), ["settled_uuid_served_stale"], "CORRUPT|ERROR"),
    ("pull_concurrent", "", (), ["registrations_keyed_by_blocks"], "ERROR"),
    ("pull_refusals/lengths", "", (), ["late_refusal"], "ERROR"),
    ("pull_refusals/local_out_of_range", "", (), ["late_refusal"], "ERROR"),
    ("pull_failures/connection_refused", "", (), ["lost_pull_unsettled"], "ERROR"),
    ("pull_failures/producer_killed", "", (), ["lost_pull_unsettled"], "ERROR"),
    ("pull_failures/producer_killed", "", (), ["lost_peer_seen_at_timeout"], "ERROR"),
    ("pull_failures/connection_refused", "", (), ["lost_peer_seen_at_timeout"], "ERROR"),
    ("pull_failures/producer_killed", "", (), ["partial_pull_written"], "CORRUPT"),
    ("pull_refusals/settings", "", (), ["unchecked_settings"], "ERROR"),
    ("pull_sockets", "", (), ["offload_only_listens"], "ERROR"),
    ("pull_blocks/sharded", "", (), ["first_shard_only"], "CORRUPT|ERROR"),
    ("pull_blocks/broadcast", "", (), ["sub_manager_serves_own_parts"], "CORRUPT"),
    ("shared_pool", "", (), ["shm_segment_left"], "ERROR"),
    ("pull_across_donation", "", (), ["refuses_donated_storage"], "ERROR"),
    ("pull_blocks/parallel", "", (), ["parallel_pull_drops_remainder"], "ERROR|CORRUPT"),
    # Pulls among more than two managers.
    ("pull_fan/fan_out", "", (), ["registrations_keyed_by_blocks"], "ERROR"),
    ("pull_fan/fan_in", "", (), ["pull_route_reused"], "ERROR"),
    ("pull_fan/settled_once", "", (), ["settled_registration_served"], "ERROR"),
    # The consumer's telemetry of its pulls.
    ("pull_telemetry/sizes", "", (), ["metrics_uniform_layers"], "ERROR"),
    ("pull_telemetry/stages", "", (), ["metrics_last_byte_unset"], "ERROR"),
    ("pull_telemetry/uuid_slots", "", (), ["metrics_by_uuid_slot"], "ERROR"),
    ("pull_telemetry/req_id_text", "", (), ["metrics_json_unescaped"], "ERROR"),
    # Host blocks moved between two managers' host pools.
    ("host_to_host/read", "", (), ["host_pairs_sorted"], "CORRUPT"),
    ("host_to_host/write", "", (), ["host_pairs_sorted"], "CORRUPT"),
    ("host_to_host/write", "", (), ["host_write_unclaimed"], "CORRUPT"),
    # The store of saved blocks beside the manager.
    ("kv_store/prefix_lookup", "", (), ["store_lookup_skips_misses"], "CORRUPT"),
    ("kv_store/pinned_kept", "", (), ["store_evicts_pinned"], "CORRUPT"),
    ("kv_store/all_or_nothing", "", (), ["store_partial_insert"], "CORRUPT"),
    ("kv_store/lru_order", "", (), ["store_fifo_eviction"], "CORRUPT"),
    ("kv_store/bad_arguments", "", (), ["store_unchecked_lengths"], "CORRUPT"),
]


def case(probe, dtype, dims, faults=(), timeout=20.0):
    probe, _, kind = probe.partition("/")
    shape = ShapeKey(dtype, dims) if dtype else declared(probe).subject
    name = f"{probe}-{kind}" if kind else str(shape)
    timeout = max(timeout, declared(probe).timeout or 0)  # as a run's matrix gives it
    return Case(probe, "tpu7x", "kvref-sim", name, shape, Faults.parse(faults), timeout, kind=kind)


def fault_case(probe, dtype, dims, faults, verdict):
    return case(probe, dtype, dims, faults, timeout=4.0 if verdict == "HANG" else 20.0)


def jax_case(probe):
    name, _, kind = probe.partition("/")
    return Case(name, "cpu", "kvref-jax", f"{name}-{kind}" if kind else name, declared(name).subject, kind=kind)


def facade_case(probe, faults=()):
    name, _, kind = probe.partition("/")
    return Case(name, "cpu", "kvref-compat", probe.replace("/", "-"), declared(name).subject,
                Faults.parse(faults), kind=kind)


ADDRESSABLE = ("bf16", (512, 16, 2048))
STACKS_CASE = case("deferred_construction", *ADDRESSABLE, ["no_materialize_before_await"], timeout=2.0)
JAX_CPU_CASE = Case("roundtrip", "cpu", "kvref-jax", "f32", ShapeKey("f32", (64, 4, 128)))

# Probes of the wrapper's own settings, which only the facade (kvref-compat) takes.
FACADE_TEETH = [
    ("worker_registration/no_controller", ["worker_without_controller"], "ERROR"),
    ("worker_registration/registers", ["registered_requested_port"], "ERROR"),
    ("worker_registration/named_worker_port", ["worker_port_ignored"], "ERROR"),
    ("worker_registration/second_worker_port", ["worker_port_shared"], "ERROR"),
    ("worker_registration/controller_unreachable", ["registration_waits_for_controller"], "ERROR"),
]

# The cases each test reads, by test: the module's selected tests' cases run at once.
CASES_OF = {
    "test_probe_catches_its_fault_model": lambda **p: [fault_case(**p)],
    "test_fixed_reference_earns_the_prediction": lambda probe, dtype, dims: [case(probe, dtype, dims)],
    "test_addressable_shapes_pass": lambda probe: [case(probe, *ADDRESSABLE)],
    "test_hang_keeps_the_stacks": lambda: [STACKS_CASE],
    "test_reference_on_jax_cpu_arrays": lambda: [JAX_CPU_CASE],
    "test_reference_moves_sharded_jax_arrays": lambda probe: [jax_case(probe)],
    "test_the_facade_iut_carries_the_fault_models_to_the_reference_beneath":
        lambda probe, faults: [facade_case(probe), facade_case(probe, faults)],
    "test_facade_probe_catches_its_fault_model":
        lambda probe, faults, verdict: [facade_case(probe), facade_case(probe, faults)],
}


@pytest.fixture(scope="module")
def ran(request):
    return run_selected(request, CASES_OF)


@pytest.mark.parametrize("probe, dtype, dims, faults, verdict", TEETH)
def test_probe_catches_its_fault_model(ran, probe, dtype, dims, faults, verdict):
    c = fault_case(probe, dtype, dims, faults, verdict)
    outcome = ran[c].outcome
    assert Prediction.parse(verdict).admits(outcome.verdict), outcome.detail  # e.g. CORRUPT|ERROR
    assert not prediction(c).admits(outcome.verdict)


@pytest.mark.parametrize("probe, dtype, dims", sorted({(p, t, d) for p, t, d, _, _ in TEETH}))
def test_fixed_reference_earns_the_prediction(ran, probe, dtype, dims):
    c = case(probe, dtype, dims)
    assert prediction(c).admits(ran[c].outcome.verdict), ran[c].outcome.detail


@pytest.mark.parametrize("probe", ["roundtrip", "deferred_construction", "host_transferred_construction"])
def test_addressable_shapes_pass(ran, probe):
    c = case(probe, *ADDRESSABLE)
    assert describe(c)["predicted"] == "PASS"
    assert ran[c].outcome.verdict == "PASS"


def test_hang_keeps_the_stacks(ran):
    outcome = ran[STACKS_CASE].outcome
    assert outcome.verdict == "HANG"
    assert "unpack_buffer" in outcome.detail and "most recent call first" in outcome.detail


def test_reference_on_jax_cpu_arrays(ran):
    outcome = ran[JAX_CPU_CASE].outcome
    assert outcome.verdict == "PASS", outcome.detail
    assert outcome.backend == "jax-cpu"


@pytest.mark.parametrize("probe", ["sharded_roundtrip/heads", "sharded_roundtrip/replicated", "block_sharded/blocks",
                                   "block_sharded/blocks_and_heads", "block_sharded/mixed_layers", "uneven_shards"])
def test_reference_moves_sharded_jax_arrays(ran, probe):
    """One jax.Array per layer over a mesh of JAX CPU devices, as tpu-inference allocates it."""
    name = probe.partition("/")[0]
    outcome = ran[jax_case(probe)].outcome
    # The reference refuses parts of unequal size, by name; every other split it moves.
    expected = "REJECTED" if name == "uneven_shards" else "PASS"
    assert outcome.verdict == expected, outcome.detail
    assert name != "uneven_shards" or "must be equal parts" in outcome.detail


@pytest.mark.parametrize("probe, faults", [("kv_store/pinned_kept", ["store_evicts_pinned"]),
                                           ("donation_in_place", ["refuses_donated_storage"])])
def test_the_facade_iut_carries_the_fault_models_to_the_reference_beneath(ran, probe, faults):
    """kvref-compat drives the facade through the wrapper's API; the reference
    under it takes the case's fault models and fails the probe, and passes
    without them."""
    c = facade_case(probe)
    fixed, broken = ran[c].outcome, ran[facade_case(probe, faults)].outcome
    assert prediction(c).admits(fixed.verdict), fixed.detail
    assert not prediction(c).admits(broken.verdict), broken.detail


@pytest.mark.parametrize("probe, faults, verdict", FACADE_TEETH)
def test_facade_probe_catches_its_fault_model(ran, probe, faults, verdict):
    c = facade_case(probe)
    fixed, broken = ran[c].outcome, ran[facade_case(probe, faults)].outcome
    assert prediction(c).admits(fixed.verdict), fixed.detail
    assert Prediction.parse(verdict).admits(broken.verdict), broken.detail
    assert not prediction(c).admits(broken.verdict)
