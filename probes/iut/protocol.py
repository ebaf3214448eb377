"""What an implementation under test (IUT) provides, as two halves the probes
drive through one Adapter (probes.iut.adapter):

- `Arrays`, the device side: makes KV caches on its device (ready, deferred or
  still landing), reads them back as logical arrays, overwrites them in place.
- `Library`, the manager side: builds the manager under test over those caches
  and moves blocks with it.

A manager the probes hold is a `ManagerView`. Nothing here has a default: an
IUT that cannot answer a question must say so (raise, or SKIP with a reason),
never answer permissively.

This is the public contract for IUTs declared outside this project. Its
version is PROTOCOL_VERSION; an IUT declares the version it was written for
(probes.iut.adapter.IUT.protocol), and one the harness does not speak is
refused by name. A change that breaks an existing IUT raises the version."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

import kvref

PROTOCOL_VERSION = 1
PROTOCOL_VERSIONS = (1,)  # the versions this harness drives


class CacheMode(StrEnum):
    """How `Arrays.make_caches` makes a cache. Members equal their text, so
    an IUT may compare `mode` with "put" as well as with CacheMode.PUT."""

    PUT = "put"  # copied from the host
    LANDING = "landing"  # copied from the host and, where the backend allows, still in flight
    DEFERRED = "deferred"  # a computation not yet done


class NoViews(Exception):
    """The backend has no views of one tensor into another."""


class NotInPlace(Exception):
    """The backend's step did not write its output into the storage of the
    cache it took (asked for an in-place donating step)."""


@runtime_checkable
class Arrays(Protocol):
    backend: str  # "sim", "jax-cpu", "jax-tpu", "torch-tpu"
    scrambles_in_place: bool  # False: scramble() cannot overwrite the device
    # Optional (absent: False): a forked child can make and read caches afresh
    # (Adapter.fresh) while its parent holds some; fork_forms SKIPs the kinds
    # that need it where not.
    # runs_in_forked_child: bool

    def __init__(self, generation: str) -> None: ...

    @staticmethod
    def layout_of(generation: str, key: kvref.ShapeKey) -> tuple[kvref.Shape, str]:
        """The layout this device gives an array of `key`, and where that answer came from."""

    @property
    def device_kind(self) -> str: ...

    def skip_reason(self) -> str | None:
        """Why these arrays cannot be made here, or None."""

    def make_caches(self, key: kvref.ShapeKey, seeds: Sequence[int], mode: CacheMode = CacheMode.PUT,
                    finite: bool = False) -> list[tuple[Any, np.ndarray]]:
        """(device cache, its logical host contents) per seed, made as `mode`
        says. All host contents are made before the first cache, so
        caches made pending are all still pending together."""

    def views(self, key: kvref.ShapeKey, seeds: Sequence[int]):
        """([(view, its host contents)] per seed, read(layer) -> the contents
        the stacked tensor holds for that layer now): layer i is row i of one
        stacked tensor, and each view is still pending. NoViews where the
        backend has none."""

    def fetch(self, cache) -> np.ndarray:
        """The cache's current logical contents."""

    def scramble(self, cache) -> None:
        """Overwrite the cache's storage in place."""

    def is_pending(self, cache) -> bool:
        """Whether the cache's contents are not on the device yet: an op
        recorded and not launched, a computation still running, a copy still
        landing."""

    def serving_step(self, cache, new: np.ndarray):
        """Update the cache to hold `new` the way a serving engine updates its
        KV cache between transfers; returns the cache to use from now on."""

    def dispatch_step(self, cache, new: np.ndarray):
        """Start a computation that leaves `new` in the cache and return at
        once, the computation still running (a recorded op launched on the
        simulated device and TorchTPU; on JAX a step that takes the cache as a
        serving step donates it and gives a fresh buffer); returns the cache to
        use from now on."""

    # Optional: `donating_step(cache, new, in_place) -> cache`, a model step
    # that takes the cache donated and leaves `new` in its output, dispatched
    # and returned while it may still run; it returns the output, the cache
    # to use from now on. `in_place`: the output is written into the cache's
    # own storage, as XLA writes a donated buffer it aliases (NotInPlace where
    # the backend did not keep it); otherwise the output lives in fresh
    # storage and the cache's is given up. Without it the donation probes SKIP.
    #
    # Optional: `update_blocks(cache, blocks, values) -> cache`, a serving
    # step that writes `values` into blocks `blocks` (the first dimension)
    # alone, taking the cache donated and writing it in place (NotInPlace
    # where its storage was not kept), dispatched and not awaited. The
    # contract's pull managers run it while pulls are in flight.

    def hold_copies(self, cache, seconds: float, until_step: bool = False) -> bool:
        """Hold the next copy between this cache and the host in flight for
        `seconds` where the device allows it (the simulated link); whether it
        could. `until_step`: only until the step dispatched after it has taken
        its place in program order (waited for that copy, or run past it),
        at most `seconds`."""

    def read_by_step(self, cache) -> np.ndarray:
        """The cache's contents as the next computation dispatched on it sees
        them (dispatched now, then read back)."""

    # Optional: `fail_copies(cache, start, end)`, every later copy between
    # the host and bytes [start, end) of the cache's storage fails, as a DMA
    # error does (the simulated device). Without it the contract sequences
    # draw no failing copies.


