"""Host-to-host transfers between two reference managers (kvref.host_transfers):
reads and writes land every layer in the chunks reported, bad calls are
refused naming what was wrong with nothing taken, and a peer that fails or
lies part-way leaves nothing that looks written."""

import threading

import grpc
import numpy as np
import pytest

import kvref
from kvref.compat import tpu_sync
from kvref.polling import wait_for
from kvref.proto.pull_pb2 import BlockBytes, HostWriteHeader, HostWritePart
from tests.no_threads import no_thread_for

SHAPE = (32, 8, 128)  # f32: 4 KiB blocks
HOST_BLOCKS = 16


def manager(seed, serve=False, layers=2, **options):
    dev = kvref.SimDevice("v6e")
    rng = np.random.default_rng(seed)
    caches = [dev.put(rng.standard_normal(SHAPE).astype(np.float32)) for _ in range(layers)]
    listen = {"listen": "127.0.0.1:0", "serve_host": True} if serve else {}
    m = kvref.KVCacheManager(caches, HOST_BLOCKS, **{"timeout_s": 5.0, **listen, **options})
    m.d2h([0], [0], [HOST_BLOCKS]).result()  # host block b holds device block b
    return m


@pytest.fixture
def peers():
    server, client = manager(1, serve=True), manager(2)
    yield server, client, server.get_local_endpoints()[0]["endpoint"]
    client.close()
    server.close()


def same_blocks(a, a_blocks, b, b_blocks):
    return all(a.read_block_bytes(layer, x) == b.read_block_bytes(layer, y)
               for layer in range(a.num_layers) for x, y in zip(a_blocks, b_blocks))


def test_a_read_lands_each_block_in_the_chunk_reported_for_it(peers):
    server, client, peer = peers
    # Chunks handed out out of order: every one saved, then unlocked shuffled.
    chunks, future = client.d2h_auto_allocate(list(range(HOST_BLOCKS)))
    future.result()
    client.unlock_blocks(list(np.random.default_rng(3).permutation(chunks)))
    ids, future = client.h2h_read(peer, [9, 2, 14])
    future.result()
    assert ids != sorted(ids)
    assert [client.chunk_state(i) for i in ids] == [kvref.ChunkState.SAVED] * 3
    assert same_blocks(client, ids, server, [9, 2, 14])
    client.unlock_blocks(ids)


def test_a_write_lands_in_chunks_the_peer_keeps_locked(peers):
    server, client, peer = peers
    before = server.chunks_available
    ids, future = client.h2h_write(peer, [4, 7])
    assert future.done()
    future.result()
    assert [server.chunk_state(i) for i in ids] == [kvref.ChunkState.SAVED, kvref.ChunkState.SAVED]
    assert server.chunks_available == before - 2
    assert same_blocks(server, ids, client, [4, 7])


@pytest.mark.parametrize("blocks, message", [
    ([], "is empty"),
    ([1, 1], "more than once"),
    ([-1], "non-negative"),
    ("0", "must be"),
])
def test_a_bad_read_is_refused_taking_nothing(peers, blocks, message):
    server, client, peer = peers
    before = client.chunks_available
    with pytest.raises((ValueError, TypeError), match=message):
        client.h2h_read(peer, blocks)
    assert client.chunks_available == before


@pytest.mark.parametrize("blocks, message", [([HOST_BLOCKS], r"in \[0, 16\)"), ([3, 3], "more than once")])
def test_a_bad_write_is_refused_before_any_byte_moves(peers, blocks, message):
    server, client, peer = peers
    before = server.chunks_available
    with pytest.raises(ValueError, match=message):
        client.h2h_write(peer, blocks)
    assert server.chunks_available == before


@pytest.mark.parametrize("peer", ["127.0.0.1", "localhost:99999", 5])
def test_a_peer_that_is_not_host_port_is_refused(peers, peer):
    _, client, _ = peers
    with pytest.raises((ValueError, TypeError), match="peer"):
        client.h2h_read(peer, [1])


