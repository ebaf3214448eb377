"""The reference KVCacheManager: registers each layer's KV cache, checks that
blocks are contiguous byte ranges, and moves blocks between the device and an
aligned host pool, at host block ids the caller names (d2h, h2d) or at host
chunks the manager hands out and takes back (d2h_auto_allocate,
unlock_blocks; the chunk states are csrc/host_chunks.h's).

Ordering: transfers on the same blocks run in the order they were issued
(an h2d from a chunk whose d2h is still in flight reads what that d2h
writes). On the simulated device a transfer is also ordered before the ops
and reads issued after it, so its future need not be awaited first; on JAX
and XLA arrays, whose computations a manager cannot fence from outside, each
transfer has landed when the call returns.

Donation: a cache donated to a model step is followed to the step's output
where that aliases its storage (PJRT: the same buffer), and refused where
the storage was given up (kvref.buffers has what is relied on)."""

from __future__ import annotations

import itertools
import os
import threading
import weakref

import numpy as np

from kvref import _core, metrics
from kvref.addressing import plan_host
from kvref.buffers import DeviceBufferView, check_live, is_simulated, is_still, split_shards, unpack_buffer
from kvref.errors import HostBudgetError
from kvref.faults import Faults
from kvref.leftover_faults import started_leftovers
from kvref.limits import check_allocation, memory_available
from kvref.futures import TransferFuture
from kvref.host_transfers import HostTransfers
from kvref.listener import Listener
from kvref.offsets import block_list, transfer_lists
from kvref.settings import ManagerSettings
from kvref.plans import Plan, request_bytes
from kvref.pulls import PullService
from kvref.shared_pool import PoolAttachment
from kvref.staging import Staging
from kvref.values import flag, integer

_KEYLESS = itertools.count()  # keyless_pool_in_shared_memory's keys, one per manager

ChunkState = _core.ChunkState  # what a host chunk holds, and whether it is locked
BUDGET_SHARE = 0.5  # default budget: this share of the memory available now
PULL_TIMEOUT_S = 120.0  # how long a pull may take when timeout_s is not given
_LEAKED_POOLS: list = []  # the leaked_pool fault model's pools, never freed
_LEAKED_PER_SAVE: list = []  # the leaks_per_save fault model's bookkeeping, never freed
LEAKED_PER_SAVE_BYTES = 1024


