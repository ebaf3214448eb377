"""tpu-sync's KVCacheManager (the jax or the torch wheel) as a Library, behind
the attributes and calls the probes use. The views keep no reference to the
caches: the release-order probes rely on that."""

from __future__ import annotations

import gc
import importlib
import os
import re
import zlib
from importlib import metadata

import numpy as np

import kvref
from probes.iut.surfaces import TPU_SYNC_JAX
from probes.iut.exports import KV_EXPORTS, scraped
from probes.iut.sockets import free_loopback_port
from probes.iut.standin_rails import multi_rail_switches
from probes.iut.store_views import NativeStoreView


def plan_number(uuid: str) -> int:
    """The integer id tpu-sync-torch names a plan by, for the probes' string id."""
    return zlib.crc32(uuid.encode())


class AsyncFailure(RuntimeError):
    """A transfer the library accepted failed while it ran: never a refusal."""


# The refusals each wheel gives, read from the wheels; anything else a call
# raises is a failure. Both wheels share the C++ that checks a request.
REFUSAL_CODES = ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION", "UNIMPLEMENTED")
# RESOURCE_EXHAUSTED refuses only a save the host pool cannot hold; elsewhere it is the runtime's.
POOL_FULL = re.compile(r"Insufficient available blocks|exceed total blocks")
# The jax wheel: the call's absl status, after "absl::StatusOr not ok: " (d2h, h2d),
# "absl::Status not ok: " (unlock_blocks) or nothing (d2h_auto_allocate).
JAX_STATUS = re.compile(r"(?:absl::Status(?:Or)? not ok: )?([A-Z][A-Z_]+[A-Z]): ")
# Both wheels' constructors refuse a cache they cannot split into blocks with
# no status code (the shared C++ that sizes a layer's blocks).
UNCODED = re.compile(r"Layer \d+ has major dimension \d+ but layer 0 has \d+|"
                     r"is not a whole number of blocks at major dimension \d+")
# The torch wheel: "KVCacheManager <Method> failed: <the check's message>", no code.
TORCH_WRAPPED = re.compile(r"KVCacheManager \w+ failed: (.*)", re.DOTALL)
CHECKS = re.compile(r"must have the same length|must be non-negative|Copy range exceeds|Invalid block ID|"
                    r"Cannot unlock unallocated block ID|invalid StartTransferRequest bytes|"
                    r"Insufficient available blocks|exceed total blocks|Lengths of offset and size lists must match")
# What the runtime says of a buffer that is gone or a copy that broke, whatever
# status code it carries: a failure, never a refusal of the input.
RUNTIME_FAILURES = re.compile(r"(?:has been|was) deleted|donated|\bDMA\b|DmaMap")
# Their Python layers' own refusals. A binding's "incompatible function
# arguments" is not one: it is what a call that reached no check says.
PYTHON_REFUSALS = re.compile(r"Must specify either \(max_blocks, num_slots\) or host_blocks_to_allocate|"
                             r"request must be bytes or a protobuf message")


def refuses(e: BaseException, wheel: str = "jax") -> bool:
    """Whether `e` is one of the wheel's ("jax" or "torch") clean refusals of
    the input given."""
    message = str(e)
    if isinstance(e, AsyncFailure) or RUNTIME_FAILURES.search(message):
        return False
    if isinstance(e, (ValueError, TypeError)):
        return bool(PYTHON_REFUSALS.search(message))
    if type(e) is not RuntimeError:
        return False
    if UNCODED.search(message):
        return True
    if wheel == "torch":
        wrapped = TORCH_WRAPPED.match(message)
        return bool(wrapped and CHECKS.search(wrapped.group(1)))
    status = JAX_STATUS.match(message)
    if status is None:
        return False
    code = status.group(1)
    return code in REFUSAL_CODES or (code == "RESOURCE_EXHAUSTED" and bool(POOL_FULL.search(message)))


def layer_block_sizes(impl, layers: int) -> tuple[int, ...]:
    """Each layer's block size as the library reports it: block_bytes(i) per
    layer where the wheel has it (layers of different sizes differ), else
    its one slice_byte_size for every layer."""
    if hasattr(impl, "block_bytes") and int(getattr(impl, "num_block_arrays", layers)) == layers:
        return tuple(int(impl.block_bytes(i)) for i in range(layers))
    return (int(impl.slice_byte_size),) * layers


def _ints(values) -> list:
    """A block list as a serving engine passes it: NumPy integers (what the
    probes make) as Python ints; anything else as it is, for the library to
    take or refuse (a fuzzed None must reach it, not fail here)."""
    return [int(x) if isinstance(x, np.integer) else x for x in values]


