"""kvref.compat.tpu_sync driven the way tpu-inference's offload connector
drives tpu-sync-jax (offload/raiden_offload_connector.py): built with
host_blocks_to_allocate and the buffer lock skipped; saves with
d2h_auto_allocate right after a step is dispatched, awaited later; loads
with h2d, not awaited before the next step; unlocks after a failed save and
when the scheduler evicts. Every byte checked."""

import importlib
import json
import re
import sys

import numpy as np
import pytest

import kvref
from kvref.compat import tpu_sync
from kvref.sim_mesh import SimMesh
from probes.suite.controller import StandinController
from probes.iut.sockets import free_loopback_port

SHAPE = (64, 16, 8, 128)  # (blocks, block size, kv heads x 2 / packing, head dim), f32: 64 KiB blocks
CHUNKS = 32


def caches_on(dev, seed=0):
    rng = np.random.default_rng(seed)
    hosts = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]
    caches = [dev.put(h) for h in hosts]
    for c in caches:
        c.await_buffer()
    return caches, hosts


def connector_manager(caches):
    return tpu_sync.KVCacheManager(kv_caches=caches, local_control_port=0, host_blocks_to_allocate=CHUNKS,
                                   unsafe_skip_buffer_lock=True)


def test_the_connector_pattern_on_the_simulated_device():
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    m = connector_manager(caches)
    # A model step is dispatched (it writes every cache), and wait_for_save saves at once.
    step = [np.full(SHAPE, float(i + 7), np.float32) for i in range(2)]
    for cache, new in zip(caches, step):
        cache.write_(new, run_us=60_000_000, until_needed=True)  # running until the save needs it
    saved_blocks = [3, 4, 5, 40]
    chunks, future = m.d2h_auto_allocate(saved_blocks)
    future.Await()  # get_finished
    for layer in range(2):
        for chunk, b in zip(chunks, saved_blocks):
            assert m.reference.read_block_bytes(layer, chunk) == step[layer][b].tobytes()
    # start_load_kv: h2d into other blocks, not awaited; the next step reads the cache.
    targets = [10, 11, 12, 13]
    m.h2d(chunks, targets)
    for layer, cache in enumerate(caches):
        assert np.array_equal(dev.fetch(cache)[targets], step[layer][saved_blocks])
    # The scheduler evicts: the chunks are unlocked and handed out again.
    m.unlock_blocks(chunks)
    assert m.reference.chunks_available == CHUNKS


def test_a_failed_save_is_unlocked_and_its_chunks_come_back():
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    m = connector_manager(caches)
    caches[1].fail_dma_in(0, caches[1].nbytes)
    chunks, future = m.d2h_auto_allocate([0, 1])
    with pytest.raises(RuntimeError, match="injected DMA failure"):
        future.Await()
    assert [m.reference.chunk_state(c) for c in chunks] == [kvref.ChunkState.FAILED, kvref.ChunkState.FAILED]
    m.unlock_blocks(chunks)  # what get_finished does after a failed save
    assert m.reference.chunks_available == CHUNKS


def test_the_connector_pattern_on_jax_cpu_arrays():
    jax = pytest.importorskip("jax")
    hosts = [np.random.default_rng(i).standard_normal(SHAPE).astype(np.float32) for i in range(2)]
    caches = [jax.device_put(h.copy(), jax.devices("cpu")[0]) for h in hosts]
    m = connector_manager(caches)
    chunks, future = m.d2h_auto_allocate([0, 62], [2, 2])
    future.Await()
    m.h2d(chunks, [20, 21, 22, 23])  # not awaited
    step = jax.jit(lambda x: x * 1.0)  # the next step reads the cache
    for cache, host in zip(caches, hosts):
        assert np.array_equal(np.asarray(step(cache))[20:24], host[[0, 1, 62, 63]])
    m.unlock_blocks(chunks[:2])
    with pytest.raises(ValueError, match="is not locked"):
        m.unlock_blocks(chunks[:1])


def test_the_constructor_refuses_what_the_facade_does_not_do():
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    with pytest.raises(NotImplementedError, match="backend_configs="):
        tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=4, backend_configs=[{"kind": "gcs"}])
    for bad, match in ((dict(raiden_controller_address="nope"), "raiden_controller_address 'nope' is not"),
                       (dict(worker_id=""), "worker_id must be printable text"),
                       (dict(node_id=-1), "node_id must be"), (dict(raiden_worker_port=70000), "raiden_worker_port")):
        with pytest.raises(ValueError, match=match):
            tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=4, **bad)
    with pytest.raises(ValueError, match="local_control_port must be"):
        tpu_sync.KVCacheManager(caches, 70000, host_blocks_to_allocate=4)
    with pytest.raises(ValueError, match="Must specify either"):
        tpu_sync.KVCacheManager(caches, 0)
    with pytest.raises(ValueError, match="parallelism must be an integer in"):
        tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=4, parallelism=0)
    assert tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2).reference.host_blocks == 8