def test_a_block_that_holds_no_bytes_is_not_read_or_written():
    server, client = manager(1, serve=True), manager(2)
    empty = kvref.KVCacheManager([kvref.SimDevice("v6e").put(np.zeros(SHAPE, np.float32))], HOST_BLOCKS,
                                 listen="127.0.0.1:0", serve_host=True)
    try:
        with pytest.raises(ValueError, match="FREE"):
            empty.h2h_write(server.get_local_endpoints()[0]["endpoint"], [0])
        ids, future = client.h2h_read(empty.get_local_endpoints()[0]["endpoint"], [0])
        with pytest.raises(kvref.PeerTransferFailed, match="FREE"):
            future.result()
        assert client.chunk_state(ids[0]) == kvref.ChunkState.FAILED
    finally:
        for m in (server, client, empty):
            m.close()


def test_a_full_pool_refuses_by_name_on_either_side(peers):
    server, client, peer = peers
    ids, future = server.d2h_auto_allocate(list(range(HOST_BLOCKS)))
    future.result()
    with pytest.raises(kvref.HostPoolExhausted, match="h2h_write needs 1"):
        client.h2h_write(peer, [0])
    server.unlock_blocks(ids)
    with pytest.raises(kvref.HostPoolExhausted, match="h2h_read of 17 blocks"):
        client.h2h_read(peer, list(range(HOST_BLOCKS + 1)))


def test_a_listener_without_serve_host_refuses_host_transfers():
    plain, client = manager(1, listen="127.0.0.1:0"), manager(2)
    try:
        ids, future = client.h2h_read(plain.get_local_endpoints()[0]["endpoint"], [1])
        with pytest.raises(kvref.PeerTransferFailed, match="UNIMPLEMENTED"):
            future.result()
        client.unlock_blocks(ids)
        assert client.chunks_available == HOST_BLOCKS
    finally:
        plain.close()
        client.close()


def test_serve_host_needs_a_listener():
    with pytest.raises(ValueError, match="give listen="):
        kvref.KVCacheManager([kvref.SimDevice("v6e").put(np.zeros(SHAPE, np.float32))], 4, serve_host=True)


def test_managers_whose_blocks_differ_refuse_each_others_bytes():
    server = manager(1, serve=True)
    other = kvref.KVCacheManager([kvref.SimDevice("v6e").put(np.ones((32, 4, 128), np.float32))] * 2,
                                 HOST_BLOCKS, timeout_s=5.0)
    try:
        ids, future = other.h2h_read(server.get_local_endpoints()[0]["endpoint"], [1])
        with pytest.raises(kvref.PeerTransferFailed, match="bytes per block"):
            future.result()
        assert other.chunk_state(ids[0]) == kvref.ChunkState.FAILED
    finally:
        server.close()
        other.close()


def write_parts(header, blocks):
    yield HostWritePart(header=header)
    yield from (HostWritePart(block=b) for b in blocks)