class SyncPending:
    """A tpu-sync future. A failure while the copy runs is an AsyncFailure,
    whichever way the future reports it: Await raising, or (tpu-sync-torch's
    future) Await returning while ok() is False."""

    def __init__(self, future):
        self.future = future

    def wait(self) -> None:
        try:
            self.future.Await()
        except Exception as e:  # the copy failed after it was accepted
            raise AsyncFailure(f"Await raised {type(e).__name__}: {e}") from e
        ok = getattr(self.future, "ok", None)
        if ok is not None and not ok():
            raise AsyncFailure(f"Await returned, but the future reports an error: "
                               f"{self.future.error_message()}")

    def done(self) -> bool:
        """The wheel's future asked without waiting: IsReady, which the jax
        wheel's RaidenFuture has (NotImplementedError where it is missing)."""
        ready = getattr(self.future, "IsReady", None)
        if ready is None:
            raise NotImplementedError(f"{type(self.future).__name__} cannot say whether it is done")
        return bool(ready())


class SyncManagerView:
    def __init__(self, caches, host_blocks: int, options: dict):
        """The library's manager as its users build it: its own defaults, but
        for `options` (a host pool of `host_blocks` blocks is the one argument
        the block-offload API needs)."""
        self.manager = self.library_manager()(caches, 0, host_blocks_to_allocate=host_blocks, **options)
        impl = self.manager._impl
        self.num_layers, self.num_shards = int(impl.num_layers), int(impl.num_shards)
        self.layer_bytes_per_block = layer_block_sizes(impl, self.num_layers)
        self.host_blocks = host_blocks
        self.host_bytes = None  # the library does not report its pool size

    @staticmethod
    def library_manager():
        """The wheel's KVCacheManager class."""
        raise NotImplementedError

    def start(self, d2h: bool, src, dst, sizes=None) -> "SyncPending":
        """One d2h or h2d, issued; the call itself may refuse the request."""
        return SyncPending((self.manager.d2h if d2h else self.manager.h2d)(
            _ints(src), _ints(dst), None if sizes is None else _ints(sizes)))

    def save(self, src, sizes=None) -> tuple[list[int], "SyncPending"]:
        self._needs("d2h_auto_allocate")
        chunks, future = self.manager.d2h_auto_allocate(_ints(src), None if sizes is None else _ints(sizes))
        return [int(c) for c in chunks], SyncPending(future)

    def unlock(self, chunk_ids) -> None:
        self._needs("unlock_blocks")
        self.manager.unlock_blocks(_ints(chunk_ids))

    def _needs(self, method: str) -> None:
        """A wheel without the allocator (tpu-sync-torch) says so by name."""
        if not hasattr(self.manager, method):
            raise NotImplementedError(f"{type(self.manager).__module__} has no {method}; a probe that needs "
                                      "it must be declared not applicable for this IUT")

    def check_block(self, block: int) -> None:
        if not 0 <= block < self.host_blocks:
            raise IndexError(f"host block {block} is out of range [0, {self.host_blocks})")


class JaxSyncManager(SyncManagerView):
    @staticmethod
    def library_manager():
        from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

        return KVCacheManager

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes:
        """One host block, through the reader the jax wheel offers:
        read_host_memory(layer, shard, n) returns the first n float32 values of
        that pool (get_host_pointer answers 0 on JAX CPU arrays). NaN payloads
        may not survive the trip through Python floats: probes that read host
        blocks use finite contents."""
        self.check_block(block)
        floats = self.layer_bytes_per_block[layer] // 4
        values = self.manager._impl.read_host_memory(layer, shard, (block + 1) * floats)
        return np.asarray(values[block * floats:], dtype=np.float32).tobytes()

    def register_active_plan(self, uuid, request, is_sender):
        raise NotImplementedError("tpu-sync-jax offers no register_active_plan")

    def active_plan(self, uuid):
        raise NotImplementedError("tpu-sync-jax offers no active plans")


class TorchSyncManager(SyncManagerView):
    @staticmethod
    def library_manager():
        from tpu_sync.api.torch.kv_cache_manager import KVCacheManager

        return KVCacheManager

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes:
        if shard:
            raise NotImplementedError("tpu-sync-torch reads host blocks of shard 0 only")
        self.check_block(block)
        return bytes(self.manager.read_block_bytes(layer, block))

    def register_active_plan(self, uuid: str, request, is_sender: bool) -> None:
        self.manager.register_active_plan(plan_number(uuid), request, is_sender)

    def active_plan(self, uuid: str) -> dict:
        raise NotImplementedError("tpu-sync-torch offers no way to read a registered plan back")


PULL_SLOTS = 4  # num_slots of a pulling manager: pulls in flight at once
PULL_SLOT_BLOCKS = 16  # max_blocks of a manager built for its worker settings: blocks one pull moves