class KVCacheManager:
    def __init__(self, kv_caches, host_blocks: int, *, faults=(), **settings):
        """A manager of `host_blocks` host blocks over `kv_caches` (a list of
        layers: each an array, or a list of one array per device), built with
        `settings`, kvref.ManagerSettings' fields by name (its docstring says
        what each means), each checked before anything is made; `faults`:
        fault models to switch on (kvref.Faults)."""
        self.faults = Faults.parse(faults)
        self.settings = ManagerSettings.checked(self.faults, host_blocks=host_blocks, **settings)
        shm_key = self.settings.shm_key
        if shm_key is None and self.faults.keyless_pool_in_shared_memory:  # a key of its own, that nobody asks for
            shm_key = f"keyless-{os.getpid()}-{next(_KEYLESS)}"
        self._attachment = None if shm_key is None else PoolAttachment(shm_key, self.faults.shm_segment_left)
        try:
            self._build(kv_caches, self.settings)
        except BaseException:
            if self._attachment is not None:
                self._attachment.release()
            raise
        self._leftovers = started_leftovers(self.faults)
        metrics.LEDGER.pool_opened(id(self), self.host_bytes, self.faults)
        self._close = weakref.finalize(self, _closer(self._listener, self._pulls, self._host_transfers,
                                                     self._attachment, id(self)))  # runs once

    def _build(self, kv_caches, settings: ManagerSettings) -> None:
        self.timeout_s = settings.timeout_s
        host_blocks = settings.host_blocks
        layers, placements = _layers(kv_caches)
        views = [[unpack_buffer(a, self.faults) for a in layer] for layer in layers]
        _check_devices(views, self.faults)
        plan = plan_host(views, host_blocks, settings.slice_policy, self.faults, placements)
        budget = default_host_budget() if settings.host_budget_bytes is None else settings.host_budget_bytes
        if plan.host_bytes > budget and not self.faults.no_host_budget:
            raise HostBudgetError(
                f"the host pool would take {plan.host_bytes:,} bytes ({plan.host_bytes / 2**30:.1f} "
                f"GiB: {host_blocks} host blocks x {len(views)} layers x {len(views[0])} shards x "
                f"{_sizes(plan.slice_bytes)} bytes per block), over the {budget:,}-byte budget; "
                "nothing was allocated")
        check_allocation(plan.allocate_bytes, "the host pool")  # whatever budget was given
        self.recovered = False
        if self._attachment is None:
            self._mover = _core.BlockMover(plan.layers, host_blocks, plan.allocate_bytes)
        else:  # the pool's bytes in shared memory, kept by a holder that died
            geometry = _geometry(plan, host_blocks, views)
            pool, self.recovered = self._attachment.segment("pool", plan.allocate_bytes, geometry)
            self._mover = _core.BlockMover(plan.layers, host_blocks, plan.allocate_bytes, pool)
        f = self.faults
        if f.leaked_pool:
            _LEAKED_POOLS.append(self._mover)
        self._mover.faults = _core.MoverFaults(**f.of_the_mover())
        if f.pool_kept_across_fork:  # the whole process's, from now on (a probe's worker is its own)
            _core.keep_copy_pool_across_fork(True)
        parallelism = settings.parallelism
        if parallelism is not None and parallelism >= 1:  # (fewer only with unchecked_settings)
            self._mover.set_parallelism(parallelism)
        self._views = views
        self._lands_before_return = not all(is_simulated(v) for layer in views for v in layer)
        self.device_blocks = min(a.device_blocks for a in plan.layers)  # the blocks every layer has
        self._plans = _core.PlanRegistry(len(views), self.device_blocks)
        self._host_slots = plan.host_slots
        self._addressed_shards = plan.layers[0].shard_count
        self.host_blocks = host_blocks
        self.host_bytes = plan.host_bytes
        self.layer_bytes_per_block = plan.slice_bytes
        self.slice_policy = settings.slice_policy
        self._placements = placements
        self._up_to_date_lock = threading.RLock()
        self._staging_mover = None
        self._lost = ""  # why the caches could not be re-addressed (_readdress), once they could not
        self._staging_blocks = settings.pull_slots * settings.pull_slot_blocks
        staging = Staging(_weak(self._pull_mover), _weak(self._still_arrays), settings.pull_slots,
                          settings.pull_slot_blocks, tuple(plan.host_slots))
        peer_timeout = PULL_TIMEOUT_S if settings.timeout_s is None else settings.timeout_s
        listen = settings.listen
        if listen is None and self.faults.offload_only_listens:
            listen = "127.0.0.1:0"
        self._listener = None if listen is None else Listener(listen, settings.sub_managers, plan.host_slots[0],
                                                                      self.faults)
        self._pulls = PullService(staging, tuple(plan.slice_bytes), self.device_blocks, peer_timeout,
                                  self._listener, self.faults, confirm_landed=self._lands_before_return)
        self._host_transfers = HostTransfers(_weak(self._current_mover), tuple(plan.slice_bytes),
                                             tuple(plan.host_slots), self.host_blocks, peer_timeout, self.faults)
        if self._listener is not None:
            served = [self._pulls.registrations, self._host_transfers] if settings.serve_host else \
                [self._pulls.registrations]
            self._listener.start(served)

    @property
    def num_layers(self) -> int:
        return len(self._views)

    @property
    def num_shards(self) -> int:
        return len(self._views[0])

    @property
    def bytes_per_block(self) -> int:
        sizes = set(self.layer_bytes_per_block)
        if len(sizes) != 1:
            raise ValueError(f"layers have different block sizes {self.layer_bytes_per_block}; "
                             "see layer_bytes_per_block")
        return sizes.pop()

    def d2h(self, src_offsets, dst_offsets, copy_sizes=None) -> TransferFuture:
        """Device blocks `src_offsets` -> host blocks `dst_offsets`, every layer
        and shard; runs of `copy_sizes` blocks (default 1)."""
        return self._copy(_core.Direction.DEVICE_TO_HOST, src_offsets, dst_offsets, copy_sizes)

    def h2d(self, src_offsets, dst_offsets, copy_sizes=None) -> TransferFuture:
        """Host blocks `src_offsets` -> device blocks `dst_offsets`."""
        return self._copy(_core.Direction.HOST_TO_DEVICE, src_offsets, dst_offsets, copy_sizes)

    def d2h_auto_allocate(self, src_blocks, copy_sizes=None) -> tuple[list[int], TransferFuture]:
        """Device blocks `src_blocks` (runs of `copy_sizes`) -> host chunks the
        manager picks and locks: (one chunk id per block, in order; the
        future). A pool without enough free chunks is a
        kvref.HostPoolExhausted naming both counts; a refused call takes no
        chunk and moves no byte."""
        src = block_list(src_blocks, "src_blocks")
        sizes = np.ones_like(src) if copy_sizes is None or self.faults.runs_as_single_blocks \
            else block_list(copy_sizes, "copy_sizes")
        if self.faults.saves_neighbouring_block:
            src = _neighbours(src, sizes, self.device_blocks)
        self._bring_up_to_date()
        ids, core = self._mover.save(src, sizes)
        if self.faults.leaks_per_save:
            _LEAKED_PER_SAVE.append(bytearray(LEAKED_PER_SAVE_BYTES))
        return ids, self._future(core, metrics.D2H_BYTES, len(ids))

    def unlock_blocks(self, chunk_ids) -> None:
        """Give locked chunks back: each becomes CACHED (its bytes kept until it
        is handed out again), or FREE if its save failed. An id that is not
        locked, is repeated, or is still being saved is refused, and then no
        id is unlocked."""
        ids = block_list(chunk_ids, "chunk_ids")
        for part in ([ids[i:i + 1] for i in range(len(ids))] if self.faults.unlock_until_refused else [ids]):
            self._mover.unlock(part)

    def adopt_saved(self, chunk_ids) -> None:
        """Lock chunks of a recovered pool (`recovered`: attached under a
        shm_key whose last holder died) as SAVED, each holding the block saved
        into it before: the chunks a store recovered under the same key names
        (kvref.kv_store). Refused for a pool made anew, or a chunk that is not
        FREE (taken since) or is named twice; then none is adopted."""
        if not self.recovered:
            raise ValueError("this manager's pool was made anew (no shm_key, or none left by a holder that died "
                             "with this geometry): its chunks hold no saved block to adopt")
        self._mover.adopt(block_list(chunk_ids, "chunk_ids"))

    def chunk_state(self, chunk_id: int) -> ChunkState:
        """A ChunkState: FREE, WRITING, CACHED, SAVING, SAVED or FAILED (csrc/host_chunks.h)."""
        return self._mover.chunk_state(self._indices(0, 0, chunk_id)[2])

    @property
    def chunks_available(self) -> int:
        """Chunks d2h_auto_allocate could hand out now."""
        return self._mover.chunks_available

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes:
        """One host block of one layer; of a sharded cache, `shard` is the
        part of the block (see kvref.sharding), not a device."""
        return self._mover.read_host_block(*self._indices(layer, shard, block))

    def write_block_bytes(self, layer: int, block: int, payload, shard: int = 0) -> None:
        """Overwrite one host block; `payload` is bytes-like of exactly the block size."""
        if isinstance(payload, str) or not _is_bytes(payload):
            got = f"an array of {payload.dtype}" if isinstance(payload, np.ndarray) else type(payload).__name__
            raise TypeError(f"payload must be bytes (bytes, bytearray, a byte memoryview or a "
                            f"uint8 array), got {got}")
        data = (np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
                if isinstance(payload, np.ndarray) else np.frombuffer(memoryview(payload).cast("B"), np.uint8))
        self._mover.write_host_block(*self._indices(layer, shard, block), data)

    def host_pool(self) -> np.ndarray:
        """A view of the host pool's bytes (no copy)."""
        return self._mover.host_pool()[: self.host_bytes]

    def register_active_plan(self, uuid: str, request, is_sender: bool) -> None:
        """`request`: a serialized StartTransferRequest (bytes) or the message."""
        if not isinstance(uuid, str):
            raise TypeError(f"uuid must be str, got {type(uuid).__name__}")
        is_sender = flag(is_sender, "is_sender")
        if self.faults.str_only_plan_binding:
            # The old binding: std::string under nanobind, which takes only str.
            payload = request.SerializeToString() if hasattr(request, "SerializeToString") else request
            self._plans.add_str(uuid, payload, bool(is_sender))
            return
        payload = request_bytes(request)
        if self.faults.plan_again_kept_first and uuid in self._plans:
            return
        self._plans.add(uuid, payload, bool(is_sender))

    def unregister_active_plan(self, uuid: str) -> None:
        self._plans.remove(uuid)

    def active_plan(self, uuid: str) -> Plan:
        """The plan registered under `uuid` (kvref.Plan); ValueError when none is."""
        return self._plans.get(uuid)

    # Pulls between managers (kvref.pulls has what each guarantees).
    def register_read(self, req_id: str, uuid: int, block_ids) -> bool:
        """Producer: `block_ids` are request `req_id`'s, for a consumer to pull under `uuid`."""
        self._readdress()
        return self._pulls.register_read(req_id, uuid, block_ids)

    def start_read(self, req_id: str, uuid: int, remote_endpoint, remote_block_ids, local_block_ids,
                   parallelism: int = 1) -> None:
        """Consumer: pull the producer's `remote_block_ids` into `local_block_ids`, pairwise."""
        self._readdress()
        self._pulls.start_read(req_id, uuid, remote_endpoint, remote_block_ids, local_block_ids, parallelism)

    def poll_stats(self) -> tuple[list[str], list[str], list[str]]:
        """(done_sending, done_recving, failed_recving) request ids since the
        last poll. On the serving thread, between its steps: it re-addresses
        caches a step took, for the pulls and reads in flight (which wait for it)."""
        if self._pulls.busy:
            self._readdress()
        return self._pulls.poll_stats()

    def get_local_endpoints(self) -> list[dict]:
        """[{"endpoint": 'host:port', "shards": [parts]}] per listener; [] when not listening."""
        return [] if self._listener is None else self._listener.endpoints()

    # Host-to-host transfers between managers (kvref.host_transfers has what each guarantees).
    def h2h_read(self, peer: str, src_block_ids) -> tuple[list[int], TransferFuture]:
        """The peer's host blocks `src_block_ids` into host chunks taken and
        locked here: (the chunk ids, in order; the future)."""
        return self._host_transfers.read(peer, src_block_ids)

    def h2h_write(self, peer: str, src_block_ids) -> tuple[list[int], TransferFuture]:
        """This manager's host blocks `src_block_ids` into chunks the peer
        takes and locks: (the peer's chunk ids, in order; a done future)."""
        return self._host_transfers.write(peer, src_block_ids)

    def dump_metrics_to_string(self) -> str:
        """Telemetry: each pull this manager started, as a JSON array
        (kvref.pull_records)."""
        return self._pulls.records.dump()

    def failure_reason(self, req_id: str) -> str:
        """Why a pull reported in failed_recving failed; KeyError for one that did not."""
        return self._pulls.failures[req_id]

    def close(self) -> None:
        """Fail the pulls and host reads in flight, stop listening and let go of the shared-memory
        key (also done when the manager is dropped)."""
        self._close()

    def _current_mover(self):
        return self._mover

    def _pull_mover(self):
        """The pull slots' mover, made at the first pull."""
        with self._up_to_date_lock:
            if self._staging_mover is None:
                plan = plan_host(self._views, self._staging_blocks, self.slice_policy, self.faults,
                                 self._placements)
                check_allocation(plan.allocate_bytes, "the pull slots")
                self._staging_mover = _core.BlockMover(plan.layers, self._staging_blocks, plan.allocate_bytes)
            return self._staging_mover

    def _indices(self, layer, shard, block) -> tuple[int, int, int]:
        """Host block coordinates as ints, each checked against its range."""
        integer(layer, "layer", 0, self.num_layers - 1, expected=f"an integer in [0, {self.num_layers})",
                out_of_range=IndexError)
        limits = (("shard", shard, self._host_slots[int(layer)]), ("host block", block, self.host_blocks))
        for name, value, limit in limits:
            integer(value, name, 0, limit - 1, expected=f"an integer in [0, {limit})", out_of_range=IndexError)
        return int(layer), int(shard), int(block)

    def __repr__(self) -> str:
        return (f"KVCacheManager({self.num_layers} layers x {self.num_shards} shards, "
                f"{self.host_blocks} host blocks, {self.host_bytes:,} host bytes)")

    def _copy(self, direction: _core.Direction, src, dst, sizes) -> TransferFuture:
        src, dst, sizes = transfer_lists(src, dst, sizes)
        if self.faults.runs_as_single_blocks:
            sizes = np.ones_like(sizes)
        if self.faults.saves_neighbouring_block and direction == _core.Direction.DEVICE_TO_HOST:
            src = _neighbours(src, sizes, self.device_blocks)
        if self.faults.loads_neighbouring_chunk and direction == _core.Direction.HOST_TO_DEVICE:
            src = _neighbours(src, sizes, self.host_blocks)
        self._bring_up_to_date()
        counter = metrics.D2H_BYTES if direction == _core.Direction.DEVICE_TO_HOST else metrics.H2D_BYTES
        return self._future(self._mover.copy(direction, src, dst, sizes), counter, int(np.sum(sizes)))

    def _future(self, core, counter: metrics.Metric, blocks: int) -> TransferFuture:
        """The transfer's future; its bytes (`blocks` of every layer and shard) count once it succeeds."""
        row = sum(n * size for n, size in zip(self._host_slots, self.layer_bytes_per_block))
        metrics.LEDGER.track(core, counter, blocks * row, self.faults, id(self))
        future = TransferFuture(core, self.timeout_s)
        if self._lands_before_return and not self.faults.unfenced_copies:
            future.wait_landed()
        return future

    def _readdress(self) -> None:
        """On the caller's thread: follow caches a step took, for the manager's
        own threads (see _still_arrays); where that fails, they fail with it."""
        try:
            self._bring_up_to_date()
        except ValueError as e:
            self._lost = str(e)

    def _still_arrays(self) -> list | None:
        """For the manager's own threads (pulls, the listener): the arrays
        holding every view's storage where each is still (kvref.buffers.is_still),
        else None. A view whose array a step took is not followed here (see
        check_live): the caller's next call (poll_stats, each step) does."""
        with self._up_to_date_lock:
            if self._lost:
                raise ValueError(self._lost)
            self._bring_up_to_date(follow=self.faults.pull_threads_follow_donation)
            views = [view for layer in self._views for view in layer]
            return [view.keepalive for view in views] if all(map(is_still, views)) else None

    def _bring_up_to_date(self, follow: bool = True) -> None:
        """Every view holds its array's current storage (check_live)."""
        with self._up_to_date_lock:  # pulls' threads call this too
            for i, layer in enumerate(self._views):
                for s, view in enumerate(layer):
                    try:
                        live = check_live(view, self.faults, follow)
                    except ValueError as e:
                        raise ValueError(f"layer {i} shard {s}: {e}") from None
                    if live is not view and s < self._addressed_shards:  # its storage moved: address the new one
                        self._mover = self._mover.with_shard(i, s, live.region)
                        if self._staging_mover is not None:
                            self._staging_mover = self._staging_mover.with_shard(i, s, live.region)
                        layer[s] = live


