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
imports them.

Pulls between managers too (`register_read`, `start_read`, `poll_stats`,
`get_local_endpoints`; kvref.pulls): a manager built with `max_blocks` and
`num_slots` serves pulls on 127.0.0.1 at `local_control_port` (0: any free
port), as the disaggregated connector builds it; one built with
`host_blocks_to_allocate` and no control port only offloads and pulls, and
listens nowhere. `enable_shm=True` attaches the pool under $RAIDEN_SHM_KEY,
one manager per key (kvref.shared_pool). A worker port, a controller and
storage backends are refused by name. `unsafe_skip_buffer_lock` is taken and changes
nothing: the reference always orders transfers (kvref.manager)."""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import kvref
from kvref.endpoints import LOOPBACK
from kvref.kv_store import KVCacheStore, RaidenId  # noqa: F401 (the facade's names)
from kvref.values import flag, integer


SHM_KEY_VARIABLE = "RAIDEN_SHM_KEY"  # the shared-memory key enable_shm attaches the pool under


class TransferFuture:
    """tpu-sync's future: Await() returns once the copy is done, or raises
    its error (kvref.DeviceError, a RuntimeError, for a failed copy)."""

    def __init__(self, future: kvref.TransferFuture):
        self._future = future

    def Await(self) -> None:  # noqa: N802 (the production name)
        self._future.result()

    def done(self) -> bool:
        return self._future.done()


class KVCacheManager:
    def __init__(self, kv_caches, local_control_port: int, max_blocks: int | None = None,
                 num_slots: int | None = None, timeout_s: float = 120.0,
                 unsafe_skip_buffer_lock: bool = True, host_blocks_to_allocate: int | None = None,
                 parallelism: int = 4, node_id: int = 0, raiden_worker_port: int = 0,
                 raiden_controller_address: str | None = None, worker_id: str | None = None,
                 enable_shm: bool = False, backend_configs=None):
        for name, value, quiet in (("raiden_worker_port", raiden_worker_port, 0),
                                   ("raiden_controller_address", raiden_controller_address, None),
                                   ("backend_configs", backend_configs, None)):
            if value not in (quiet, [], ()):
                raise NotImplementedError(f"{name}={value!r}: the reference facade moves blocks within "
                                          "one host only; pass the default")
        port = integer(local_control_port, "local_control_port", 0, 65535)
        pulls = {}
        if host_blocks_to_allocate is None:
            if max_blocks is None or num_slots is None:
                raise ValueError("Must specify either (max_blocks, num_slots) or host_blocks_to_allocate.")
            pulls = {"pull_slots": integer(num_slots, "num_slots", 1), "pull_slot_blocks": integer(max_blocks,
                                                                                                 "max_blocks", 1)}
            host_blocks_to_allocate = pulls["pull_slots"] * pulls["pull_slot_blocks"]
        listen = f"{LOOPBACK}:{port}" if pulls or port else None
        flag(unsafe_skip_buffer_lock, "unsafe_skip_buffer_lock")
        shm_key = None
        if flag(enable_shm, "enable_shm"):
            shm_key = os.environ.get(SHM_KEY_VARIABLE)
            if not shm_key:
                raise ValueError(f"enable_shm=True attaches the pool under ${SHM_KEY_VARIABLE}, which is not set")
        self._manager = kvref.KVCacheManager(kv_caches, host_blocks_to_allocate, parallelism=parallelism,
                                             timeout_s=timeout_s, listen=listen, shm_key=shm_key, **pulls)

    def d2h(self, src_offsets, dst_offsets, copy_sizes=None) -> TransferFuture:
        return TransferFuture(self._manager.d2h(src_offsets, dst_offsets, copy_sizes))

    def h2d(self, src_offsets, dst_offsets, copy_sizes=None) -> TransferFuture:
        return TransferFuture(self._manager.h2d(src_offsets, dst_offsets, copy_sizes))

    def d2h_auto_allocate(self, src_offsets, copy_sizes=None) -> tuple[list[int], TransferFuture]:
        chunks, future = self._manager.d2h_auto_allocate(src_offsets, copy_sizes)
        return chunks, TransferFuture(future)

    def unlock_blocks(self, block_ids) -> None:
        self._manager.unlock_blocks(block_ids)

    def get_local_endpoints(self) -> list[dict]:
        return self._manager.get_local_endpoints()

    def get_raiden_worker_port(self) -> int:
        return 0  # no worker service

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


EXPORTED = ("KVCacheManager", "KVCacheStore", "RaidenId")  # what `from <name> import ...` finds


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


