"""The reference's pulls between managers (kvref.pulls), two managers in one
process on loopback: what moves, what is refused and where, how failures
settle, what a manager listens on, and the tpu-sync facade's form of it."""

import math
import os
import socket
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import kvref
from kvref import _core
from kvref.compat import tpu_sync
from kvref.oracle import lookup
from kvref.polling import wait_for
from kvref.sim_mesh import SimMesh
from probes.iut.sockets import listeners
from tests.no_threads import no_thread_for

KEY = kvref.ShapeKey("bf16", (64, 8, 256))
HALF = kvref.ShapeKey("bf16", (64, 4, 256))
BOUND = 10.0  # the longest any test polls


def host(key, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**16, key.dims, dtype=np.uint16).view(ml_dtypes.bfloat16)


@pytest.fixture
def device():
    return kvref.SimDevice("v5e")


def caches(device, seed, keys=(KEY,) * 3):
    hosts = [host(k, seed + i) for i, k in enumerate(keys)]
    return [device.put(h, shape=lookup(k.dtype, k.dims, "v5e").shape) for h, k in zip(hosts, keys)], hosts


def pair(device, keys=(KEY,) * 3, timeout_s=5.0, **producer):
    made = []
    for seed, listen in ((1, "127.0.0.1:0"), (2, None)):
        arrays, hosts = caches(device, seed, keys)
        manager = kvref.KVCacheManager(arrays, 8, timeout_s=timeout_s, listen=listen, slice_policy="per_layer",
                                       **(producer if listen else {}))
        made.append((manager, arrays, hosts))
    return made


def settle(manager, reqs, seconds=BOUND):
    """What poll_stats reports until every one of `reqs` is done or failed."""
    seen = ([], [], [])

    def settled() -> bool:
        for mine, got in zip(seen, manager.poll_stats()):
            mine.extend(got)
        return all(req in seen[1] or req in seen[2] for req in reqs)

    wait_for(settled, seconds, 0.005)
    return seen


def rows(a):
    return np.asarray(a).view(np.uint16).reshape(a.shape[0], -1)


def test_each_pull_is_one_telemetry_record_of_its_request_blocks_and_bytes(device):
    import json

    from kvref.pull_records import MAX_RECORDS

    (producer, _, _), (consumer, _, _) = pair(device, keys=(KEY, HALF, KEY))
    assert json.loads(consumer.dump_metrics_to_string()) == []
    req = 'r "1" \\ \u00e9'
    producer.register_read(req, 7 + MAX_RECORDS, [5, 3])
    producer.register_read("r2", 7, [1])
    consumer.start_read(req, 7 + MAX_RECORDS, producer.get_local_endpoints()[0]["endpoint"], [5, 3], [0, 1])
    consumer.start_read("r2", 7, producer.get_local_endpoints()[0]["endpoint"], [1], [2])
    assert sorted(settle(consumer, [req, "r2"])[1]) == sorted([req, "r2"])
    records = json.loads(consumer.dump_metrics_to_string())
    block = [KEY.dims[1] * KEY.dims[2] * 2, HALF.dims[1] * HALF.dims[2] * 2, KEY.dims[1] * KEY.dims[2] * 2]
    assert [(r["uuid"], r["req_id"], r["num_blocks"], r["total_bytes"]) for r in records] == [
        (7 + MAX_RECORDS, req, 2, 2 * sum(block)), (7, "r2", 1, sum(block))]
    for r in records:
        assert 0 <= r["connection_setup_us"] <= r["e2e_duration_us"] and r["h2d_copy_us"] >= 0
    assert json.loads(producer.dump_metrics_to_string()) == []  # the consumer's record only


def test_a_pull_moves_the_named_blocks_of_every_layer_in_list_order(device):
    (producer, _, theirs), (consumer, arrays, ours) = pair(device, keys=(KEY, HALF, KEY))
    remote, local = [5, 3, 9, 0, 63], [10, 2, 7, 63, 0]
    assert producer.register_read("r", 7, remote)
    consumer.start_read("r", 7, producer.get_local_endpoints()[0]["endpoint"], remote, local)
    assert settle(consumer, "r")[1] == ["r"]
    for layer, array in enumerate(arrays):
        got, want = rows(device.fetch(array)), rows(ours[layer]).copy()
        want[local] = rows(theirs[layer])[remote]
        assert np.array_equal(got, want), layer
    assert settle(producer, ["x"], 0.2)[0] == ["r"]  # done sending, once
    assert consumer.poll_stats() == producer.poll_stats() == ([], [], [])