# Set by the runner for a build other than the pinned one: its directory,
# from which the library must then import.
BUILD_VARIABLE = "KVPROBE_BUILD_DIR"
TELEMETRY_VARIABLE = "TPU_RAIDEN_TELEMETRY_BACKENDS"  # the wheel's telemetry backends, read at import


def pool_port(listen: bool) -> int:
    """The control port of a pool-form manager (host_blocks_to_allocate) that
    must serve pulls: one the loopback interface has free now, as a user
    names one, since the wrapper takes port 0 there as "listen nowhere"; 0
    where it need not listen."""
    return free_loopback_port() if listen else 0


class SyncLibrary:
    """tpu-sync's KVCacheManager as a Library; each wheel names its
    `distribution`, the module that must import, and its manager `view`."""

    distribution = ""
    module = ""
    install_hint = ""  # how to get the library, for the skip reason
    view: type[SyncManagerView] = SyncManagerView
    supports_faults = False  # fault models are kvref's
    # The library's defaults (which skip the buffer lock); the buffer lock
    # on, as a user who wants the safety locking builds it; and transfers
    # dispatched asynchronously, the wheel's switch for how d2h and h2d are
    # issued. An upper-case option is an environment variable, set before
    # the library is imported.
    OPTION_SETS = ({}, {"unsafe_skip_buffer_lock": False}, {"RAIDEN_ENABLE_ASYNC_DISPATCH": "1"})

    def __init__(self, faults: kvref.Faults, options: dict | None = None):
        if faults:
            raise ValueError(f"{self.distribution} has no fault models; {faults} are kvref's")
        options = dict(options or {})
        for name in [k for k in options if k.isupper()]:
            os.environ[name] = str(options.pop(name))
        self.options = options

    @property
    def version(self) -> str:
        return metadata.version(self.distribution)

    def skip_reason(self) -> str | None:
        try:
            module = importlib.import_module(self.module)
        except ImportError as e:
            return f"{self.distribution} is not importable here ({e}); {self.install_hint}"
        build = os.environ.get(BUILD_VARIABLE)
        if build and not str(module.__file__).startswith(build):
            raise RuntimeError(f"{self.module} came from {module.__file__}, not from the build at {build}")
        return None

    def manager(self, caches, host_blocks, **options):
        """Built as the option set says, with the probe's own settings
        (parallelism, timeout_s) passed through to the wheel's constructor."""
        if options.pop("slice_policy", "uniform") != "uniform":
            raise NotImplementedError(f"{self.distribution} has no slice_policy")
        return self.view(caches, host_blocks, {**self.options, **options})

    def transfer(self, manager, d2h: bool, src, dst, sizes=None) -> None:
        manager.start(d2h, src, dst, sizes).wait()

    def start(self, manager, d2h: bool, src, dst, sizes=None):
        return manager.start(d2h, src, dst, sizes)

    def save(self, manager, src, sizes=None):
        return manager.save(src, sizes)

    def unlock(self, manager, chunk_ids) -> None:
        manager.unlock(chunk_ids)

    def refuses(self, e: BaseException) -> bool:
        return refuses(e, self.wheel)


class WrapperHostTransfers:
    """h2h_read and h2h_write as the wrapper's users reach them (its native
    manager's calls, `_impl`), on a manager built as the offload connector
    builds it; a Library of the wrapper API mixes this in."""

    def wrapper(self):
        """The wrapper's KVCacheManager class."""
        raise NotImplementedError

    def host_manager(self, caches, listen, timeout_s, host_blocks):
        return self.wrapper()(caches, pool_port(listen), host_blocks_to_allocate=host_blocks, timeout_s=timeout_s)

    def host_read(self, manager, peer, block_ids):
        chunks, future = manager._impl.h2h_read(peer=peer, src_block_ids=_ints(block_ids))
        return [int(c) for c in chunks], SyncPending(future)

    def host_write(self, manager, peer, block_ids):
        chunks, future = manager._impl.h2h_write(peer=peer, src_block_ids=_ints(block_ids))
        return [int(c) for c in chunks], SyncPending(future)

    def host_copy(self, manager, d2h, src, dst, sizes) -> None:
        SyncPending((manager.d2h if d2h else manager.h2d)(_ints(src), _ints(dst), _ints(sizes))).wait()

    def host_save(self, manager, src):
        chunks, future = manager.d2h_auto_allocate(_ints(src), None)
        return [int(c) for c in chunks], SyncPending(future)

    def host_unlock(self, manager, chunk_ids) -> None:
        manager.unlock_blocks(_ints(chunk_ids))


