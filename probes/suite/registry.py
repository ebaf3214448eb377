"""Every probe, declared once: its function, which cases it makes, its
subject, what the reference predicts for a correct manager, and what its
worker needs. The CLI, matrices, worker, predictions and reports read this
table; a probe missing a part is caught by tests/probes/test_registry.py."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

import kvref
from probes.suite import (call_sequence, construction, contract_sequences, constructor_ports, donation, fork_forms, host_budget,
                          host_chunks, host_transfers, kv_store, ordering, plan_binding, pull_donation, pull_failures,
                          pull_fans, pull_telemetry, pulls, requests, robustness, roundtrip, serving_step, settings,
                          shared_pool, sharded, worker_registration)
from probes.suite.pull_sides import SUBJECT as PULL_SUBJECT
from probes.suite.ownership import row_byte_ranges
from probes.suite.verdicts import PASS, REJECTED, Prediction, Verdict


class Scope(StrEnum):
    """Which cases a probe makes."""

    SHAPE = "shape"  # one per matrix row
    GENERATION = "generation"  # one per generation
    ROBUSTNESS = "robustness"  # one per kind of input
    FUZZ = "fuzz"  # none here: they come from `kvprobe fuzz`


def addressable_or_refused(shape: kvref.Shape) -> Prediction:
    """A correct manager moves blocks of a layout whose rows are contiguous
    byte ranges, and refuses any other (found by packing, not by asking
    kvref.major_slice)."""
    return Prediction((PASS,) if row_byte_ranges(str(shape)).contiguous else (REJECTED,))


def always(*verdicts: Verdict) -> Callable[[kvref.Shape], Prediction]:
    prediction = Prediction(verdicts)

    def predict(shape: kvref.Shape) -> Prediction:
        return prediction
    predict.__doc__ = f"{' or '.join(prediction.verdicts)}, whatever the layout"
    return predict


@dataclass(frozen=True)
class Probe:
    name: str
    run: Callable  # (Case, Adapter) -> Outcome
    scope: Scope  # text naming a scope is taken, and checked, here
    predict: Callable[[kvref.Shape], Prediction]  # what a correct manager earns on the subject's layout
    subject: kvref.ShapeKey | None = None  # the fixed subject of generation and robustness probes
    kinds: tuple[str, ...] = ()  # robustness probes: the kinds of input, one case each
    default: bool = True  # in `kvprobe run` without --probe
    address_space_headroom: int | None = None  # bytes the worker's address space may grow by
    devices: int = 1  # devices its caches are split over: not made where fewer exist
    two_process: bool = False  # run as a producer and a consumer worker, each with its own manager
    mesh_kinds: tuple[str, ...] = ()  # kinds ("" without kinds) whose caches split over devices: made only
    #                                   for arrays that can (probes.iut.protocol.ShardedArrays)
    waits: bool = False  # spends most of its time waiting on the device (a step computing, a copy held
    #                      in flight): the runner runs it beside the cases that compute, not in their place
    own_network: bool = False  # a two-process probe that reads its network namespace's counters (bytes over
    #                            lo): its workers get a namespace no other case shares
    sharded_rows: bool = False  # a shape probe that also takes a matrix row with a sharding (its cache made
    #                             over a mesh of devices)
    timeout: float | None = None  # its cases' timeout where the run's is shorter (a probe that runs for a budget)

    def __post_init__(self):
        if self.scope not in tuple(Scope):
            raise ValueError(f"probe {self.name!r} has scope {self.scope!r}; expected one of {', '.join(Scope)}")
        object.__setattr__(self, "scope", Scope(self.scope))
        if bool(self.kinds) != (self.scope == Scope.ROBUSTNESS):
            raise ValueError(f"probe {self.name!r}: a robustness probe, and only one, has kinds of input")
        if self.sharded_rows and self.scope != Scope.SHAPE:
            raise ValueError(f"probe {self.name!r}: only a shape probe takes matrix rows, sharded or not")

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip()


PLAN_SHAPE = kvref.ShapeKey("bf16", (512, 8, 2048))

PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("roundtrip", roundtrip.roundtrip, Scope.SHAPE, addressable_or_refused, sharded_rows=True),
    Probe("deferred_construction", construction.deferred_construction, Scope.SHAPE,
          addressable_or_refused),
    Probe("host_transferred_construction", construction.host_transferred_construction, Scope.SHAPE,
          addressable_or_refused),
    # Refusing layers of two block sizes is right; so is moving each exactly.
    Probe("mixed_slices", roundtrip.mixed_slices, Scope.GENERATION, always(REJECTED, PASS),
          subject=PLAN_SHAPE),
    Probe("plan_binding", plan_binding.plan_binding, Scope.GENERATION, always(PASS), subject=PLAN_SHAPE),
    # Moving the updated contents is right; so is refusing a donated array.
    Probe("serving_step", serving_step.serving_step, Scope.GENERATION, always(PASS, REJECTED),
          subject=PLAN_SHAPE),
    # Steps that donate the caches, as every forward does: in place (the
    # output aliases the storage) a manager must serve on; where the output
    # lives elsewhere it must refuse, or move the output exactly.
    Probe("donation_in_place", donation.donation_in_place, Scope.GENERATION, addressable_or_refused,
          subject=donation.SUBJECT),
    Probe("donation_moved", donation.donation_moved, Scope.GENERATION, always(PASS, REJECTED),
          subject=donation.SUBJECT),
    # Views of a stacked cache: refusing them is right; so is moving blocks the stacked cache sees.
    Probe("pending_views", construction.pending_views, Scope.GENERATION, always(REJECTED, PASS),
          subject=kvref.ShapeKey("bf16", (512, 8, 256)), default=False),
    Probe("host_budget", host_budget.host_budget, Scope.GENERATION, addressable_or_refused,
          subject=kvref.ShapeKey("bf16", (512, 3, 2048)),
          address_space_headroom=host_budget.ADDRESS_SPACE_HEADROOM),
    Probe("repeated_construction", host_budget.repeated_construction, Scope.GENERATION, always(PASS),
          subject=PLAN_SHAPE),
    Probe("bad_input", robustness.bad_input, Scope.ROBUSTNESS, always(REJECTED), subject=PLAN_SHAPE,
          kinds=robustness.BAD_INPUTS, default=False),
    Probe("release_order", robustness.release_order, Scope.ROBUSTNESS, always(PASS), subject=PLAN_SHAPE,
          kinds=robustness.RELEASE_ORDERS, default=False),
    Probe("concurrent_transfers", robustness.concurrent_transfers, Scope.ROBUSTNESS, always(PASS),
          subject=PLAN_SHAPE, kinds=robustness.CONCURRENCY, default=False,
          timeout=robustness.FOUR_THREADS_MOST_SECONDS + 30),
    # The offload connector's calls: host chunks saved into and unlocked, and
    # transfers overlapping device work and each other.
    Probe("host_chunks", host_chunks.host_chunks, Scope.ROBUSTNESS, always(PASS), subject=PLAN_SHAPE,
          kinds=host_chunks.HOST_CHUNK_KINDS, default=False),
    # The store of saved blocks the offload connector keeps beside the manager.
    Probe("kv_store", kv_store.kv_store, Scope.ROBUSTNESS, always(PASS), subject=PLAN_SHAPE,
          kinds=kv_store.STORE_KINDS, default=False),
    # Moving what the step leaves is right; so is refusing a donated array by name.
    Probe("inflight_step", ordering.inflight_step, Scope.GENERATION, always(PASS, REJECTED), subject=PLAN_SHAPE,
          waits=True),
    # 64 MiB a layer: on a device whose copies cannot be held in flight, the
    # copies themselves must take long enough for the overlap to be real.
    Probe("unawaited_transfers", ordering.unawaited_transfers, Scope.ROBUSTNESS, always(PASS),
          subject=kvref.ShapeKey("bf16", (2048, 8, 2048)), kinds=ordering.ORDERING_KINDS, default=False,
          waits=True),
    Probe("transfer_parameters", requests.transfer_parameters, Scope.ROBUSTNESS, always(PASS),
          subject=PLAN_SHAPE, kinds=requests.TRANSFER_KINDS, default=False),
    # Refusing a setting that means nothing is right; so is clamping a huge
    # parallelism and moving blocks exactly.
    Probe("settings", settings.settings, Scope.ROBUSTNESS, always(REJECTED, PASS), subject=PLAN_SHAPE,
          kinds=settings.SETTING_KINDS, default=False),
    # Caches over a device mesh. Split across heads (or replicated), they must
    # move; split along blocks, refusing them at construction is right too.
    Probe("sharded_roundtrip", sharded.sharded_roundtrip, Scope.ROBUSTNESS, always(PASS), subject=sharded.SUBJECT,
          kinds=sharded.HEAD_KINDS, devices=sharded.MESH_DEVICES),
    Probe("block_sharded", sharded.block_sharded, Scope.ROBUSTNESS, always(PASS, REJECTED), subject=sharded.SUBJECT,
          kinds=sharded.BLOCK_KINDS, devices=sharded.MESH_DEVICES),
    # Refusing parts of unequal size is right; so is moving each exactly.
    Probe("uneven_shards", sharded.uneven_shards, Scope.GENERATION, always(REJECTED, PASS), subject=sharded.SUBJECT,
          devices=sharded.UNEVEN[1]),
    # Pulls between two managers (disaggregated prefill and decode), each a
    # producer and a consumer worker.
    Probe("pull_blocks", pulls.pull_blocks, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=pulls.BLOCK_KINDS, default=False, two_process=True, mesh_kinds=pulls.MESH_KINDS),
    Probe("pull_reuse", pulls.pull_reuse, Scope.GENERATION, always(PASS), subject=PULL_SUBJECT, default=False,
          two_process=True),
    Probe("pull_concurrent", pulls.pull_concurrent, Scope.GENERATION, always(PASS), subject=PULL_SUBJECT,
          default=False, two_process=True),
    Probe("pull_refusals", pull_failures.pull_refusals, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=pull_failures.REFUSAL_KINDS, default=False, two_process=True),
    Probe("pull_failures", pull_failures.pull_failures, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=pull_failures.FAILURE_KINDS, default=False, two_process=True, own_network=True,
          timeout=pull_failures.KILLED_TIMEOUT_S * 3),  # a pull that fails only at its timeout_s, then polled
    Probe("pull_across_donation", pull_donation.pull_across_donation, Scope.GENERATION, always(PASS),
          subject=PULL_SUBJECT, default=False, two_process=True),
    Probe("pull_sockets", pull_failures.pull_sockets, Scope.GENERATION, always(PASS), subject=PULL_SUBJECT,
          default=False, two_process=True),
    # The port a serving stack names when it builds a manager.
    Probe("constructor_ports", constructor_ports.constructor_ports, Scope.ROBUSTNESS, always(PASS),
          subject=PULL_SUBJECT, kinds=constructor_ports.PORT_KINDS, default=False),
    # A worker's registration with its serving fleet's controller.
    Probe("worker_registration", worker_registration.worker_registration, Scope.ROBUSTNESS, always(PASS),
          subject=PULL_SUBJECT, kinds=worker_registration.WORKER_KINDS, default=False),
    # Pulls among more than two managers: one producer to several consumers, several to one.
    Probe("pull_fan", pull_fans.pull_fan, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=pull_fans.FAN_KINDS, default=False, two_process=True),
    # The consumer's record of each pull it made (dump_metrics_to_string).
    Probe("pull_telemetry", pull_telemetry.pull_telemetry, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=pull_telemetry.TELEMETRY_KINDS, default=False, two_process=True),
    # Host blocks moved between two managers' host pools (h2h_read, h2h_write).
    Probe("host_to_host", host_transfers.host_to_host, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=host_transfers.HOST_KINDS, default=False, two_process=True),
    # Refusing the second manager is right; so is sharing one allocator.
    Probe("shared_pool", shared_pool.shared_pool, Scope.GENERATION, always(PASS), subject=PULL_SUBJECT, default=False,
          two_process=True, devices=shared_pool.SHARDED[1].devices, mesh_kinds=("",)),
    # Managers across os.fork(): built in a child while the parent holds one, or inherited.
    Probe("fork_forms", fork_forms.fork_forms, Scope.ROBUSTNESS, always(PASS), subject=PULL_SUBJECT,
          kinds=fork_forms.FORK_KINDS, default=False),
    Probe("call_sequence", call_sequence.call_sequence, Scope.FUZZ, always(PASS), default=False),
    # Stateful random sequences of every offload call, held to one model of the contract.
    Probe("contract_sequences", contract_sequences.contract_sequences, Scope.GENERATION, always(PASS),
          subject=PLAN_SHAPE, default=False, waits=True, timeout=contract_sequences.CASE_SECONDS),
)}

DEFAULT_PROBES = tuple(name for name, p in PROBES.items() if p.default)
SHAPE_PROBES = tuple(name for name, p in PROBES.items() if p.scope == Scope.SHAPE)
SHARDED_SHAPE_PROBES = tuple(name for name, p in PROBES.items() if p.sharded_rows)


def probe(name: str) -> Probe:
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; expected one of {', '.join(PROBES)}")
    return PROBES[name]