@pytest.mark.parametrize("call, message", [
    (lambda c, ep: c.start_read("r", 1, ep, [1, 2], [1]), "has 2 blocks but local_block_ids has 1"),
    (lambda c, ep: c.start_read("r", 1, "", [1], [1]), "remote_endpoint is empty"),
    (lambda c, ep: c.start_read("r", 1, [], [1], [1]), "empty list"),
    (lambda c, ep: c.start_read("r", 1, ep, [1], [64]), r"local_block_ids must be in \[0, 64\)"),
    (lambda c, ep: c.start_read("r", 1, ep, [1, 2], [3, 3]), "more than once"),
    (lambda c, ep: c.start_read("r", 1, ep, [], []), "names no block"),
    (lambda c, ep: c.start_read("r", 2**64, ep, [1], [1]), "uuid must be"),
    (lambda c, ep: c.start_read("r", 1, ep, [1], [1], parallelism=0), "parallelism"),
    (lambda c, ep: c.start_read("r", 1, "127.0.0.1", [1], [1]), "not 'host:port'"),
])
def test_a_request_that_cannot_be_carried_out_is_refused_by_start_read(device, call, message):
    (producer, _, _), (consumer, arrays, ours) = pair(device)
    with pytest.raises(ValueError, match=message):
        call(consumer, producer.get_local_endpoints()[0]["endpoint"])
    assert consumer.poll_stats() == ([], [], [])
    assert np.array_equal(rows(device.fetch(arrays[0])), rows(ours[0]))


def test_register_read_refuses_blocks_out_of_range_and_a_uuid_still_in_use(device):
    (producer, _, _), (consumer, _, _) = pair(device)
    with pytest.raises(ValueError, match=r"block_ids must be in \[0, 64\)"):
        producer.register_read("r", 1, [0, 64])
    assert producer.register_read("r", 1, [0]) and not producer.register_read("q", 2, [])
    with pytest.raises(ValueError, match="uuid 1 is still registered"):
        producer.register_read("q", 1, [1])
    with pytest.raises(ValueError, match="request 'r' is still registered"):
        producer.register_read("r", 3, [1])
    with pytest.raises(ValueError, match="does not listen"):
        consumer.register_read("r", 1, [0])


def test_blocks_the_producer_never_registered_fail_the_pull_promptly_leaving_the_blocks(device):
    (producer, _, _), (consumer, arrays, ours) = pair(device)
    producer.register_read("r", 1, [1, 2])
    consumer.start_read("r", 1, producer.get_local_endpoints(), [1, 50], [1, 2])
    assert settle(consumer, "r")[2] == ["r"]
    # Promptly: failed for what it asked, not at timeout_s (the reason says which).
    assert "blocks [50] are not registered under uuid 1" in consumer.failure_reason("r")
    assert np.array_equal(rows(device.fetch(arrays[0])), rows(ours[0]))


def test_a_remote_that_never_answers_fails_the_pull_at_timeout_s(device):
    (_, _, _), (consumer, arrays, ours) = pair(device, timeout_s=1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        consumer.start_read("r", 1, f"127.0.0.1:{silent.getsockname()[1]}", [1], [1])
        assert settle(consumer, "r")[2] == ["r"]
    assert time.monotonic() - started >= 1.0  # not before timeout_s, however fast the machine
    assert "timeout_s=1.0" in consumer.failure_reason("r")
    assert np.array_equal(rows(device.fetch(arrays[0])), rows(ours[0]))


def test_a_registration_no_pull_lands_for_is_done_sending_at_its_timeout(device):
    (producer, _, _), _ = pair(device, timeout_s=0.5)
    producer.register_read("r", 1, [1])
    assert settle(producer, ["x"], 0.2)[0] == []
    time.sleep(0.5)
    assert producer.poll_stats()[0] == ["r"]
    assert producer.register_read("r", 1, [2])  # settled: both ids free again


def test_pulls_in_flight_at_once_settle_independently_and_once(device):
    (producer, _, theirs), (consumer, arrays, ours) = pair(device)
    endpoint = producer.get_local_endpoints()
    for n, req in enumerate("abc"):
        producer.register_read(req, n, [1, 2, 3])  # equal block lists never disturb each other
    consumer.start_read("a", 0, endpoint, [1, 2, 3], [10, 11, 12])
    consumer.start_read("b", 1, endpoint, [3, 2, 1], [20, 21, 22])
    consumer.start_read("c", 2, endpoint, [1, 2, 40], [30, 31, 32])
    seen = settle(consumer, "abc")
    done, failed = sorted(seen[1]), seen[2]
    assert done == ["a", "b"] and failed == ["c"], seen
    got = rows(device.fetch(arrays[0]))
    assert np.array_equal(got[[10, 11, 12, 20, 21, 22]], rows(theirs[0])[[1, 2, 3, 3, 2, 1]])
    assert np.array_equal(got[30:33], rows(ours[0])[30:33])


def test_a_uuid_request_id_or_local_block_still_being_pulled_is_refused(device):
    (producer, _, _), (consumer, _, _) = pair(device, timeout_s=3.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        consumer.start_read("r", 1, f"127.0.0.1:{silent.getsockname()[1]}", [1, 2], [1, 2])
        for args, message in ((("q", 1, [5], [5]), "uuid 1 is still being pulled"),
                              (("r", 2, [5], [5]), "request 'r' is still being pulled"),
                              (("q", 2, [5], [2]), r"local blocks \[2\] are still being written")):
            with pytest.raises(ValueError, match=message):
                consumer.start_read(args[0], args[1], producer.get_local_endpoints(), args[2], args[3])
        consumer.close()


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "5", 1e300, 2**64])
def test_timeout_s_must_be_positive_finite_and_one_the_waits_can_hold(device, value):
    arrays, _ = caches(device, 1)
    with pytest.raises((ValueError, TypeError), match="timeout_s"):
        kvref.KVCacheManager(arrays, 8, timeout_s=value, listen="127.0.0.1:0")


