"""Each library's surface (probes.iut.surface) mapped to the model: for every
entry read from the library, the contract's rules and the probes that
exercise and judge it, or why it is out of the model. A pattern is
`KIND NAME` (fnmatch); the first that matches an entry holds. `kvprobe
coverage --iut NAME` prints the result and fails on an entry with neither."""

from __future__ import annotations

from probes.iut.surface import Surface

# The offload manager's calls, as both the production wrapper and kvref's facade spell them.
MANAGER_CALLS = (
    ("call *.KVCacheManager", ("rebuild", "build_refused", "deferred_construction", "repeated_construction")),
    ("call *.KVCacheManager.d2h", ("transfer", "concurrent", "roundtrip", "bad_input", "transfer_parameters")),
    ("call *.KVCacheManager.h2d", ("transfer", "concurrent", "load", "roundtrip", "bad_input")),
    ("call *.KVCacheManager.d2h_auto_allocate", ("save", "fill", "host_chunks")),
    ("call *.KVCacheManager.unlock_blocks", ("unlock", "host_chunks")),
    ("call *.KVCacheManager.register_read", ("register", "pull_blocks")),
    ("call *.KVCacheManager.notify_for_read", ("register",)),  # the native name of register_read
    ("call *.KVCacheManager.start_read", ("pull", "pull_blocks", "pull_refusals")),
    ("call *.KVCacheManager.poll_stats", ("settle", "pull_failures")),
    ("call *.KVCacheManager.complete_read", ("settle",)),  # the native poll under poll_stats
    ("call *.KVCacheManager.dump_metrics_to_string", ("settle", "pull_telemetry")),
    ("call *.KVCacheManager.get_local_endpoints", ("pull", "pull_fan", "pull_sockets")),
    ("call *.KVCacheManager.h2h_read", ("host_move", "host_to_host")),
    ("call *.KVCacheManager.h2h_write", ("host_move", "host_to_host")),
    ("call *.KVCacheManager.get_raiden_worker_port", ("worker_registration",)),
    ("call *.KVCacheManager.is_listener_active", ("pull_sockets", "constructor_ports")),
    ("call *.KVCacheManager.local_port", ("constructor_ports",)),
    ("call *.KVCacheManager.local_control_port", ("constructor_ports",)),
    ("call *.KVCacheManager.num_layers", ("rebuild",)),  # Session.build holds what it reports
    ("call *.KVCacheManager.num_shards", ("rebuild", "sharded_roundtrip")),
    ("call *.KVCacheManager.block_bytes", ("rebuild",)),
    ("call *.KVCacheManager.slice_byte_size", ("rebuild",)),
    ("call *.KVCacheManager.num_block_arrays", ("rebuild",)),
    # Its settings: the pool, the listener, the worker, the buffer lock, the threads, shared memory.
    ("setting *.KVCacheManager(kv_caches)", ("rebuild", "deferred_construction")),
    ("setting *.KVCacheManager(host_blocks_to_allocate)", ("save", "fill", "host_budget")),
    ("setting *.KVCacheManager(max_blocks)", ("pull", "settings")),
    ("setting *.KVCacheManager(num_slots)", ("pull", "settings")),
    ("setting *.KVCacheManager(local_control_port)", ("constructor_ports",)),
    ("setting *.KVCacheManager(timeout_s)", ("pull", "settle", "settings")),
    ("bound *.KVCacheManager(timeout_s)", ("pull", "settle", "register")),
    ("setting *.KVCacheManager(unsafe_skip_buffer_lock)", ("serving_step", "inflight_step", "donation_in_place")),
    ("setting *.KVCacheManager(parallelism)", ("pull", "settings")),
    ("setting *.KVCacheManager(raiden_worker_port)", ("worker_registration",)),
    ("setting *.KVCacheManager(raiden_controller_address)", ("worker_registration",)),
    ("setting *.KVCacheManager(worker_id)", ("worker_registration",)),
    ("setting *.KVCacheManager(node_id)", ("settings",)),
    ("setting *.KVCacheManager(enable_shm)", ("shared_pool",)),
    ("setting *.KVCacheManager(backend_configs)", ("settings",)),
    ("export *.KVCacheManager.dump_metrics_to_string", ("settle", "pull_telemetry")),
    ("export *.KVCacheManager.poll_stats", ("settle",)),
    # The store of saved blocks beside a manager (the offload connector's).
    ("call *.KVCacheStore", ("store_call", "kv_store")),
    ("call *.KVCacheStore.lookup", ("store_call", "kv_store")),
    ("call *.KVCacheStore.insert", ("store_call", "kv_store")),
    ("call *.KVCacheStore.release", ("store_call", "kv_store")),
    ("call *.KVCacheStore.capacity", ("store_call",)),
    ("setting *.KVCacheStore(capacity)", ("store_call", "kv_store")),
    ("export *.KVCacheStore.insert(on_host)", ("store_call",)),
    ("call *.RaidenBlockId*", ("store_call",)),
    ("setting *.RaidenBlockId(*", ("store_call",)),
    ("call *.RaidenId*", ("store_call", "kv_store")),
    ("setting *.RaidenId(*", ("store_call", "kv_store")),
    ("call *.BlockStatus", ("store_call",)),
    # The future a transfer returns.
    ("call *Future.*", ("wait", "unawaited_transfers")),
    ("call *Future", ("wait",)),
    ("setting *Future(*", ("wait",)),
)
# What a manager's process exports (kvref.metrics names them as the production library does), judged after
# every step against the contract's model (probes.suite.export_model) by the rules that move bytes or pools.
def exports(registry: str, scrape: str) -> tuple:
    """The rules that judge what a manager's process exports (kvref.metrics names it as the production
    library does): after every step, against the contract's model (probes.suite.export_model)."""
    return (
        (f"export {registry}.d2h_bytes_total", ("transfer", "save", "fill", "wait", "concurrent", "host_save")),
        (f"export {registry}.h2d_bytes_total", ("transfer", "load", "wait", "concurrent", "host_check")),
        (f"export {registry}.buffer_allocated_bytes", ("rebuild", "host_save", "contract_sequences")),
        # Held to what no registry shows (probes.suite.export_model.broken): never down, buckets cumulative,
        # +Inf the count, no sum of durations or sizes below zero; exercised by transfers and pulls.
        (f"export {registry}.[dhp]2[hdp]_*_ms", ("transfer", "save", "load", "pull", "contract_sequences")),
        (f"export {registry}.transfer_duration_ms", ("pull", "settle", "contract_sequences")),
        *((f"export {registry}.{name}", ("pull", "settle", "contract_sequences"))
          for name in ("sent_bytes_total", "received_bytes_total", "transfer_failures_total")),
        (f"* {scrape}", ("transfer", "save", "rebuild", "contract_sequences")),
    )


