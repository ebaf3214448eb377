"""The reference behind tpu-sync-jax's wrapper API, so that a serving stack
can run its offload connector's tests on a CPU against kvref in place of the
production library: `KVCacheManager(kv_caches, local_control_port,
host_blocks_to_allocate=N, ...)`, `d2h`, `h2d`, `d2h_auto_allocate`,
`unlock_blocks`, and futures with `Await()`, over JAX CPU arrays and the
simulated device.

    from kvref.compat import tpu_sync
    tpu_sync.install("tpu_raiden")   # `from tpu_raiden.api.jax.kv_cache_manager import KVCacheManager`

The store of saved blocks the offload connector keeps beside the manager is
kvref.kv_store's (`KVCacheStore`, `RaidenId`), importable as
`<name>.api.jax.kv_cache_store` and from `<name>` itself, as the connector
imports them. Under $RAIDEN_SHM_KEY it keeps its table in shared memory
(model $RAIDEN_SHM_MODEL_UID), as the production store does: a store and a
manager (`enable_shm=True`) built again under the key after their process
died start with the saved blocks they had, the manager's chunks locked for
the store's entries; where the manager's pool could not be recovered, the
store drops what it recovered.

Pulls between managers too (`register_read`, `start_read`, `poll_stats`,
`get_local_endpoints`; kvref.pulls), and host-to-host transfers
(`h2h_read`, `h2h_write`; kvref.host_transfers): a manager built with
`max_blocks` and `num_slots` serves both at `local_control_port` (0: any
free port), as the disaggregated connector builds it; one built with
`host_blocks_to_allocate` serves them at a control port it is given, and
with none only offloads and calls its peers, listening nowhere. `enable_shm=True` attaches the pool under $RAIDEN_SHM_KEY,
one manager per key (kvref.shared_pool). Given `raiden_controller_address`,
the process's worker listens (at `raiden_worker_port`, 0: any) and each
manager registers with the controller as `worker_id` on `node_id`
(kvref.worker_registration); without one, no worker listens and
get_raiden_worker_port() is 0. With $ENABLE_MULTI_NUMA on, a manager that
listens is split into a sub-manager per data-plane NIC, each on the next
port (kvref.compat.data_rails). Storage backends are refused by name. `unsafe_skip_buffer_lock` is taken and changes
nothing: the reference always orders transfers (kvref.manager)."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
import weakref

import kvref
from kvref import worker_registration
from kvref.compat import data_rails
from kvref.manager import shards_of
from kvref.endpoints import LOOPBACK, is_wildcard, with_port
from kvref import kv_store, metrics
from kvref.kv_store import RaidenId  # noqa: F401 (the facade's name)
from kvref.values import flag, integer


SHM_KEY_VARIABLE = "RAIDEN_SHM_KEY"  # the shared-memory key enable_shm attaches the pool under
MODEL_UID_VARIABLE = "RAIDEN_SHM_MODEL_UID"  # the model a store's recovered table must be of
LOG = logging.getLogger(__name__)
_UNDER_KEY: dict[str, dict] = {}  # key -> weak references to the manager and store attached under it
# The host a serving stack advertises to its peers (vllm's, which
# tpu-inference's disaggregated connector sends as the pull endpoint's host).
HOST_VARIABLE = "VLLM_HOST_IP"


class PoolExhausted(RuntimeError, kvref.HostPoolExhausted):
    """A save the host pool cannot hold, as the production wrapper reports it
    (a RuntimeError whose text starts with its status code), and still
    kvref's HostPoolExhausted. No chunk was taken."""


class CopyFailed(RuntimeError):
    """A copy that failed after it was accepted, as the wrapper's future says it."""


class TransferFuture:
    """tpu-sync's future: Await() (or wait()) returns once the copy is done,
    or raises CopyFailed, a RuntimeError, naming its error; IsReady() (or
    is_ready()) asks without waiting."""

    def __init__(self, future: kvref.TransferFuture):
        self._future = future

    def Await(self) -> None:  # noqa: N802 (the production name)
        try:
            self._future.result()
        except (kvref.DeviceError, kvref.PeerTransferFailed) as e:
            raise CopyFailed(f"Async copy failed: {e}") from e

    wait = Await

    def IsReady(self) -> bool:  # noqa: N802 (the production name)
        return self._future.done()

    is_ready = done = IsReady