@pytest.mark.parametrize("setting, value", [("pull_slots", 0), ("pull_slot_blocks", 0), ("sub_managers", 0),
                                            ("listen", "localhost"), ("listen", "::1:0")])
def test_the_pull_settings_are_checked(device, setting, value):
    arrays, _ = caches(device, 1)
    with pytest.raises(ValueError, match=setting.split("_")[0]):
        kvref.KVCacheManager(arrays, 8, **{setting: value})


def test_a_manager_listens_only_where_asked_and_an_offload_only_one_not_at_all(device):
    before = set(listeners())
    arrays, _ = caches(device, 1)
    offload_only = kvref.KVCacheManager(arrays, 8)
    assert set(listeners()) == before and offload_only.get_local_endpoints() == []
    serving = kvref.KVCacheManager(arrays, 8, listen="127.0.0.1:0")
    opened = [l for l in listeners() if l not in before]
    assert [l.port for l in opened] == [int(serving.get_local_endpoints()[0]["endpoint"].rsplit(":", 1)[1])]
    assert all(l.loopback and not l.wildcard for l in opened)
    serving.close()
    assert set(listeners()) == before


def test_the_offload_only_listens_fault_opens_a_listener(device):
    before = set(listeners())
    arrays, _ = caches(device, 1)
    manager = kvref.KVCacheManager(arrays, 8, faults=["offload_only_listens"])
    assert [l for l in listeners() if l not in before] and manager.get_local_endpoints()


def test_a_manager_closed_mid_pull_fails_it_and_leaves_no_thread_or_listener(device):
    # A close that waited for the pull's timeout_s would outlast the test's own limit.
    (producer, _, _), (consumer, arrays, ours) = pair(device, timeout_s=3600.0)
    threads = threading.active_count()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        consumer.start_read("r", 1, f"127.0.0.1:{silent.getsockname()[1]}", [1], [1])
        consumer.close()
    assert consumer.poll_stats()[2] == ["r"] and "closed" in consumer.failure_reason("r")
    before = set(listeners())
    producer.close()
    assert len([l for l in before if l not in set(listeners())]) == 1
    assert wait_for(lambda: threading.active_count() <= threads, BOUND, 0.05)


def test_a_dropped_manager_stops_listening(device):
    import gc
    before = set(listeners())
    arrays, _ = caches(device, 1)
    manager = kvref.KVCacheManager(arrays, 8, listen="127.0.0.1:0")
    assert set(listeners()) != before
    del manager
    gc.collect()
    assert set(listeners()) == before


