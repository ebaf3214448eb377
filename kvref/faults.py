"""Fault models: each switches the reference manager back to one old bug.

Names are parsed once into a `Faults` value with one flag per fault; code
asks `faults.legacy_slice_formula` and never compares names."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, fields

ENV_VAR = "KVREF_FAULTS"


def _fault(what: str):
    return field(default=False, metadata={"doc": what})


@dataclass(frozen=True)
class Faults:
    """Which old bugs are switched on; all off by default."""

    no_materialize_before_await: bool = _fault(
        "unpack awaits a buffer without materializing it: construction over deferred "
        "tensors hangs, holding the GIL")
    legacy_slice_formula: bool = _fault(
        "slice size from the old formula, with no addressability check")
    str_only_plan_binding: bool = _fault(
        "the plan binding takes std::string, so it refuses the bytes it is given")
    plan_again_kept_first: bool = _fault(
        "a plan registered again under a uuid already active is taken, and the plan before it kept")
    allow_mixed_slices: bool = _fault(
        "host allocation and host block offsets all come from layer 0's slice")
    no_await_before_transfer: bool = _fault(
        "unpack neither materializes nor awaits: transfers race host->device copies")
    no_host_budget: bool = _fault(
        "the host pool is allocated without checking it against a budget (host OOM)")
    leaky_refused_allocation: bool = _fault(
        "d2h_auto_allocate takes its chunks before checking the request, and a refused "
        "allocation keeps every chunk it took")
    unlock_until_refused: bool = _fault(
        "an unlock of several chunks gives back those before the first it refuses")
    unchecked_unlock: bool = _fault(
        "unlock_blocks frees any id without checking it is locked: an id unlocked twice is "
        "handed out twice")
    unordered_transfers: bool = _fault(
        "a transfer does not wait for an earlier one still in flight on the same blocks (an "
        "h2d from a chunk whose d2h has not landed reads the old bytes)")
    unfenced_copies: bool = _fault(
        "a transfer returns before it is ordered against the device: the next op or read "
        "does not wait for its copies (an un-awaited h2d is missed, an op overwrites bytes a "
        "d2h is still copying)")
    runs_as_single_blocks: bool = _fault(
        "copy_sizes are ignored: each run moves its first block only")
    loads_neighbouring_chunk: bool = _fault(
        "h2d reads each host block from the one after it in the pool: a load brings back the "
        "neighbouring chunk's bytes")
    saves_neighbouring_block: bool = _fault(
        "d2h and d2h_auto_allocate copy each device block's next neighbour: a save stores the "
        "bytes of the block beside the one asked for")
    unchecked_settings: bool = _fault(
        "parallelism and timeout_s are taken unchecked: 0, negative or NaN is used as given")
    leaked_pool: bool = _fault(
        "a dropped manager's host pool is never freed: each manager built over the same caches "
        "adds a pool")
    leaks_per_save: bool = _fault(
        "each d2h_auto_allocate keeps a kilobyte of its bookkeeping for ever: a slow leak, found "
        "only over thousands of saves")
    buffer_resolved_once: bool = _fault(
        "buffers are resolved at construction only: a transfer after an in-place op moves "
        "stale storage (pending ops never run; an XLA tensor's new buffer is never seen)")
    stale_storage_address: bool = _fault(
        "a donated array's storage is addressed as it was at construction, never checked to be "
        "the cache's still: after a step that gave it up, loads land where nothing reads them "
        "and saves read what the step left behind")
    refuses_donated_storage: bool = _fault(
        "an array donated to a step is refused, even where the step's output aliases its "
        "storage (the in-place donation every serving step makes)")
    # The store of saved blocks beside the manager (kvref.kv_store).
    store_lookup_skips_misses: bool = _fault(
        "the store's lookup answers every stored hash, not the leading run: a block is loaded "
        "after a block that was never saved")
    store_evicts_pinned: bool = _fault(
        "the store evicts the least recently used entry whether or not it is pinned: a block "
        "being loaded loses its chunk")
    store_partial_insert: bool = _fault(
        "the store's insert keeps the hashes that fit and says it kept them all")
    store_fifo_eviction: bool = _fault(
        "the store evicts the entry inserted first, however recently it was used")
    store_unchecked_lengths: bool = _fault(
        "the store's insert takes ids of another length than its hashes: a hash without an id "
        "gets the default one (chunk 0), an id without a hash is dropped")
    first_shard_only: bool = _fault(
        "a sharded cache is addressed through its first shard only: the other devices' parts "
        "of every block are never moved")
    block_ids_on_every_shard: bool = _fault(
        "a block id is applied to every shard of a cache split along its blocks, as if each "
        "held them all: global block b moves local block b of every device")
    unchecked_shard_shapes: bool = _fault(
        "the shards of one layer are not checked to be equal parts: every shard is addressed "
        "with shard 0's block size (a split that does not divide, the remainder on the last)")
    pool_kept_across_fork: bool = _fault(
        "a forked child keeps its parent's copy threads, which it does not have: every copy it "
        "starts, on a manager of its own or one it inherited, waits forever")
    # Pulls between managers (kvref.pulls).
    parallel_pull_drops_remainder: bool = _fault(
        "a pull with parallelism p splits its blocks into p runs of len // p and never asks "
        "for the remainder")
    pull_never_reports: bool = _fault(
        "a pull settles but poll_stats never reports it: the consumer waits for it forever")
    late_refusal: bool = _fault(
        "start_read accepts a request it cannot carry out and reports it failed only when "
        "timeout_s has passed")
    offload_only_listens: bool = _fault(
        "a manager built without a listen address opens a listening socket anyway")
    pull_pairs_sorted: bool = _fault(
        "a pull pairs the remote blocks with the local block ids sorted, not in the order given")
    pull_written_one_block_off: bool = _fault(
        "a pull writes each block it received into the local block after the one asked for")
    partial_pull_written: bool = _fault(
        "a pull writes each run of blocks into the consumer's cache as it arrives: one that "
        "fails part-way leaves some blocks overwritten")
    lost_pull_unsettled: bool = _fault(
        "a pull whose producer goes away (connection refused or dropped) is never settled")
    lost_peer_seen_at_timeout: bool = _fault(
        "a pull whose producer goes away (connection refused or dropped) is reported failed only at "
        "its timeout_s, not when the loss is seen: a serving stack waits out the whole timeout")
    registrations_keyed_by_blocks: bool = _fault(
        "the producer keys registrations by their block ids: a request registering the same "
        "blocks as another replaces it, and the other's pull finds nothing")
    unregistered_pull_fails_at_once: bool = _fault(
        "a pull that arrives before its registration fails at once (NOT_FOUND), though a serving "
        "engine's producer registers a request in its next step, after its consumer may have pulled")
    pull_threads_follow_donation: bool = _fault(
        "a pull's and the listener's threads follow caches a step took, asking live arrays for their "
        "buffers: a step dispatched at that moment on JAX CPU gives up its donation, and the cache moves")
    settled_uuid_served_stale: bool = _fault(
        "the producer remembers a uuid's first blocks: a later registration under a reused "
        "uuid serves the blocks of the first")
    shared_listen_port: bool = _fault(
        "a listener binds its port shared (SO_REUSEPORT): a second manager built on a port the "
        "first listens on is accepted, and peers' pulls reach either")
    named_port_ignored: bool = _fault(
        "a listener picks a port of its own, whatever port it is given: the port the serving "
        "stack advertises reaches nothing")
    busy_port_falls_back: bool = _fault(
        "a listener whose port is taken listens on any free port instead, and says nothing: the "
        "port the serving stack advertises reaches another socket")
    pull_route_reused: bool = _fault(
        "the consumer keeps the route of its first pull and sends every later pull there: a "
        "pull from a second producer asks the first")
    settled_registration_served: bool = _fault(
        "the producer keeps a registration once its pull settled and serves its blocks, which the "
        "engine reuses once told done sending, to the next consumer that asks")
    registrations_never_expire: bool = _fault(
        "a registration no pull takes is kept for ever, never told done sending: the engine never "
        "gets its blocks back, and a late pull is still served")
    metrics_by_uuid_slot: bool = _fault(
        "the consumer keeps each pull's record in one of 1024 slots by uuid: a pull whose uuid "
        "shares a slot with an earlier one's replaces its record")
    metrics_json_unescaped: bool = _fault(
        "the metrics dump writes each request id between quotes as given: one with a quote or a "
        "backslash makes the dump invalid JSON")
    metrics_last_byte_unset: bool = _fault(
        "a pull's network_transit_us is measured to a last-byte time that is never set: a huge "
        "negative number")
    metrics_uniform_layers: bool = _fault(
        "a pull's total_bytes is its blocks x layers x the first layer's block bytes: wrong for "
        "layers of several block sizes")
    sub_manager_serves_own_parts: bool = _fault(
        "a sub-manager asked for parts of a block it does not hold sends its own parts in their "
        "place: a pull of every part from one endpoint lands other parts' bytes")
    # A worker's registration with its controller (kvref.worker_registration, through the facade).
    worker_without_controller: bool = _fault(
        "a named raiden_worker_port is listened on even without a controller: a port open to "
        "anyone that no controller ever drives")
    worker_port_ignored: bool = _fault(
        "the worker listens on any free port, not the raiden_worker_port it was given: a controller "
        "or firewall set up for that port never reaches it")
    worker_port_shared: bool = _fault(
        "a manager that names another raiden_worker_port than the process's worker listens on is "
        "silently given the worker's port: the port it was told is served by nobody")
    registered_requested_port: bool = _fault(
        "the registration carries each transfer endpoint with the port the caller asked for (0: "
        "any) instead of the one bound: the controller routes pulls to a port nobody serves")
    registration_waits_for_controller: bool = _fault(
        "the registration waits for an unreachable controller to come up, for the manager's whole "
        "timeout_s: a host whose controller is down cannot start serving")
    # Host-to-host transfers between managers (kvref.host_transfers).
    host_pairs_sorted: bool = _fault(
        "a host-to-host transfer writes block i into the i-th lowest chunk it took, not the i-th "
        "chunk it reports: a pool whose free chunks are out of order gets blocks under the wrong ids")
    host_write_unclaimed: bool = _fault(
        "a peer's host write leaves the chunks it wrote unlocked: the peer's next saves take "
        "them before their owner has used them")
    shm_segment_left: bool = _fault(
        "a manager attached under a shared-memory key leaves its segment in /dev/shm when it "
        "closes: every run adds one")
    keyless_pool_in_shared_memory: bool = _fault(
        "a manager built without a shm_key still keeps its pool in a named /dev/shm segment, removed "
        "when it closes: a killed manager's pool stays in memory, held by no process, for good")
    helper_process_outlives_manager: bool = _fault(
        "a manager starts a helper process that nothing tells when the manager goes: a killed or "
        "closed manager's helper runs on, and each restart adds one")
    socket_file_left: bool = _fault(
        "a manager binds a Unix socket file for local peers and never removes it: a killed or closed "
        "manager's file stays in the temporary directory, and each restart adds one")
    # What managers export (kvref.metrics).
    counts_requested_bytes: bool = _fault(
        "a transfer's bytes are counted when it is asked for, not once it completed successfully: "
        "refused and failed transfers count, and a count runs ahead of what landed")
    gauge_of_last_pool: bool = _fault(
        "the pool gauge holds the last manager's pool, not the sum of every live one's: with two "
        "managers alive it reports one pool, and it keeps a closed manager's")
    counts_drop_with_manager: bool = _fault(
        "the byte counters are the sum over the managers alive: a manager dropped takes what its "
        "transfers counted with it, and a counter goes down")
    transfer_time_on_two_clocks: bool = _fault(
        "a transfer's time is its end on the monotonic clock less its start on the wall clock: "
        "every sample is hugely negative, and the histogram's sum falls")
    dma_time_per_stage: bool = _fault(
        "a transfer's copy time is observed once per stage it passes (the device read, the host "
        "write): the DMA histogram holds two samples per transfer, one transfer apparently twice")
    p2p_time_per_stream: bool = _fault(
        "a producer observes a pull's crossing time once per stream it served, not once per pull: "
        "a pull of parallelism 4 is four pulls in the p2p histogram")
    landed_pull_counts_failure: bool = _fault(
        "a pull that landed counts a failure too (its streams' end taken for a failure): the failure "
        "counter grows with every pull, and an alert on it fires on a healthy host")
    times_failed_transfers: bool = _fault(
        "a failed transfer's time is observed in its histogram, as if it landed: the histogram's "
        "count runs past the transfers its byte counter counts")
    transfer_time_in_microseconds: bool = _fault(
        "a transfer's time is observed in microseconds into a histogram named in milliseconds: "
        "every sample a thousand times what the copy took")
    pull_bytes_per_stream: bool = _fault(
        "each stream of a parallel pull counts the whole pull's bytes received, not its own runs': "
        "a pull of N streams counts N times what crossed")
    duplicate_reports: bool = _fault(
        "poll_stats does not forget what it reported: each settled request is reported on "
        "every poll")

    @classmethod
    def known(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def parse(cls, faults=(), environ=None) -> "Faults":
        """The faults named in `faults` (names, or a Faults value) plus those in
        $KVREF_FAULTS (comma-separated); ValueError listing the known names."""
        if isinstance(faults, Faults):
            named = list(faults.names)
        elif isinstance(faults, str):
            named = faults.split(",")
        else:
            named = list(faults)
        environ = os.environ if environ is None else environ
        named += environ.get(ENV_VAR, "").split(",")
        names = [n.strip() if isinstance(n, str) else n for n in named]
        names = [n for n in names if n != ""]
        unknown = sorted({repr(n) for n in names if n not in cls.known()})
        if unknown:
            first = next(n for n in names if n not in cls.known())
            close = difflib.get_close_matches(first, cls.known(), 1) if isinstance(first, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown fault model(s) [{', '.join(unknown)}]{hint}; expected any of "
                             f"{list(cls.known())}")
        return cls(**{name: True for name in names})

    def of_the_mover(self) -> dict[str, bool]:
        """The flags the C++ mover and its host chunks read (_core.MoverFaults, by the same names)."""
        return {name: getattr(self, name) for name in MOVER_FAULTS}

    @property
    def names(self) -> tuple[str, ...]:
        """The faults switched on, in declaration order."""
        return tuple(name for name in self.known() if getattr(self, name))

    def __bool__(self) -> bool:
        return bool(self.names)

    def __str__(self) -> str:
        return ",".join(self.names)


# The fault models the C++ core switches on itself (_core.MoverFaults).
MOVER_FAULTS = ("leaky_refused_allocation", "unchecked_unlock", "unordered_transfers", "unfenced_copies")

# What each fault model puts back, by name.
FAULTS: dict[str, str] = {f.name: f.metadata["doc"] for f in fields(Faults)}