@pytest.mark.parametrize("lie", ["short", "wrong_size", "repeat", "no_header", "too_many_blocks"])
def test_a_writer_that_lies_leaves_nothing_written_and_honest_writes_go_on(peers, lie):
    server, client, peer = peers
    sizes, parts = list(server.layer_bytes_per_block), [1] * server.num_layers
    header = HostWriteHeader(blocks=1, layer_block_bytes=sizes, layer_shards=parts)
    block = BlockBytes(layer=0, shard=0, position=0, data=bytes(sizes[0]))
    sent = {"short": [block], "wrong_size": [BlockBytes(layer=0, shard=0, position=0, data=b"x")],
            "repeat": [block, block], "no_header": [block],
            "too_many_blocks": []}[lie]
    if lie == "too_many_blocks":
        header = HostWriteHeader(blocks=10**6, layer_block_bytes=sizes, layer_shards=parts)
    messages = (HostWritePart(block=b) for b in sent) if lie == "no_header" else write_parts(header, sent)
    before = server.chunks_available
    with grpc.insecure_channel(peer) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            channel.stream_unary("/kvref.HostTransfer/Write", request_serializer=HostWritePart.SerializeToString,
                                 response_deserializer=lambda b: b)(messages, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert server.chunks_available == before
    ids, future = client.h2h_write(peer, [5])
    assert same_blocks(server, ids, client, [5])


def test_a_stalled_writer_is_cut_off_at_timeout_s_and_its_chunks_freed():
    server = manager(1, serve=True, timeout_s=0.5)
    peer = server.get_local_endpoints()[0]["endpoint"]
    sizes = list(server.layer_bytes_per_block)
    release = threading.Event()

    def stalled():
        yield HostWritePart(header=HostWriteHeader(blocks=2, layer_block_bytes=sizes, layer_shards=[1, 1]))
        release.wait(10)  # sends nothing more until told
    try:
        with grpc.insecure_channel(peer) as channel:
            with pytest.raises(grpc.RpcError) as cut:
                channel.stream_unary("/kvref.HostTransfer/Write", request_serializer=HostWritePart.SerializeToString,
                                     response_deserializer=lambda b: b)(stalled(), timeout=30)
            release.set()
        assert cut.value.code() == grpc.StatusCode.CANCELLED
        # The server's thread lets go once its stream ends.
        assert wait_for(lambda: server.chunks_available == HOST_BLOCKS, 10)
    finally:
        release.set()
        server.close()


def test_close_fails_a_read_in_flight():
    server = manager(1, serve=True)
    client = manager(2)
    peer = server.get_local_endpoints()[0]["endpoint"]
    server.close()  # nothing listens there now
    ids, future = client.h2h_read(peer, [1])
    with pytest.raises(kvref.PeerTransferFailed):
        future.result()
    client.close()
    assert client.chunk_state(ids[0]) == kvref.ChunkState.FAILED


def test_the_facade_moves_host_blocks_as_the_native_manager_does():
    """As tpu-sync's own tests drive it: a whole-cache d2h() fills the host,
    then h2h_write and h2h_read of two blocks each, through `_impl`."""
    dev = kvref.SimDevice("v6e")
    rng = np.random.default_rng(5)
    theirs = [rng.standard_normal((8, 8, 128)).astype(np.float32) for _ in range(2)]
    listening = tpu_sync.KVCacheManager([dev.put(h) for h in theirs], 0, max_blocks=8, num_slots=1)
    ours = [dev.put(np.zeros((8, 8, 128), np.float32)) for _ in range(2)]
    local = tpu_sync.KVCacheManager(ours, 0, host_blocks_to_allocate=8)
    try:
        listening.d2h().Await()
        peer = listening.get_local_endpoints()[0]["endpoint"]
        ids, future = local._impl.h2h_read(peer=peer, src_block_ids=[2, 3])
        future.Await()
        assert ids == [0, 1]
        local.h2d(src_offsets=[0], dst_offsets=[0], copy_sizes=[2]).Await()
        for cache, host in zip(ours, theirs):
            assert np.array_equal(dev.fetch(cache)[0:2], host[2:4])
        written, future = local._impl.h2h_write(peer=peer, src_block_ids=[0, 1])
        future.Await()
        assert len(written) == 2
    finally:
        local.reference.close()
        listening.reference.close()


def test_a_read_whose_thread_cannot_start_claims_nothing_and_its_manager_still_closes(peers):
    server, client, peer = peers
    free = client.chunks_available
    with no_thread_for("kvref-h2h"), pytest.raises(RuntimeError, match="h2h_read could not start its thread "
                                                                      ".*nothing was claimed"):
        client.h2h_read(peer, [1, 2])
    assert client.chunks_available == free
    ids, future = client.h2h_read(peer, [1, 2])
    future.result()
    assert same_blocks(client, ids, server, [1, 2])
    client.close()


def test_a_write_whose_peer_cannot_start_its_timer_is_refused_saying_so_and_claims_nothing(peers, monkeypatch):
    server, client, peer = peers
    start = threading.Thread.start

    def no_timers(thread):
        if isinstance(thread, threading.Timer):
            raise RuntimeError("can't start new thread")
        start(thread)

    free = server.chunks_available, client.chunks_available
    monkeypatch.setattr(threading.Thread, "start", no_timers)
    with pytest.raises(RuntimeError, match="could not start the thread that times a write .*nothing was written"):
        client.h2h_write(peer, [1, 2])
    monkeypatch.setattr(threading.Thread, "start", start)
    assert (server.chunks_available, client.chunks_available) == free
    written, future = client.h2h_write(peer, [1, 2])
    future.result()
    server.unlock_blocks(written)