KVREF_EXPORTS = exports("kvref.metrics.METRICS", "kvref.metrics.prometheus_text")
WEIGHT_SYNC = "weight synchronization from an RL trainer to its samplers: not a KV-cache manager's contract"
GLOBAL_STORE = ("the store's global tier and its storage backends (remote reads, saves to another replica, "
                "eviction sweeps and leases): no serving stack this harness qualifies calls them; the offload "
                "connector uses the local store alone")
TELEMETRY = ("the metrics registry's writers, backends and callbacks (record_*, configure_telemetry, Cloud "
             "Logging lines): what the manager counts into the registry is judged through its Prometheus scrape "
             "(bytes moved, the pool gauge); these are the registry's own plumbing")
CONTROLLER = ("the fleet's controller and its RPC layer, not a manager: a worker's registration with it is "
              "judged by the worker_registration probe against a stand-in controller")
TRACING = "tracing and log output, which carry no result a serving engine acts on"

TPU_SYNC_JAX = Surface(
    roots=("tpu_sync",),
    env_words=("RAIDEN", "NUMA", "TPU_", "WORKLOAD", "JOBSET", "LOCAL_RANK"),
    ruled=MANAGER_CALLS + (
        ("env RAIDEN_SHM_*", ("shared_pool",)),
        ("env ENABLE_RAIDEN_METRICS", ("settle", "pull_telemetry")),
        ("env ENABLE_MULTI_NUMA", ("pull_blocks",)),
        ("env TPU_RAIDEN_DATA_NICS", ("pull_blocks",)),
        ("env TPU_RAIDEN_SYSFS_ROOT", ("pull_blocks",)),
        # One of the ways the manager is built (TpuSyncJaxLibrary.OPTION_SETS): every rule runs under it.
        ("env RAIDEN_ENABLE_ASYNC_DISPATCH", ("transfer", "save", "wait", "contract_sequences")),
        ("env TPU_RAIDEN_TELEMETRY_BACKENDS", ("contract_sequences",)),  # its prometheus backend, as a stack names it
    ) + exports("tpu_sync.frameworks.jax._tpu_raiden_jax.ALL_METRICS",
                "tpu_sync.frameworks.jax._tpu_raiden_jax.get_raiden_metrics_prometheus_text"),
    out=(
        ("* tpu_sync.telemetry.python._telemetry_binding_test_ext*",
         "a copy of the metrics registry bound for its own tests: the one a manager counts into is _tpu_raiden_jax's"),
        ("export *ALL_METRICS.weight_sync_*", WEIGHT_SYNC),
        ("* tpu_sync.api.jax.weight_synchronizer*", WEIGHT_SYNC),
        ("* tpu_sync.frameworks.jax.weight_synchronizer_ffi*", WEIGHT_SYNC),
        ("* tpu_sync.frameworks.jax._weight_synchronizer_ffi*", WEIGHT_SYNC),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.WeightSync*", WEIGHT_SYNC),
        ("* tpu_sync.weight_sync.*", WEIGHT_SYNC),
        ("* tpu_sync.frameworks.jax.resharding_planner*", WEIGHT_SYNC),
        ("env *WEIGHT_SYNC*", WEIGHT_SYNC),
        ("* tpu_sync.frameworks.jax._kv_cache_manager_ffi*",
         "the manager as XLA FFI custom calls, which no Python wrapper uses: no serving engine reaches it"),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.KVCacheManager.get_host_pointer*",
         "a raw address of the host pool, for debugging: a serving engine reads host blocks through h2d"),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.KVCacheManager.read_host_memory*",
         "host pool contents as floats, for debugging: a serving engine reads host blocks through h2d"),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.KVCacheManager.register_kv_backends*", GLOBAL_STORE),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.BackendConfig*", GLOBAL_STORE),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.ParallelismConfig*", GLOBAL_STORE),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.KVCacheStore.*", GLOBAL_STORE),
        ("setting tpu_sync.frameworks.jax._tpu_raiden_jax.KVCacheStore(*", GLOBAL_STORE),
        ("env RAIDEN_*EVICT*", GLOBAL_STORE), ("env RAIDEN_*STORE*", GLOBAL_STORE),
        ("env RAIDEN_REMOTE_*", GLOBAL_STORE), ("env RAIDEN_*LEASE*", GLOBAL_STORE),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.configure_telemetry*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.*metric*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.flush_cloud_logging*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.increment_counter*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.set_gauge*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.observe_histogram*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.MetricMetadata*", TELEMETRY),
        ("* tpu_sync.frameworks.jax._tpu_raiden_jax.MetricType*", TELEMETRY),
        ("* tpu_sync.telemetry.*", TELEMETRY),
        ("* tpu_sync.api.common.*telemetry*", TELEMETRY), ("* tpu_sync.api.common.TelemetryCallbacks*", TELEMETRY),
        ("* tpu_sync.api.common.record_*", TELEMETRY), ("* tpu_sync.api.common.flush_cloud_logging*", TELEMETRY),
        ("env TPU_RAIDEN_TELEMETRY_*", TELEMETRY), ("env TPU_RAIDEN_PROMETHEUS_*", TELEMETRY),
        ("env LOCAL_RANK", TELEMETRY), ("env *WORKLOAD_NAME", TELEMETRY), ("env JOBSET_NAME", TELEMETRY),
        ("env M_RUN_NAME", TELEMETRY),
        ("* tpu_sync.rpc.*", CONTROLLER), ("* tpu_sync.common.control_pipe*", CONTROLLER),
        ("env TPU_RAIDEN_CONTROL_PLANE_BACKEND", CONTROLLER), ("env TPU_RAIDEN_USE_GRPC_CONTROL_PLANE", CONTROLLER),
        ("env RAIDEN_EXPECTED_WORKERS_TIMEOUT_S", CONTROLLER), ("env RAIDEN_RPC_CONCURRENCY", CONTROLLER),
        ("env RAIDEN_BROADCAST_*", WEIGHT_SYNC), ("env RAIDEN_FFI_USE_DIRECT_DEVICE_BUFFER", WEIGHT_SYNC),
        ("env *TRACE*", TRACING), ("env *PERFETTO*", TRACING), ("env TPU_NAN_LOG_LEVEL", TRACING),
        ("* tpu_sync.frameworks.jax.utils*",
         "helpers to make meshes, caches and profiles: the harness makes its own caches (Arrays)"),
        ("* tpu_sync.kv_cache.nd_slice_math*", "slice arithmetic of the controller's resharding plans"),
        ("* tpu_sync.api.common.BlockStatus*", "a store block's residency, read through the store's lookups"),
        ("env TPU_RAIDEN_DATA_CONN_REUSE", "how the data plane reuses connections: a tuning of the transport "
                                           "that no probe sets; pulls are judged under its default"),
        ("env TPU_RAIDEN_TCP_*", "the data plane's socket tuning: no probe sets it; pulls are judged under its "
                                 "defaults"),
        ("env TPU_RAIDEN_ENABLE_SOURCE_IP_BIND", "the data plane's source address: pulls run in a loopback-only "
                                                 "namespace, where there is one address"),
        ("env TPU_RAIDEN_FORWARD_RECEIVER_ADDRS", CONTROLLER),
        ("env RAIDEN_TRANSPORT_COALESCE_WINDOW_BYTES", "the data plane's write coalescing: no probe sets it"),
        ("env RAIDEN_NUMA_POLICY", "where host memory is placed among NUMA nodes: this machine has one"),
        ("env RAIDEN_DISABLE_SINGLETON_WORKER", CONTROLLER),
        ("env TPU_RAIDEN_DYNAMIC_HOST_STAGING", "host staging sized on demand: no probe sets it; pulls are judged "
                                                "under its default"),
    ),
)