def test_sub_managers_serve_their_parts_and_a_broadcast_pull_is_refused_not_misrouted():
    mesh = SimMesh("v5e", 4)
    key = kvref.ShapeKey("bf16", (64, 16, 8, 128))
    sharding = kvref.Sharding.parse("mesh(model=4) spec(None,None,model)")
    theirs, ours = host(key, 1), host(key, 2)
    producer = kvref.KVCacheManager([mesh.put(theirs, sharding)], 8, listen="127.0.0.1:0", sub_managers=2,
                                    timeout_s=5)
    local = mesh.put(ours, sharding)
    consumer = kvref.KVCacheManager([local], 8, listen="127.0.0.1:0", sub_managers=2, timeout_s=5)
    endpoints = producer.get_local_endpoints()
    assert [e["shards"] for e in endpoints] == [[0, 2], [1, 3]]
    ports = [int(e["endpoint"].rsplit(":", 1)[1]) for e in endpoints]
    assert len(set(ports)) == 2
    producer.register_read("r", 1, [4, 5])
    consumer.start_read("r", 1, endpoints, [4, 5], [6, 7])
    assert settle(consumer, "r")[1] == ["r"]
    got = np.concatenate([s.device.fetch(s.data) for s in local.addressable_shards], axis=2)
    assert np.array_equal(rows(got)[[6, 7]], rows(theirs)[[4, 5]])
    producer.register_read("q", 2, [4, 5])
    consumer.start_read("q", 2, endpoints[0]["endpoint"], [4, 5], [8, 9])  # every part from sub-manager 0
    assert settle(consumer, "q")[2] == ["q"]
    assert "are not served at this endpoint" in consumer.failure_reason("q")


def test_the_facade_pulls_with_tpu_syncs_calls_and_refuses_what_it_cannot_do(device):
    arrays, theirs = caches(device, 1)
    producer = tpu_sync.KVCacheManager(arrays, local_control_port=0, max_blocks=8, num_slots=2, timeout_s=5.0)
    local, ours = caches(device, 2)
    consumer = tpu_sync.KVCacheManager(local, 0, host_blocks_to_allocate=8)
    assert consumer.get_local_endpoints() == [] and not consumer.is_listener_active
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    assert endpoint.startswith("127.0.0.1:")
    assert producer.register_read("r", 5, [1, 2])
    consumer.start_read("r", 5, endpoint, [1, 2], [3, 4])
    assert settle(consumer, "r")[1] == ["r"]
    assert np.array_equal(rows(device.fetch(local[0]))[[3, 4]], rows(theirs[0])[[1, 2]])
    with pytest.raises(ValueError, match="max_blocks"):
        tpu_sync.KVCacheManager(arrays, 0, max_blocks=0, num_slots=2)
    with pytest.raises(ValueError, match="RAIDEN_SHM_KEY, which is not set"):
        tpu_sync.KVCacheManager(arrays, 0, host_blocks_to_allocate=8, enable_shm=True)


def test_one_manager_at_a_time_attaches_a_shared_memory_key_and_its_segment_goes_with_it(device, monkeypatch):
    key = f"kvref-test-{os.getpid()}"
    arrays, _ = caches(device, 1)
    first = kvref.KVCacheManager(arrays, 8, shm_key=key)
    segments = sorted(p for p in os.listdir("/dev/shm") if key in p)
    assert segments == [f"kvref-pool-{key}", f"kvref-pool-{key}+pool"]  # the hold, and the pool's bytes
    with pytest.raises(ValueError, match=f"attached by another manager \\(pid {os.getpid()}\\)"):
        kvref.KVCacheManager(arrays, 8, shm_key=key)
    monkeypatch.setenv("RAIDEN_SHM_KEY", key)
    with pytest.raises(ValueError, match="attached by another manager"):
        tpu_sync.KVCacheManager(arrays, 0, host_blocks_to_allocate=8, enable_shm=True)
    first.close()
    assert not [p for p in os.listdir("/dev/shm") if key in p]
    second = tpu_sync.KVCacheManager(arrays, 0, host_blocks_to_allocate=8, enable_shm=True)
    del second
    assert not [p for p in os.listdir("/dev/shm") if key in p]  # a dropped manager lets go too
    with pytest.raises(ValueError, match="shm_key must be"):
        kvref.KVCacheManager(arrays, 8, shm_key="../x")