@runtime_checkable
class ShardedArrays(Protocol):
    """What Arrays that split caches over several devices also provide (the
    sharded probes SKIP for arrays without it, naming this protocol)."""

    @staticmethod
    def sharded_layout_of(generation: str, key: kvref.ShapeKey,
                          sharding: kvref.Sharding) -> tuple[kvref.Shape, str]:
        """The layout this device gives one device's shard of an array of
        `key` split by `sharding`, and where that answer came from."""

    def make_sharded_caches(self, key: kvref.ShapeKey, sharding: kvref.Sharding,
                            seeds: Sequence[int]) -> list[tuple[Any, np.ndarray]]:
        """(one cache split over a mesh of this backend's devices as `sharding`
        says, its global logical host contents) per seed, as a serving stack
        allocates a layer (on JAX: one jax.Array with a NamedSharding). Too
        few devices is an error naming how many it needs."""

    def fetch_shards(self, cache) -> list[tuple[tuple[slice, ...], np.ndarray]]:
        """Every device's part of a sharded cache, replicas included, in device
        order: (where it lies in the global array, its current contents)."""

    def make_uneven_shards(self, key: kvref.ShapeKey, dim: int, parts: int,
                           seed: int) -> tuple[list, np.ndarray, list[tuple[slice, ...]]]:
        """`key`'s array split along `dim` into `parts` unequal pieces, one per
        device, the remainder on the last (as tpu-sync's own shard arithmetic
        splits): (the per-device caches, the global host contents, where each lies)."""


@runtime_checkable
class Pending(Protocol):
    def wait(self) -> None:
        """Until the transfer has ended; raises the library's error if it failed."""

    # Optional: `done() -> bool`, whether the transfer has ended, asked without
    # waiting. A probe whose property needs a transfer still in flight confirms
    # the overlap with it; without it such a probe cannot, and says so (ERROR).


@runtime_checkable
class ManagerView(Protocol):
    num_layers: int
    num_shards: int
    host_blocks: int
    layer_bytes_per_block: tuple[int, ...]
    host_bytes: int | None  # None: the library does not report its pool size

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes: ...

    def register_active_plan(self, uuid: str, request, is_sender: bool) -> None: ...

    def active_plan(self, uuid: str):
        """A registered plan's fields, as a mapping or as attributes (kvref.Plan);
        KeyError or ValueError when none is."""