def _closer(listener: Listener | None, pulls: PullService, host_transfers: HostTransfers,
            attachment: PoolAttachment | None, token: int):
    """What a dropped manager's finalizer does (it must not hold the manager)."""
    def close():
        metrics.LEDGER.pool_closed(token)
        if listener is not None:
            listener.stop()
        pulls.close()
        host_transfers.close()
        if attachment is not None:
            attachment.release()
    return close


def _weak(method):
    """A call of `method` that does not keep its manager alive (a pull's
    threads and listener hold it); a dropped manager's is an error."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is None:
            raise ValueError("the manager was dropped")
        return bound(*args)
    return call


def _geometry(plan, host_blocks: int, views) -> bytes:
    """What a pool's bytes mean (each layer's shards, with their types,
    dims and layouts, and where their blocks lie): recovered only into a pool
    of the same."""
    layers = [(a.device_blocks, a.shard_blocks, a.block_bytes, a.host.base, a.host.blocks, a.host.slice,
               [(p.first_block, p.host_slot, p.host_slots, p.reads) for p in a.placements]) for a in plan.layers]
    shards = [[str(view.shape) for view in layer] for layer in views]
    return repr((int(host_blocks), plan.allocate_bytes, layers, shards)).encode()


def default_host_budget() -> int:
    """BUDGET_SHARE of the memory available now."""
    return int(memory_available() * BUDGET_SHARE)


def shards_of(kv_caches) -> int:
    """How many shards (one per device) each layer of `kv_caches` has, as a
    manager splits them; the manager's own errors for caches it refuses."""
    return len(_layers(kv_caches)[0][0])