# kvref's drop-in facade: the wrapper's API over kvref.
KVREF_COMPAT = Surface(
    roots=("kvref.compat", "kvref.metrics:METRICS"),
    env_words=("RAIDEN", "NUMA"),
    ruled=MANAGER_CALLS + (
        ("call kvref.compat.tpu_sync.KVCacheManager.reference", ("rebuild",)),
        ("setting kvref.compat.tpu_sync.KVCacheStore(*", ("store_call", "kv_store")),
        ("env ENABLE_MULTI_NUMA", ("pull_blocks",)),
        ("env TPU_RAIDEN_DATA_NICS", ("pull_blocks",)),
        ("env TPU_RAIDEN_SYSFS_ROOT", ("pull_blocks",)),
        ("env RAIDEN_SHM_*", ("shared_pool",)),
    ) + KVREF_EXPORTS,
    out=(
        ("call kvref.compat.tpu_sync.install", "puts the facade where a serving stack imports tpu_sync: the "
                                               "engine test's, not a manager's call"),
        ("call kvref.compat.tpu_sync.listen_host", "the address the facade listens on, read by its own tests"),
        ("call kvref.compat.tpu_sync.CopyFailed", "the exception a failed copy raises: judged as a FAIL by every "
                                                  "rule that waits"),
        ("call kvref.compat.tpu_sync.PoolExhausted", "the exception a full pool raises: judged as a REFUSE by fill"),
        ("* kvref.compat.data_rails*", "how many sub-managers the facade splits a manager into, read from the "
                                       "host: exercised by pull_blocks on a stand-in host's NICs"),
        ("* kvref.compat.shared_store*", "the store table under a shared-memory key: the shared_pool probe"),
    ),
)