class KVCacheManager:
    def __init__(self, kv_caches, local_control_port: int, max_blocks: int | None = None,
                 num_slots: int | None = None, timeout_s: float = 120.0,
                 unsafe_skip_buffer_lock: bool = True, host_blocks_to_allocate: int | None = None,
                 parallelism: int = 4, node_id: int = 0, raiden_worker_port: int = 0,
                 raiden_controller_address: str | None = None, worker_id: str | None = None,
                 enable_shm: bool = False, backend_configs=None):
        if backend_configs not in (None, [], ()):
            raise NotImplementedError(f"backend_configs={backend_configs!r}: the reference facade keeps blocks in "
                                      "its host pool only; pass the default")
        controller = worker_registration.check_controller(raiden_controller_address)
        worker_id = worker_registration.check_worker_id(worker_id)
        node_id = integer(node_id, "node_id", 0)
        worker_port = integer(raiden_worker_port, "raiden_worker_port", 0, 65535)
        port = integer(local_control_port, "local_control_port", 0, 65535)
        pulls = {}
        if host_blocks_to_allocate is None:
            if max_blocks is None or num_slots is None:
                raise ValueError("Must specify either (max_blocks, num_slots) or host_blocks_to_allocate.")
            pulls = {"pull_slots": integer(num_slots, "num_slots", 1), "pull_slot_blocks": integer(max_blocks,
                                                                                                 "max_blocks", 1)}
            host_blocks_to_allocate = pulls["pull_slots"] * pulls["pull_slot_blocks"]
        self._listen_host = listen_host()
        listen = f"{self._listen_host}:{port}" if pulls or port else None
        if listen is not None:
            pulls["sub_managers"] = data_rails.sub_managers(shards_of(kv_caches))
        flag(unsafe_skip_buffer_lock, "unsafe_skip_buffer_lock")
        shm_key = None
        if flag(enable_shm, "enable_shm"):
            shm_key = os.environ.get(SHM_KEY_VARIABLE)
            if not shm_key:
                raise ValueError(f"enable_shm=True attaches the pool under ${SHM_KEY_VARIABLE}, which is not set")
        # Layers of several block sizes each addressed with their own, as the wrapper does.
        self._manager = kvref.KVCacheManager(kv_caches, host_blocks_to_allocate, parallelism=parallelism,
                                             timeout_s=timeout_s, listen=listen, shm_key=shm_key,
                                             slice_policy="per_layer", serve_host=listen is not None, **pulls)
        if shm_key:
            _meet(shm_key, manager=self._manager)
        self._worker = None
        faults = self._manager.faults
        if controller is not None or (worker_port and faults.worker_without_controller):
            try:
                self._worker = worker_registration.worker_endpoint(self._listen_host, worker_port, faults)
            except ValueError:
                self._manager.close()
                raise
        if controller is not None:
            self._register(controller, worker_id, node_id, port)

    def _register(self, controller: str, worker_id: str, node_id: int, asked_port: int) -> None:
        """Tell `controller` of this worker and where this manager serves
        (kvref.worker_registration); a controller that is down is logged."""
        faults = self._manager.faults
        endpoints = self._manager.get_local_endpoints()
        if faults.registered_requested_port:
            endpoints = [dict(e, endpoint=with_port(e["endpoint"], asked_port)) for e in endpoints]
        registration = worker_registration.Registration(
            worker_id, node_id, tuple((e["endpoint"], tuple(e["shards"])) for e in endpoints),
            tuple(self._manager.layer_bytes_per_block), self._manager.num_shards)
        wait = (self._manager.settings.timeout_s or 0.0) if faults.registration_waits_for_controller else 0.0
        worker_registration.register(controller, self._worker, registration, wait_for_controller_s=wait)

    def d2h(self, src_offsets=(), dst_offsets=(), copy_sizes=None) -> TransferFuture:
        """Device blocks -> host blocks; with no offsets at all, every block
        of the cache into the host blocks of the same numbers (the wrapper's
        whole-array copy)."""
        return self._transfer("d2h", src_offsets, dst_offsets, copy_sizes)

    def h2d(self, src_offsets=(), dst_offsets=(), copy_sizes=None) -> TransferFuture:
        return self._transfer("h2d", src_offsets, dst_offsets, copy_sizes)

    def _transfer(self, direction: str, src, dst, sizes) -> TransferFuture:
        if _empty(src) and _empty(dst) and (sizes is None or _empty(sizes)):
            src = dst = [0]
            sizes = [self._manager.device_blocks]
        return TransferFuture(getattr(self._manager, direction)(src, dst, sizes))

    def d2h_auto_allocate(self, src_offsets, copy_sizes=None) -> tuple[list[int], TransferFuture]:
        return self._pool_call(self._manager.d2h_auto_allocate, src_offsets, copy_sizes)

    def h2h_read(self, peer: str, src_block_ids) -> tuple[list[int], TransferFuture]:
        """The peer's host blocks into host chunks locked here: (their ids, the future)."""
        return self._pool_call(self._manager.h2h_read, peer, src_block_ids)

    def h2h_write(self, peer: str, src_block_ids) -> tuple[list[int], TransferFuture]:
        """Host blocks into chunks the peer locks: (the peer's ids, a done future)."""
        return self._pool_call(self._manager.h2h_write, peer, src_block_ids)

    def _pool_call(self, call, *args) -> tuple[list[int], TransferFuture]:
        try:
            chunks, future = call(*args)
        except kvref.HostPoolExhausted as e:
            raise PoolExhausted(f"RESOURCE_EXHAUSTED: Insufficient available blocks: {e}") from None
        return chunks, TransferFuture(future)

    @property
    def _impl(self) -> "KVCacheManager":
        """The native manager's calls (h2h_read, h2h_write, local_port) are this one's."""
        return self

    def dump_metrics_to_string(self) -> str:
        """The wrapper's telemetry: a JSON array with one object per pull this
        manager started (kvref.pull_records has the keys)."""
        return self._manager.dump_metrics_to_string()

    @property
    def local_control_port(self) -> int | None:
        """The port pulls are served on (the first sub-manager's), or None."""
        endpoints = self._manager.get_local_endpoints()
        return int(endpoints[0]["endpoint"].rsplit(":", 1)[1]) if endpoints else None

    def local_port(self) -> int | None:
        return self.local_control_port

    def unlock_blocks(self, block_ids) -> None:
        self._manager.unlock_blocks(block_ids)

    def get_local_endpoints(self) -> list[dict]:
        return self._manager.get_local_endpoints()

    def get_raiden_worker_port(self) -> int:
        """The port of the process's worker, once a controller was named; else 0."""
        return worker_registration.worker_port(self._worker)

    @property
    def is_listener_active(self) -> bool:
        return self.get_raiden_worker_port() > 0

    def register_read(self, req_id: str, uuid: int, block_ids) -> bool:
        return self._manager.register_read(req_id, uuid, block_ids)

    def start_read(self, req_id: str, uuid: int, remote_endpoint, remote_block_ids, local_block_ids,
                   parallelism: int = 1) -> None:
        self._manager.start_read(req_id, uuid, remote_endpoint, remote_block_ids, local_block_ids, parallelism)

    def poll_stats(self) -> tuple[list[str], list[str], list[str]]:
        return self._manager.poll_stats()

    @property
    def reference(self) -> kvref.KVCacheManager:
        """The kvref manager underneath (chunk states, host blocks)."""
        return self._manager