def _layers(kv_caches) -> tuple[list[list], list]:
    """Per layer, its shards (one per device) and, for one array split over
    devices, where each shard lies (None: each shard holds every block)."""
    if isinstance(kv_caches, (str, bytes)) or not hasattr(kv_caches, "__len__"):
        raise TypeError(f"kv_caches must be a list of layers, got {type(kv_caches).__name__}")
    if len(kv_caches) == 0:
        raise ValueError("kv_caches is empty; expected at least one layer")
    layers, placements = [], []
    for layer in kv_caches:
        shards, placed = (list(layer), None) if isinstance(layer, (list, tuple)) else split_shards(layer)
        layers.append(shards)
        placements.append(placed)
    for i, layer in enumerate(layers):
        if not layer:
            raise ValueError(f"layer {i} has no shards")
        if len(layer) != len(layers[0]):
            raise ValueError(f"layer {i} has {len(layer)} shards but layer 0 has {len(layers[0])}; "
                             "every layer needs the same shard count")
    return layers, placements


def _check_devices(views: list[list[DeviceBufferView]], faults: Faults) -> None:
    """Shard s of every layer must live on one device, the same as layer 0's
    shard s; within a layer, shards must agree in shape (equal parts: a split
    that does not divide a dimension is refused, not addressed as shard 0)."""
    for i, layer in enumerate(views):
        for s, view in enumerate(layer):
            if view.device is not views[0][s].device:
                raise ValueError(f"layer {i} shard {s} is on {view.device!r} but layer 0 shard {s} "
                                 f"is on {views[0][s].device!r}; arrays from two devices")
            if view.shape != layer[0].shape and not faults.unchecked_shard_shapes:
                raise ValueError(f"layer {i} shard {s} is {view.shape} but shard 0 is {layer[0].shape}; the "
                                 "shards of a layer must be equal parts (is it split where the count does not "
                                 "divide?)")
        if len({id(v.device) for v in layer}) != len(layer):
            raise ValueError(f"layer {i} has two shards on one device")


def _is_bytes(obj) -> bool:
    """Bytes, not just anything with a buffer: an object array's buffer holds
    pointers, a float array's holds floats."""
    if isinstance(obj, np.ndarray):
        return obj.dtype in (np.uint8, np.int8)
    try:
        view = memoryview(obj)
    except TypeError:
        return False
    return view.format in ("B", "b", "c")


def _sizes(sizes: tuple[int, ...]) -> str:
    unique = sorted(set(sizes))
    return str(unique[0]) if len(unique) == 1 else "/".join(map(str, unique))


def _neighbours(starts: np.ndarray, sizes: np.ndarray, count: int) -> np.ndarray:
    """The fault models' wrong runs: each run of `count` blocks moved one block
    on (or back, at the end); a run that does not fit stays as it is, to be
    refused as it would be without the fault."""
    fits = (starts >= 0) & (starts + sizes <= count)
    return np.where(fits & (starts + sizes < count), starts + 1, np.where(fits & (starts > 0), starts - 1, starts))