@runtime_checkable
class StoreView(Protocol):
    """A library's store of saved blocks (block hash -> host chunk), as an
    offload connector calls it (kvref.kv_store has the rules). Hashes are
    bytes; a chunk is the host block a hash was saved into."""

    def lookup(self, hashes) -> list[tuple[bytes, int]]:
        """The leading run of stored hashes, each with its chunk; neither pins nor reorders."""

    def pin(self, hashes) -> None:
        """One more pin on each stored hash."""

    def release(self, hashes) -> None:
        """One pin fewer on each pinned hash; a use, so it becomes the most recently used."""

    def insert(self, hashes, chunks) -> tuple[bool, list[bytes] | None]:
        """Store each hash with its chunk, unpinned, all or none: (whether it
        was taken, the hashes evicted for it, or None where the library does
        not say)."""


@runtime_checkable
class Library(Protocol):
    distribution: str  # the installed distribution whose version is reported
    supports_faults: bool  # whether kvref's fault models can be switched on in it
    OPTION_SETS: tuple[dict, ...]  # each way its manager is built (keyword arguments); {} = defaults

    def __init__(self, faults: kvref.Faults, options: dict | None = None) -> None: ...

    @property
    def version(self) -> str: ...

    def skip_reason(self) -> str | None:
        """Why this library cannot be imported here, or None."""

    def manager(self, caches, host_blocks: int, **options) -> ManagerView: ...

    def refuses(self, e: BaseException) -> bool:
        """Whether `e` is this library's clean refusal of the input it was
        given (as opposed to a failure while carrying it out)."""

    def transfer(self, manager: ManagerView, d2h: bool, src, dst, sizes=None) -> None:
        """One d2h or h2d, waited for; raises what the library raises."""

    def start(self, manager: ManagerView, d2h: bool, src, dst, sizes=None) -> "Pending":
        """One d2h or h2d, issued and not waited for."""

    # Optional: `kv_store(capacity) -> StoreView`, the library's store of
    # saved blocks with room for `capacity` entries. Without it the store
    # probes SKIP.

    def save(self, manager: ManagerView, src, sizes=None) -> tuple[list[int], "Pending"]:
        """d2h_auto_allocate: the host chunks it locked (one per block, in
        order) and its copy, not waited for."""

    def unlock(self, manager: ManagerView, chunk_ids) -> None:
        """unlock_blocks."""

    def plan_request(self, uuid: str, src_block: int, dst_block: int):
        """A StartTransferRequest this library parses: one block of layer 0."""

    def plan_fields(self, request, is_sender: bool) -> dict:
        """What the manager's active_plan must read back for this request."""


@runtime_checkable
class ExportingLibrary(Protocol):
    """What a Library whose process exports metrics also provides: a scrape
    (probes.iut.exports reads Prometheus text), judged against the contract
    model after every step (probes.suite.export_model)."""

    EXPORTS: tuple[str, ...]  # the kvref.metrics names its scrape holds

    def exports(self) -> dict[str, float]:
        """Every metric of the process now, by name (its prefix dropped, each summed over its labels)."""


# How a pulling manager is built: "slots" (max_blocks, num_slots and a
# control port, as a serving stack's disaggregated connector builds it) or
# "pool" (host_blocks_to_allocate, as its offload connector does).
PULL_FORMS = ("slots", "pool")


@runtime_checkable
class PullManager(Protocol):
    """A manager that pulls blocks from another one, with tpu-sync-jax's calls."""

    def register_read(self, req_id: str, uuid: int, block_ids) -> bool: ...

    def start_read(self, req_id: str, uuid: int, remote_endpoint, remote_block_ids, local_block_ids,
                   parallelism: int = 1) -> None: ...

    def poll_stats(self) -> tuple[list[str], list[str], list[str]]:
        """(done_sending, done_recving, failed_recving) request ids."""

    def get_local_endpoints(self) -> list[dict]:
        """[{"endpoint": 'host:port', "shards": [...]}] to pull from."""