class KVCacheStore(kv_store.KVCacheStore):
    """kvref's store as the production binding builds it (see the module):
    its table under $RAIDEN_SHM_KEY, where that is set."""

    def __init__(self, capacity: int, num_shards: int = 1, store_server_ip: str = "127.0.0.1",
                 raiden_id: RaidenId = RaidenId()):
        key = os.environ.get(SHM_KEY_VARIABLE) or None
        super().__init__(capacity, num_shards=num_shards, store_server_ip=store_server_ip, raiden_id=raiden_id,
                         shm_key=key, model_uid=os.environ.get(MODEL_UID_VARIABLE) or "default_model")
        if key:
            _meet(key, store=self)


def _meet(key: str, **attached) -> None:
    """A manager or store attached under `key`: once both are, the manager
    locks the chunks the store recovered, or the store forgets them where
    the manager's pool was made anew."""
    met = _UNDER_KEY.setdefault(key, {})
    met.update({kind: weakref.ref(value) for kind, value in attached.items()})
    manager, store = (met[kind]() if kind in met else None for kind in ("manager", "store"))
    if manager is None or store is None or not store.recovered:
        return
    if not manager.recovered:
        store.forget_recovered()
        return
    adoptable, dropped = _adoptable(manager, store.recovered)
    if dropped:
        LOG.warning("the store table left under %r names chunks this pool cannot hold for it (out of range, "
                    "named by a later entry too, or taken): dropped %d of %d recovered entries, e.g. %r",
                    key, len(dropped), len(store.recovered), dropped[0][0][:32])
        store.forget_recovered(dropped)
    manager.adopt_saved([raiden_id.data_replica_idx for _, raiden_id in adoptable])
    store.recovered = []