def test_a_manager_that_only_offloads_never_loads_grpc():
    # Every probe worker carries what its warm parent imported to its exit:
    # gRPC is loaded by the first manager that listens or pulls, not before.
    import subprocess
    import sys

    code = ("import sys, kvref\n"
            "m = kvref.KVCacheManager([kvref.SimDevice('v5e').zeros((64, 8, 128), 'f32')], 4)\n"
            "m.d2h([0], [1]).result()\n"
            "assert 'grpc' not in sys.modules, 'offloading loaded grpc'\n"
            "kvref.KVCacheManager([kvref.SimDevice('v5e').zeros((64, 8, 128), 'f32')], 4, listen='127.0.0.1:0')\n"
            "assert 'grpc' in sys.modules, 'a listening manager did not load grpc'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def hostile_call(endpoint: str, request: bytes, timeout: float = 5.0):
    """A client of the producer's Pull method that is no manager: raw bytes as the request."""
    import grpc

    channel = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", -1)])
    call = channel.unary_stream("/kvref.BlockPull/Pull", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)(request, timeout=timeout)
    return channel, call


def test_a_request_larger_than_the_protocol_carries_is_refused_and_honest_pulls_go_on(device):
    from kvref.proto.pull_pb2 import PullRequest

    (producer, _, theirs), (consumer, arrays, _) = pair(device)
    producer.register_read("honest", 7, [1, 2])
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    huge = PullRequest(uuid=7, req_id="x" * 10, block_ids=list(range(1_000_000))).SerializeToString()
    channel, call = hostile_call(endpoint, huge)
    import grpc

    with pytest.raises(grpc.RpcError) as refused:
        list(call)
    channel.close()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    consumer.start_read("honest", 7, endpoint, [1, 2], [3, 4])
    assert settle(consumer, ["honest"])[1] == ["honest"]
    assert np.array_equal(rows(device.fetch(arrays[0]))[[3, 4]], rows(theirs[0])[[1, 2]])


def test_calls_beyond_the_listeners_threads_are_refused_at_once_and_a_request_id_is_bounded(device):
    import grpc
    from kvref.listener import SERVER_THREADS
    from kvref.values import REQUEST_ID_BYTES as REQ_ID_BYTES
    from kvref.proto.pull_pb2 import PullRequest

    big = kvref.ShapeKey("bf16", (256, 8, 1024))  # 12 MiB a stream: past any flow-control window, so a stream
    (producer, _, _), (consumer, _, _) = pair(device, keys=(big,) * 3, timeout_s=2.0)  # left unread stays open
    blocks = list(range(big.dims[0]))
    producer.register_read("r", 9, blocks)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    request = PullRequest(uuid=9, req_id="r", block_ids=blocks).SerializeToString()
    held = [hostile_call(endpoint, request, timeout=1e6) for _ in range(SERVER_THREADS + 4)]
    codes = []
    for channel, call in held:  # each stream read to its first message, then left unread
        try:
            next(call)
            codes.append("open")
        except grpc.RpcError as e:
            codes.append(e.code())
    # Which calls the server takes first is its own affair (on a loaded machine, not the order they were made).
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 4 and codes.count("open") == SERVER_THREADS, codes
    for channel, _ in held:
        channel.close()
    with pytest.raises(ValueError, match=f"req_id must be at most {REQ_ID_BYTES} bytes"):
        consumer.start_read("r" * (REQ_ID_BYTES + 1), 9, endpoint, [0], [0])


def test_a_pull_waits_for_a_producer_whose_call_slots_are_all_taken(device, monkeypatch):
    """A producer's listener refuses a stream beyond its call slots at once; a
    pull asks again until its deadline instead of failing (a connector starts
    pulls for many requests at once)."""
    import threading

    import kvref.pulls
    from kvref.listener import SERVER_THREADS
    from kvref.proto.pull_pb2 import PullRequest

    big = kvref.ShapeKey("bf16", (256, 8, 1024))  # 12 MiB a stream: a stream left unread stays open
    (producer, _, theirs), (consumer, arrays, ours) = pair(device, keys=(big,) * 3, timeout_s=60.0)
    blocks = list(range(big.dims[0]))
    producer.register_read("held", 9, blocks)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    request = PullRequest(uuid=9, req_id="held", block_ids=blocks).SerializeToString()
    refused = threading.Event()
    wait = kvref.pulls._wait_for_busy_producer
    monkeypatch.setattr(kvref.pulls, "_wait_for_busy_producer", lambda seconds: (refused.set(), wait(seconds)))
    held = [hostile_call(endpoint, request, timeout=1e6) for _ in range(SERVER_THREADS)]
    try:
        for _, call in held:
            next(call)  # each takes a slot, read to its first message and left unread
        producer.register_read("r", 10, [5, 3])
        consumer.start_read("r", 10, endpoint, [5, 3], [0, 1])
        assert refused.wait(BOUND), "the pull was never refused by the busy producer"
        assert settle(consumer, ["r"], 0.2) == ([], [], [])  # not failed meanwhile
    finally:
        for channel, _ in held:
            channel.close()
    assert settle(consumer, ["r"])[1] == ["r"]
    for layer, array in enumerate(arrays):
        got, want = rows(device.fetch(array)), rows(ours[layer]).copy()
        want[[0, 1]] = rows(theirs[layer])[[5, 3]]
        assert np.array_equal(got, want), layer


@pytest.mark.parametrize("listen, sub_managers, message", [
    ("127.0.0.1:\u0663\u0663", 1, "is not 'host:port' with a port in"),  # Arabic-Indic digits: not the text form
    ("127.0.0.1:65535", 2, "the last, 65536, is past 65535"),
])
def test_a_listen_address_is_ascii_digits_and_every_sub_managers_port_a_port(listen, sub_managers, message):
    mesh = SimMesh("v5e", 2)
    sharding = kvref.Sharding.parse("mesh(model=2) spec(None,None,model)")
    arrays = [mesh.put(host(KEY, 1), sharding)]
    with pytest.raises(ValueError, match=message):
        kvref.KVCacheManager(arrays, 8, listen=listen, sub_managers=sub_managers)


def test_a_peer_that_posts_and_is_done_between_two_looks_is_heard(tmp_path, monkeypatch):
    """The rendezvous of a two-process probe: a peer that posts what is waited
    for and then is done, between the waiter's look for it and its look for
    done, was heard as done without posting it (a race two forked workers
    lose often)."""
    from probes.suite.rendezvous import CONSUMER, DONE, PRODUCER, Rendezvous

    waiter, peer = Rendezvous(tmp_path, PRODUCER), Rendezvous(tmp_path, CONSUMER)
    looked = Rendezvous.posted

    def posted(self, name):
        seen = looked(self, name)
        if name == "finished" and not (tmp_path / "consumer.done.json").exists():
            peer.post("finished")
            peer.post(DONE)
        return seen
    monkeypatch.setattr(Rendezvous, "posted", posted)
    assert waiter.first("finished", seconds=5) == "finished"


def test_a_pulls_write_undone_by_a_step_that_took_the_caches_meanwhile_is_written_again(device):
    # A JAX CPU step dispatched while a pull's thread writes the cache copies the whole cache
    # through a temporary and writes back what it read before. Here the first write is undone as
    # that step would undo it, and a new array holds the caches after it: the blocks must be written again.
    cs, hosts = caches(device, 0, keys=(KEY,))
    manager = kvref.KVCacheManager(cs, 8)
    staging = manager._pulls._staging
    block = manager.layer_bytes_per_block[0]
    blocks = [5, 9, 2]
    received = {(0, part, i): bytes([17 * i + part + 1]) * block
                for part in range(staging.layer_parts[0]) for i in range(len(blocks))}
    writes = []

    class StepDuringTheFirstWrite:
        def __init__(self, mover):
            self.mover = mover

        def __getattr__(self, name):
            return getattr(self.mover, name)

        def copy(self, direction, *args):
            done = self.mover.copy(direction, *args)
            if direction == _core.Direction.HOST_TO_DEVICE:
                writes.append(done)
                if len(writes) == 1:
                    done.wait()
                    cs[0].write_(hosts[0])  # what the step wrote back
            return done

    mover = staging._mover
    staging._mover = lambda: StepDuringTheFirstWrite(mover())
    holders = [object()]  # what holds the caches: a step that takes them leaves a new array

    def still():
        if len(writes) == 1 and len(holders) == 1:  # the step took them during the first write
            holders.append(object())
        return [holders[-1]]

    staging._still = still
    staging.write(blocks, received, None, time.monotonic() + BOUND)
    manager.d2h(blocks, [0, 1, 2]).result()
    assert [manager.read_block_bytes(0, i) for i in range(3)] == [received[0, 0, i] for i in range(3)]
    assert len(writes) == 2

    staging._still = lambda: None  # a step holds them all the while
    with pytest.raises(TimeoutError, match="not still for a whole copy"):
        staging.write(blocks, received, None, time.monotonic() + 0.2)


def test_a_landed_pull_undone_before_it_is_reported_is_written_again_by_poll_stats(device):
    # A JAX CPU step run inline on the serving thread can undo a pull's write and show as a move
    # only once it has run, after the pull's own check. poll_stats, between the serving thread's
    # steps, reads the blocks back and writes them again before it reports the pull done.
    (producer, _, theirs), (consumer, arrays, ours) = pair(device)
    assert not consumer._pulls._confirm_landed  # a simulated step never writes behind a pull
    consumer._pulls._confirm_landed = True  # as over raw storage (JAX CPU), where writing behind is stood in below
    remote, local = [4, 6], [1, 8]
    assert producer.register_read("r", 3, remote)
    consumer.start_read("r", 3, producer.get_local_endpoints()[0]["endpoint"], remote, local)
    assert wait_for(lambda: "r" in consumer._pulls._landed, BOUND, 0.005), "the pull did not land"
    for array, before in zip(arrays, ours):
        array.write_(before)  # what the step wrote back
    assert np.array_equal(rows(device.fetch(arrays[0])), rows(ours[0]))
    assert settle(consumer, ["r"])[1] == ["r"]
    for layer, array in enumerate(arrays):
        want = rows(ours[layer]).copy()
        want[local] = rows(theirs[layer])[remote]
        assert np.array_equal(rows(device.fetch(array)), want), layer


def test_a_pull_whose_thread_cannot_start_is_refused_and_leaves_nothing_registered(device):
    (producer, _, _), (consumer, _, _) = pair(device)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    assert producer.register_read("r", 3, [4])
    with no_thread_for("kvref-pull"), pytest.raises(RuntimeError, match="could not start the pull's thread "
                                                                       ".*nothing was started"):
        consumer.start_read("r", 3, endpoint, [4], [1])
    assert consumer.poll_stats() == ([], [], [])
    consumer.start_read("r", 3, endpoint, [4], [1])  # its request, uuid and block are free again
    assert settle(consumer, ["r"])[1] == ["r"]
    consumer.close()


def test_a_listener_serves_on_when_no_thread_can_be_started_at_a_call(device):
    # Its threads run from the start: grpc's server thread, submitting a call to a pool that had to start
    # a thread and could not, ended, and the listener with it, for good.
    (producer, _, _), (consumer, _, _) = pair(device)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    for n in range(3):
        assert producer.register_read(f"r{n}", 3 + n, [4 + n])
        with no_thread_for("kvref-listen"):
            consumer.start_read(f"r{n}", 3 + n, endpoint, [4 + n], [1 + n])
            assert settle(consumer, [f"r{n}"])[1] == [f"r{n}"]
    consumer.close()


@pytest.mark.parametrize("call", ["register_read", "start_read"])
def test_a_request_id_utf8_cannot_carry_is_refused_at_once_and_nothing_is_registered(device, call):
    (producer, _, _), (consumer, _, _) = pair(device)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    lone = "r\udc80"  # a lone surrogate: a str, but no UTF-8 (the wire's encoding) holds it
    with pytest.raises(ValueError, match="req_id must be text UTF-8 can carry"):
        if call == "register_read":
            producer.register_read(lone, 3, [4])
        else:
            consumer.start_read(lone, 3, endpoint, [4], [1])
    assert producer.register_read("r", 3, [4])  # its blocks are free: the refusal claimed nothing
    consumer.start_read("r", 3, endpoint, [4], [1])
    assert settle(consumer, ["r"])[1] == ["r"]


def test_a_strangers_settled_message_moves_no_registration_nothing_was_pulled_for(device):
    import grpc
    from kvref.proto.pull_pb2 import PullSettled

    (producer, _, _), (consumer, _, _) = pair(device)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    assert producer.register_read("r", 3, [4, 6])
    with grpc.insecure_channel(endpoint) as channel:  # knows the uuid, pulled nothing
        channel.unary_unary("/kvref.BlockPull/Settled", request_serializer=PullSettled.SerializeToString,
                            response_deserializer=lambda b: b)(PullSettled(uuid=3, landed=True), timeout=BOUND)
    assert producer.poll_stats()[0] == []  # still registered: the real consumer's pull goes on
    consumer.start_read("r", 3, endpoint, [4, 6], [1, 2])
    assert settle(consumer, ["r"])[1] == ["r"]
    sent = []
    assert wait_for(lambda: sent.extend(producer.poll_stats()[0]) or sent, BOUND)
    assert sent == ["r"]


def test_a_pull_started_before_its_registration_waits_for_it_and_lands(device):
    # The disaggregated connector's producer registers a request in its next step; its consumer can
    # be ahead. The production library's producer waits for the registration (up to min(timeout_s, 5 s)).
    (producer, _, theirs), (consumer, arrays, ours) = pair(device)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    consumer.start_read("r", 3, endpoint, [4, 6], [1, 8])
    time.sleep(0.3)
    assert producer.register_read("r", 3, [4, 6])
    assert settle(consumer, ["r"])[1] == ["r"]
    for layer, array in enumerate(arrays):
        want = rows(ours[layer]).copy()
        want[[1, 8]] = rows(theirs[layer])[[4, 6]]
        assert np.array_equal(rows(device.fetch(array)), want), layer


def test_a_forked_child_cannot_register_what_only_its_parents_listener_serves(device):
    # A fork has none of the listener's threads: a registration there could never be pulled.
    (producer, _, _), _ = pair(device)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            producer.register_read("r", 3, [4, 6])
            said = "accepted"
        except RuntimeError as e:
            said = str(e)
        os.write(write, said.encode()[:4000])
        os._exit(0)
    os.close(write)
    said = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    assert f"serves pulls from process {os.getpid()}, which this process was forked from" in said, said
    assert producer.register_read("r", 3, [4, 6])  # the parent still serves


def test_a_pull_copy_issued_while_a_simulated_step_computes_the_caches_is_made_again():
    """The serving thread may dispatch a step between a pull thread's look at
    the caches and its copy: on the simulated device the copy cannot be made
    then (the step still computes the caches), so it is made again once they
    are still, never failed for it."""
    from kvref.staging import Staging

    device = kvref.SimDevice("v5e")
    host = np.arange(32 * 8 * 128, dtype=np.float32).reshape(32, 8, 128).astype(ml_dtypes.bfloat16)
    cache = device.put(host)
    manager = kvref.KVCacheManager([cache], 4)
    looks, outputs = [], []

    def still():
        arrays = manager._still_arrays()
        if not looks:  # the serving thread dispatches a step, computing until needed, right after the first look
            outputs.append(arrays[0].donate_rows([20], np.ones((1, 8, 128), ml_dtypes.bfloat16), run_us=5_000_000,
                                                 until_needed=True))
        looks.append(arrays)
        return arrays

    staging = Staging(manager._pull_mover, still, slots=1, slot_blocks=4, layer_parts=(1,))
    [(where, data)] = list(staging.read([3, 5], None, time.monotonic() + 20))
    physical, row = kvref.pack(host, cache.shape), manager.layer_bytes_per_block[0]
    assert where == (0, 0, 0) and data == bytes(physical[3 * row:4 * row]) + bytes(physical[5 * row:6 * row])
    assert len(looks) >= 3  # the copy at the first look could not be made; the next looks followed the step


@pytest.mark.parametrize("faults, streams", [((), 1), ((), 3), (("pull_bytes_per_stream",), 3)])
def test_a_pull_counts_its_bytes_sent_and_received_once_and_its_time_once_it_landed(device, faults, streams):
    from tests.kvref.test_metrics import grew, scrape

    (producer, _, _), _ = pair(device)
    consumer = kvref.KVCacheManager(caches(device, 9)[0], 8, timeout_s=5.0, slice_policy="per_layer", faults=faults)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    before = scrape()
    producer.register_read("r", 7, [5, 3, 9])
    consumer.start_read("r", 7, endpoint, [5, 3, 9], [0, 1, 2], parallelism=streams)
    consumer.start_read("never", 8, endpoint, [1], [4])  # nothing registered under 8: nothing crosses
    assert sorted(settle(consumer, ["r", "never"])[1]) == ["r"]
    pulled = 3 * 3 * KEY.dims[1] * KEY.dims[2] * 2  # three blocks of three layers
    assert grew(before, "sent_bytes_total") == pulled
    assert grew(before, "received_bytes_total") == pulled * (streams if faults else 1)
    assert grew(before, "transfer_duration_ms_count") == 1


@pytest.mark.parametrize("faults, failures", [((), 1), (("landed_pull_counts_failure",), 2)])
def test_a_pull_that_failed_counts_one_failure_and_one_that_landed_none(device, faults, failures):
    from tests.kvref.test_metrics import grew, scrape

    (producer, _, _), _ = pair(device)
    consumer = kvref.KVCacheManager(caches(device, 9)[0], 8, timeout_s=5.0, slice_policy="per_layer", faults=faults)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    before = scrape()
    producer.register_read("r", 7, [5, 3])
    consumer.start_read("r", 7, endpoint, [5, 3], [0, 1])
    consumer.start_read("never", 8, endpoint, [1], [4])  # nothing registered under 8: it fails
    assert sorted(settle(consumer, ["r", "never"])[1]) == ["r"]
    assert grew(before, "transfer_failures_total") == failures


@pytest.mark.parametrize("faults, streams, samples", [((), 3, 3), (("p2p_time_per_stream",), 3, 9)])
def test_a_producer_times_a_landed_pull_once_per_layer(device, faults, streams, samples):
    from tests.kvref.test_metrics import grew, scrape

    (producer, _, _), (consumer, _, _) = pair(device, faults=faults)
    endpoint = producer.get_local_endpoints()[0]["endpoint"]
    before = scrape()
    producer.register_read("r", 7, [5, 3, 9])
    consumer.start_read("r", 7, endpoint, [5, 3, 9], [0, 1, 2], parallelism=streams)
    assert sorted(settle(consumer, ["r"])[1]) == ["r"]
    assert wait_for(lambda: "r" in producer.poll_stats()[0], 5.0, 0.01)  # the consumer's word reached it
    assert grew(before, "p2p_transfer_time_ms_count") == samples  # three layers