@runtime_checkable
class PullLibrary(Protocol):
    """What a Library whose managers pull blocks from one another also
    provides (the pull probes SKIP for one without it, naming this protocol)."""

    def pull_manager(self, caches, form: str, listen: bool, timeout_s: float, max_blocks: int,
                     sub_managers: int = 1) -> PullManager:
        """A manager over `caches` built the PULL_FORMS way `form`; `listen`:
        it serves pulls on loopback (False: an offload-only manager, which
        must open no listening socket); `max_blocks`: the most blocks one
        pull moves; `sub_managers`: split into that many, each serving its
        share of a block's parts, where the library can (as by NUMA node;
        get_local_endpoints says how many it made)."""

    def close_manager(self, manager: PullManager) -> None:
        """Stop it: its pulls, listener and threads end here."""

    def pull_failure(self, manager: PullManager, req_id: str) -> str:
        """Why a failed pull failed, as far as the library says ("" if it does not)."""


@runtime_checkable
class PortLibrary(Protocol):
    """What a Library whose managers serve pulls on a port the caller names
    also provides (the constructor_ports probe SKIPs for one without it,
    naming this protocol). Its managers are closed with
    PullLibrary.close_manager."""

    def port_manager(self, caches, port: int, timeout_s: float, max_blocks: int) -> PullManager:
        """A slots-form manager over `caches` serving pulls on loopback at
        `port` (0: one it picks), as a serving stack names its control port
        (tpu-sync's local_control_port); raises whatever the library raises
        when it cannot."""


@runtime_checkable
class WorkerLibrary(Protocol):
    """What a Library whose managers register with a serving fleet's
    controller also provides (the worker_registration probe SKIPs for one
    without it, naming this protocol). Its managers say
    get_raiden_worker_port() and is_listener_active, and are closed with
    PullLibrary.close_manager."""

    def worker_manager(self, caches, worker_port: int, controller: str | None, worker_id: str, node_id: int,
                       timeout_s: float) -> PullManager:
        """A slots-form manager over `caches` (any control port) built with
        tpu-sync's worker settings: raiden_worker_port `worker_port` (0: any),
        raiden_controller_address `controller` ('host:port' or None),
        `worker_id` and `node_id`."""


@runtime_checkable
class HostTransferLibrary(Protocol):
    """What a Library whose managers move host blocks to one another's host
    pools also provides: h2h_read and h2h_write (the host_to_host probe
    SKIPs for one without it, naming this protocol). Its managers are
    closed with PullLibrary.close_manager."""

    def host_manager(self, caches, listen: bool, timeout_s: float, host_blocks: int):
        """A manager over `caches` with a pool of `host_blocks` host blocks
        (host_blocks_to_allocate); `listen`: it serves its peers' host
        transfers on loopback, at its get_local_endpoints()[0]["endpoint"]."""

    def host_read(self, manager, peer: str, block_ids) -> tuple[list[int], Pending]:
        """h2h_read: the peer's host blocks into host chunks the manager
        locks: (their ids, in order; the transfer, not waited for)."""

    def host_write(self, manager, peer: str, block_ids) -> tuple[list[int], Pending]:
        """h2h_write: host blocks into chunks the peer locks: (the peer's
        ids, in order; the transfer, not waited for)."""

    def host_copy(self, manager, d2h: bool, src, dst, sizes) -> None:
        """One d2h or h2d of such a manager, waited for."""

    def host_save(self, manager, src) -> tuple[list[int], Pending]:
        """d2h_auto_allocate of such a manager."""

    def host_unlock(self, manager, chunk_ids) -> None:
        """unlock_blocks of such a manager."""


def missing_members(cls: type, proto: type) -> list[str]:
    """The members of `proto` that the class `cls` does not define (checked on
    the class, so no property runs and nothing is imported)."""
    members = set(getattr(proto, "__annotations__", {}))
    members |= {name for name, value in vars(proto).items()
                if not name.startswith("_") and isinstance(value, (property, staticmethod))
                or (not name.startswith("_") and callable(value))}
    return sorted(m for m in members if not hasattr(cls, m))