def _adoptable(manager, recovered: list) -> tuple[list, list]:
    """The recovered entries whose chunk the manager's pool can lock (in
    range, FREE, named by no later entry: the later wrote it last), and the rest."""
    adoptable, dropped, named = [], [], set()
    for entry in reversed(recovered):
        chunk = entry[1].data_replica_idx
        fits = type(chunk) is int and 0 <= chunk < manager.host_blocks and chunk not in named
        (adoptable if fits and manager.chunk_state(chunk) == kvref.ChunkState.FREE else dropped).append(entry)
        named.add(chunk)
    return adoptable[::-1], dropped[::-1]


# The production library's scrape of every manager's metrics in the process (its native module's name).
get_raiden_metrics_prometheus_text = metrics.prometheus_text

EXPORTED = ("KVCacheManager", "KVCacheStore", "RaidenId")  # what `from <name> import ...` finds


def listen_host() -> str:
    """The host pulls are served on: the one the serving stack advertises
    ($VLLM_HOST_IP), else loopback; never a wildcard, which binds but
    cannot be dialled."""
    host = os.environ.get(HOST_VARIABLE, LOOPBACK)
    if is_wildcard(host):
        raise ValueError(f"${HOST_VARIABLE}={host!r} is a wildcard; name the address peers dial this host on")
    return host


def _empty(values) -> bool:
    return hasattr(values, "__len__") and not isinstance(values, (str, bytes)) and len(values) == 0


def install(name: str = "tpu_sync") -> types.ModuleType:
    """Make `<name>.api.jax.kv_cache_manager` and `<name>.api.jax.kv_cache_store`
    importable as this module, and its names importable from `<name>`, for
    code that imports the production API by that name; returns it. A name
    that is a package installed here is refused (it would be shadowed)."""
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        raise ValueError(f"a package named {name!r} is importable here; install the facade under a free name")
    module = sys.modules[__name__]
    packages = [name, f"{name}.api", f"{name}.api.jax"]
    for package in packages:
        sys.modules[package] = types.ModuleType(package)
        sys.modules[package].__path__ = []  # a package, so its children import
    for parent, child in zip(packages, packages[1:]):
        setattr(sys.modules[parent], child.rsplit(".", 1)[1], sys.modules[child])
    for leaf in ("kv_cache_manager", "kv_cache_store"):
        sys.modules[f"{name}.api.jax.{leaf}"] = module
        setattr(sys.modules[f"{name}.api.jax"], leaf, module)
    for attr in EXPORTED:
        setattr(sys.modules[name], attr, getattr(module, attr))
    return module