# kvref's own manager, store and futures, as kvref-sim, kvref-jax and kvref-torch-xla drive them.
KVREF = Surface(
    roots=("kvref.manager:KVCacheManager", "kvref.kv_store:KVCacheStore", "kvref.futures:TransferFuture",
           "kvref.metrics:METRICS", "kvref.metrics:prometheus_text"),
    ruled=MANAGER_CALLS + (
        ("call kvref.manager.KVCacheManager.close", ("rebuild", "drop_producer", "release_order")),
        ("call kvref.manager.KVCacheManager.settings", ("settings",)),
        ("call kvref.manager.KVCacheManager.layer_bytes_per_block", ("rebuild",)),
        ("call kvref.manager.KVCacheManager.host_blocks", ("rebuild",)),
        ("call kvref.manager.KVCacheManager.host_bytes", ("rebuild", "host_budget")),
        ("setting kvref.manager.KVCacheManager(*", ("rebuild", "settings")),
        ("bound kvref.manager.KVCacheManager(timeout_s)", ("pull", "settle", "register")),
        ("call kvref.kv_store.KVCacheStore.*", ("store_call", "kv_store")),
        ("setting kvref.kv_store.KVCacheStore(*", ("store_call", "kv_store")),
        ("* kvref.futures.TransferFuture*", ("wait", "unawaited_transfers")),
        ("call kvref.manager.KVCacheManager.register_active_plan", ("plan", "plan_binding")),
        ("call kvref.manager.KVCacheManager.active_plan", ("plan", "plan_binding")),
        ("call kvref.manager.KVCacheManager.read_block_bytes", ("transfer", "host_chunks", "roundtrip")),
        ("call kvref.manager.KVCacheManager.chunk_state", ("fill", "unlock", "host_chunks")),
        ("call kvref.manager.KVCacheManager.chunks_available", ("fill", "host_chunks")),
        ("call kvref.manager.KVCacheManager.failure_reason", ("wait", "pull_failures")),
        ("call kvref.manager.KVCacheManager.adopt_saved", ("shared_pool",)),
        ("call kvref.manager.KVCacheManager.bytes_per_block", ("rebuild",)),
    ) + KVREF_EXPORTS,
    out=(
        ("call kvref.manager.KVCacheManager.unregister_active_plan",
         "drops the plan a manager keeps: no serving stack calls it; the plan rule reads one registered"),
        ("call kvref.manager.KVCacheManager.host_pool", "the pool's own object, for kvref's tests and benchmarks"),
        ("call kvref.manager.KVCacheManager.write_block_bytes",
         "writes host blocks directly, for kvref's fuzz campaign: no serving stack calls it"),
    ),
)