class TpuSyncJaxLibrary(WrapperHostTransfers, SyncLibrary):
    """tpu-sync-jax (Python 3.12: its workers run in the jax peer environment)."""
    SURFACE = TPU_SYNC_JAX  # what it offers, mapped to the model (`kvprobe coverage`)

    distribution = "tpu-sync-jax"
    wheel = "jax"
    module = "tpu_sync.api.jax.kv_cache_manager"
    view = JaxSyncManager
    install_hint = "run `kvprobe peer-env`"
    NEEDS_INTERFACES = True  # it finds its rails among the host's interfaces (probes.iut.standin_rails)

    def wrapper(self):
        return JaxSyncManager.library_manager()

    EXPORTS = KV_EXPORTS  # with its telemetry's prometheus backend on (TELEMETRY in probes.iut.declared)
    NATIVE = "tpu_sync.frameworks.jax._tpu_raiden_jax"  # where its metrics registry is bound

    def exports(self) -> dict[str, float]:
        if "prometheus" not in os.environ.get(TELEMETRY_VARIABLE, ""):
            raise RuntimeError(f"{self.distribution} exports no metrics without the prometheus backend in "
                               f"${TELEMETRY_VARIABLE} (its value: {os.environ.get(TELEMETRY_VARIABLE)!r})")
        return scraped(importlib.import_module(self.NATIVE).get_raiden_metrics_prometheus_text())

    def plan_request(self, uuid: str, src_block: int, dst_block: int):
        raise NotImplementedError("tpu-sync-jax offers no register_active_plan")

    def plan_fields(self, request, is_sender: bool) -> dict:
        raise NotImplementedError("tpu-sync-jax offers no active plans")

    def pull_manager(self, caches, form, listen, timeout_s, max_blocks, sub_managers=1):
        """The wrapper itself, as a serving stack's disaggregated connector
        builds it ("slots": max_blocks, num_slots and a control port the
        library picks) or its offload connector does ("pool"). `listen` is
        not the wheel's to take: it listens as it does. Sub-managers are the
        wheel's split per data-plane NIC (ENABLE_MULTI_NUMA=1 and the NICs
        allowlisted in TPU_RAIDEN_DATA_NICS), over the rails of the case's
        namespace (probes.iut.standin_rails), which the caller entered."""
        if sub_managers > 1:
            os.environ.update(multi_rail_switches(sub_managers))
        if form == "pool":
            return self._wrapper_at(caches, pool_port(listen), host_blocks_to_allocate=max_blocks)
        return self._wrapper_at(caches, 0, max_blocks=max_blocks, num_slots=PULL_SLOTS, timeout_s=timeout_s)

    def port_manager(self, caches, port, timeout_s, max_blocks):
        """The wrapper's slots form on the control port a serving stack names."""
        return self._wrapper_at(caches, port, max_blocks=max_blocks, num_slots=PULL_SLOTS, timeout_s=timeout_s)

    def worker_manager(self, caches, worker_port, controller, worker_id, node_id, timeout_s):
        """The wrapper's slots form with its worker settings."""
        return self._wrapper_at(caches, 0, max_blocks=PULL_SLOT_BLOCKS, num_slots=PULL_SLOTS, timeout_s=timeout_s,
                                raiden_worker_port=worker_port, raiden_controller_address=controller,
                                worker_id=worker_id, node_id=node_id)

    def _wrapper_at(self, caches, control_port: int, **construction):
        """The wrapper over `caches` at `control_port`, built as this option set builds it."""
        from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

        settings = {k: v for k, v in self.options.items() if k == "unsafe_skip_buffer_lock"}
        return KVCacheManager(caches, control_port, **construction, **settings)

    def close_manager(self, manager) -> None:
        """The wrapper has no close: its native manager goes when the last reference does."""
        manager.__dict__.pop("_impl", None)
        gc.collect()

    def pull_failure(self, manager, req_id) -> str:
        return ""  # poll_stats names a failed request, never why (the reason is only logged)

    def kv_store(self, capacity: int) -> NativeStoreView:
        return NativeStoreView(capacity)


class TpuSyncTorchLibrary(SyncLibrary):
    """tpu-sync-torch (its workers run in the torch peer environment)."""

    distribution = "tpu-sync-torch"
    wheel = "torch"
    module = "tpu_sync.api.torch.kv_cache_manager"
    view = TorchSyncManager
    install_hint = "run `kvprobe peer-env --lib torch` on a TPU VM"

    def plan_request(self, uuid: str, src_block: int, dst_block: int):
        """The wheel's own StartTransferRequest: one block of layer 0."""
        from tpu_sync.rpc import raiden_service_pb2 as rpc

        entry = rpc.ShardPushEntryProto(layer_idx=0, src_block_id=src_block, dst_block_id=dst_block,
                                        count=1)
        return rpc.StartTransferRequest(uuid=plan_number(uuid), req_id=uuid, is_sender=True,
                                        shard_push_schedules={0: rpc.ShardPushScheduleProto(entries=[entry])})

    def plan_fields(self, request, is_sender: bool) -> dict:
        raise NotImplementedError("tpu-sync-torch offers no way to read a registered plan back")