def test_install_makes_the_production_import_path_the_facade():
    name = "kvref_facade_under_test"
    try:
        tpu_sync.install(name)
        module = importlib.import_module(f"{name}.api.jax.kv_cache_manager")
        assert module.KVCacheManager is tpu_sync.KVCacheManager
        with pytest.raises(ValueError, match="is importable here"):
            tpu_sync.install("numpy")
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_the_facade_answers_the_wrappers_remaining_calls():
    dev = kvref.SimDevice("v6e")
    caches, hosts = caches_on(dev)
    m = tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=SHAPE[0])
    whole = m.d2h()  # no offsets: every block into the host block of its number
    assert whole.wait() is None and whole.IsReady() and whole.is_ready()
    assert all(m.reference.read_block_bytes(1, b) == hosts[1][b].tobytes() for b in (0, SHAPE[0] - 1))
    free = m.reference.chunks_available
    with pytest.raises(RuntimeError, match="^RESOURCE_EXHAUSTED: Insufficient available blocks") as full:
        m.d2h_auto_allocate([0] * (free + 1))
    assert isinstance(full.value, kvref.HostPoolExhausted) and m.reference.chunks_available == free
    assert json.loads(m.dump_metrics_to_string()) == []  # a record per pull, as the wrapper's; none yet
    assert m.local_control_port is None and m.local_port() is None  # an offload-only manager listens nowhere


def test_a_failed_copy_is_the_wrappers_runtime_error():
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    m = connector_manager(caches)
    caches[0].fail_dma_in(0, caches[0].nbytes)
    with pytest.raises(tpu_sync.CopyFailed, match="^Async copy failed: .*injected DMA failure"):
        m.d2h([0], [0]).Await()


WILDCARD_SPELLINGS = ("0.0.0.0", "0", "0x0", "0.0", "000.000.000.000", "::", "[::]", "0:0::0", "[0:0:0:0:0:0:0:0]",
                      "::ffff:0.0.0.0", " ")


def test_the_facade_listens_on_the_host_the_stack_advertises_and_never_a_wildcard(monkeypatch):
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    monkeypatch.setenv(tpu_sync.HOST_VARIABLE, "127.0.0.2")
    m = tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2)
    [endpoint] = m.get_local_endpoints()
    assert endpoint["endpoint"] == f"127.0.0.2:{m.local_control_port}"
    m.reference.close()
    for spelling in WILDCARD_SPELLINGS:  # each binds every interface
        monkeypatch.setenv(tpu_sync.HOST_VARIABLE, spelling)
        with pytest.raises(ValueError, match=re.escape(f"VLLM_HOST_IP={spelling!r} is a wildcard")):
            tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2)


def test_install_gives_every_name_the_connectors_import():
    name = "tpu_raiden_names_test"
    tpu_sync.install(name)
    try:
        store_module = importlib.import_module(f"{name}.api.jax.kv_cache_store")
        top = importlib.import_module(name)
        assert store_module.KVCacheStore is tpu_sync.KVCacheStore and store_module.RaidenId is kvref.RaidenId
        assert issubclass(tpu_sync.KVCacheStore, kvref.KVCacheStore)
        assert top.KVCacheManager is tpu_sync.KVCacheManager and top.KVCacheStore is tpu_sync.KVCacheStore
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def test_a_manager_given_a_controller_registers_its_worker_and_where_it_serves():
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    quiet = tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2, raiden_worker_port=0)
    assert quiet.get_raiden_worker_port() == 0 and not quiet.is_listener_active  # no controller: no worker
    with StandinController() as controller:
        m = tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2, worker_id="w-3", node_id=2,
                                    raiden_controller_address=controller.address)
        again = tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2, raiden_controller_address=controller.address)
        first, second = controller.registrations(2, 10.0)
    port = m.get_raiden_worker_port()
    assert port > 0 and m.is_listener_active and again.get_raiden_worker_port() == port  # one worker per process
    assert (first["worker_id"], int(first["node_id"]), first["raiden_worker_endpoint"]) == ("w-3", 2, f"127.0.0.1:{port}")
    assert second["worker_id"] == "worker_0"  # the wrapper's default
    assert [(e["endpoint"], [int(s) for s in e["shards"]]) for e in first["raiden_transfer_endpoints"]] == \
        [(e["endpoint"], e["shards"]) for e in m.get_local_endpoints()]
    assert tuple(int(b) for b in first["block_array_bytes"]) == m.reference.layer_bytes_per_block
    with pytest.raises(ValueError, match=f"already listens on 127.0.0.1:{port}"):
        tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2, raiden_controller_address=controller.address,
                                raiden_worker_port=port + 1 if port < 65535 else port - 1)


def test_a_controller_that_is_down_is_logged_and_the_manager_serves_on(caplog):
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    dead = f"127.0.0.1:{free_loopback_port()}"
    m = tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2, raiden_controller_address=dead)
    assert f"could not register with the controller at {dead}" in caplog.text
    assert m.get_local_endpoints() and m.get_raiden_worker_port() > 0


def interfaces(root, **mtus):
    """A sysfs root whose class/net has these interfaces (each with a PCI device and its MTU) and lo."""
    for name, mtu in {**mtus, "lo": 65536}.items():
        (root / "class" / "net" / name).mkdir(parents=True)
        (root / "class" / "net" / name / "mtu").write_text(f"{mtu}\n")
        if name != "lo":
            (root / "class" / "net" / name / "device").mkdir()
    return root


def test_multi_numa_splits_a_listening_manager_per_data_plane_nic(tmp_path, monkeypatch):
    mesh = SimMesh("v5e", 4)
    key = kvref.ShapeKey("f32", (32, 16, 8, 128))
    sharding = kvref.Sharding.parse("mesh(model=4) spec(None,None,model)")
    cache = mesh.put(np.random.default_rng(0).standard_normal(key.dims).astype(np.float32), sharding)
    monkeypatch.setenv("TPU_RAIDEN_SYSFS_ROOT", str(interfaces(tmp_path, ens6=9000, enp192s4=9000, eth0=1500)))
    one = tpu_sync.KVCacheManager([cache], 0, max_blocks=4, num_slots=2)
    assert [e["shards"] for e in one.get_local_endpoints()] == [[0, 1, 2, 3]]  # ENABLE_MULTI_NUMA unset
    monkeypatch.setenv("ENABLE_MULTI_NUMA", "true")
    split = tpu_sync.KVCacheManager([cache], 0, max_blocks=4, num_slots=2)
    assert [e["shards"] for e in split.get_local_endpoints()] == [[0, 2], [1, 3]]  # two jumbo NICs with devices
    monkeypatch.setenv("TPU_RAIDEN_DATA_NICS", "ens6,eth0,enp192s4")
    port = free_loopback_port()
    named = tpu_sync.KVCacheManager([cache], port, host_blocks_to_allocate=8)
    endpoints = named.get_local_endpoints()
    assert [e["shards"] for e in endpoints] == [[0, 3], [1], [2]]
    assert [e["endpoint"] for e in endpoints] == [f"127.0.0.1:{port + i}" for i in range(3)]  # consecutive ports
    offload_only = tpu_sync.KVCacheManager([cache], 0, host_blocks_to_allocate=8)
    assert offload_only.get_local_endpoints() == []


@pytest.mark.parametrize("variable, value, message", [
    ("ENABLE_MULTI_NUMA", "yes", "expected 1 or true"),
    ("TPU_RAIDEN_DATA_NICS", "ens6,ens7", r"names \['ens7'\], which this host does not have"),
])
def test_a_multi_numa_setting_the_facade_cannot_honour_is_refused_by_name(tmp_path, monkeypatch, variable, value,
                                                                          message):
    monkeypatch.setenv("TPU_RAIDEN_SYSFS_ROOT", str(interfaces(tmp_path, ens6=9000)))
    monkeypatch.setenv("ENABLE_MULTI_NUMA", "1")
    monkeypatch.setenv(variable, value)
    mesh = SimMesh("v5e", 2)
    cache = mesh.put(np.zeros((32, 16, 8, 128), np.float32), kvref.Sharding.parse("mesh(model=2) spec(None,None,model)"))
    with pytest.raises(ValueError, match=message):
        tpu_sync.KVCacheManager([cache], 0, max_blocks=4, num_slots=2)


def test_a_worker_port_another_socket_holds_is_refused_and_the_manager_closed(monkeypatch):
    import socket

    from kvref import worker_registration

    monkeypatch.setattr(worker_registration, "_worker", None)  # this process's worker, made afresh here
    dev = kvref.SimDevice("v6e")
    caches, _ = caches_on(dev)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ValueError, match=f"raiden_worker_port={port}: cannot listen on 127.0.0.1:{port}"):
            tpu_sync.KVCacheManager(caches, 0, max_blocks=4, num_slots=2, raiden_worker_port=port,
                                    raiden_controller_address=f"127.0.0.1:{free_loopback_port()}")
    assert worker_registration._worker is None
