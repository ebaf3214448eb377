"""The reference's host chunks (d2h_auto_allocate, unlock_blocks) and the
order it keeps between transfers and device work, checked against states
and bytes worked out by hand."""

import subprocess
import sys
import threading

import numpy as np
import pytest

import kvref
from kvref.polling import wait_for

SHAPE = (32, 8, 128)  # f32: 4 KiB blocks, contiguous on every generation


@pytest.fixture
def dev():
    return kvref.SimDevice("tpu7x")


def made(dev, seed=0):
    host = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
    cache = dev.put(host)
    cache.await_buffer()
    return cache, host


def block(host, i) -> bytes:
    return host[i].tobytes()  # contiguous layout: a block's bytes are its row's


def manager(dev, chunks=8, **kwargs):
    cache, host = made(dev)
    return kvref.KVCacheManager([cache], chunks, **kwargs), cache, host


def states(m, n=8):
    return [m.chunk_state(i).name for i in range(n)]


def test_a_save_locks_fresh_chunks_in_order_and_holds_the_blocks(dev):
    m, _, host = manager(dev)
    chunks, future = m.d2h_auto_allocate([5, 9], [2, 1])
    future.result()
    assert chunks == [0, 1, 2]
    assert states(m) == ["SAVED"] * 3 + ["FREE"] * 5
    assert [m.read_block_bytes(0, c) for c in chunks] == [block(host, b) for b in (5, 6, 9)]


def test_unlocked_chunks_keep_their_bytes_and_are_reused_after_free_ones_oldest_first(dev):
    m, _, host = manager(dev, chunks=4)
    first, f = m.d2h_auto_allocate([0, 1])
    f.result()
    m.unlock_blocks([first[1]])
    m.unlock_blocks([first[0]])
    assert states(m, 4) == ["CACHED", "CACHED", "FREE", "FREE"]
    assert m.read_block_bytes(0, 1) == block(host, 1)
    again, f = m.d2h_auto_allocate([10, 11, 12])
    f.result()
    assert again == [2, 3, 1]  # the free ones, then the chunk unlocked first


def test_a_pool_too_small_is_refused_whole_naming_both_counts(dev):
    m, _, _ = manager(dev, chunks=4)
    m.d2h_auto_allocate([0, 1, 2])[1].result()
    with pytest.raises(kvref.HostPoolExhausted, match=r"needs 2 host chunks but only 1 are free \(of 4"):
        m.d2h_auto_allocate([3, 4])
    assert m.chunks_available == 1
    assert m.d2h_auto_allocate([3])[0] == [3]


@pytest.mark.parametrize("src, sizes, message", [
    ([32], None, "device block range \\[32, 33\\) at index 0 is out of range|exceeds layer 0"),
    ([31], [2], "exceeds layer 0"),
    ([-1], None, "out of range"),
    ([], None, "got no source blocks"),
    ([0], [0], "copy size 0 at index 0 must be at least one block"),
    ([0, 1], [1], "differ in length"),
])
def test_a_refused_save_takes_no_chunk_and_moves_no_byte(dev, src, sizes, message):
    m, _, _ = manager(dev, chunks=4)
    before = m.host_pool().copy()
    with pytest.raises(ValueError, match=message):
        m.d2h_auto_allocate(src, sizes)
    assert states(m, 4) == ["FREE"] * 4 and m.chunks_available == 4
    assert np.array_equal(m.host_pool(), before)


@pytest.mark.parametrize("ids, message", [
    ([0], "host chunk 0 is not locked \\(CACHED\\)"),
    ([7], "host chunk 7 is not locked \\(FREE\\)"),
    ([8], "host chunk 8 is out of range \\[0, 8\\)"),
    ([1, 1], "host chunk 1 appears twice"),
    ([2, 0], "host chunk 0 is not locked"),
])
def test_a_bad_unlock_is_refused_and_unlocks_nothing(dev, ids, message):
    m, _, _ = manager(dev)
    chunks, f = m.d2h_auto_allocate([0, 1, 2])
    f.result()
    m.unlock_blocks([0])
    with pytest.raises(ValueError, match=message):
        m.unlock_blocks(ids)
    assert states(m, 3) == ["CACHED", "SAVED", "SAVED"]


HELD_US = 60_000_000  # a copy held until the test has looked (release_dma_hold), on any machine


def test_a_save_in_flight_cannot_be_unlocked_and_its_chunk_is_never_handed_out(dev):
    m, cache, host = manager(dev, chunks=2)
    cache.hold_next_dma(HELD_US)
    (chunk,), future = m.d2h_auto_allocate([4])
    assert m.chunk_state(chunk) == kvref.ChunkState.SAVING
    with pytest.raises(ValueError, match="still being saved"):
        m.unlock_blocks([chunk])
    del future  # dropped: the copy still owns its chunk
    other, f = m.d2h_auto_allocate([5])
    assert other == [1]
    with pytest.raises(kvref.HostPoolExhausted):
        m.d2h_auto_allocate([6])
    cache.release_dma_hold()
    f.result()
    wait_for(lambda: m.chunk_state(chunk) != kvref.ChunkState.SAVING, 10)
    assert m.chunk_state(chunk) == kvref.ChunkState.SAVED and m.read_block_bytes(0, chunk) == block(host, 4)


def test_a_failed_save_leaves_failed_chunks_that_cannot_be_loaded_until_unlocked(dev):
    m, cache, _ = manager(dev, chunks=2)
    cache.fail_dma_in(0, cache.nbytes)
    chunks, future = m.d2h_auto_allocate([0])
    with pytest.raises(kvref.DeviceError):
        future.result()
    assert m.chunk_state(chunks[0]) == kvref.ChunkState.FAILED
    with pytest.raises(ValueError, match="save failed \\(FAILED\\)"):
        m.h2d(chunks, [3])
    m.unlock_blocks(chunks)
    assert m.chunk_state(chunks[0]) == kvref.ChunkState.FREE


def test_a_plain_d2h_into_a_locked_chunk_is_refused(dev):
    m, _, _ = manager(dev)
    chunks, f = m.d2h_auto_allocate([0])
    f.result()
    with pytest.raises(ValueError, match="host block 0 is locked \\(SAVED\\) by d2h_auto_allocate"):
        m.d2h([1], chunks)
    m.d2h([1], [5]).result()  # an unlocked block is the caller's to write
    assert m.chunk_state(5) == kvref.ChunkState.CACHED


def test_a_chunk_a_plain_d2h_is_writing_is_not_handed_out(dev):
    m, cache, host = manager(dev, chunks=2)
    cache.hold_next_dma(HELD_US)
    f = m.d2h([3], [0])
    assert m.chunk_state(0) == kvref.ChunkState.WRITING
    chunks, g = m.d2h_auto_allocate([4])
    assert chunks == [1]
    cache.release_dma_hold()
    f.result()
    g.result()
    assert m.read_block_bytes(0, 0) == block(host, 3)


def test_eight_threads_never_share_a_locked_chunk(dev):
    m, _, _ = manager(dev, chunks=16)
    held, guard, twice = set(), threading.Lock(), []

    def work():
        for _ in range(200):
            chunks, f = m.d2h_auto_allocate([1, 2])
            with guard:
                twice.extend(c for c in chunks if c in held)
                held.update(chunks)
            f.result()
            with guard:
                held.difference_update(chunks)
            m.unlock_blocks(chunks)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not twice and m.chunks_available == 16


def test_an_h2d_from_a_chunk_whose_save_is_in_flight_reads_what_the_save_writes(dev):
    m, cache, host = manager(dev)
    cache.hold_next_dma(HELD_US)
    chunks, save = m.d2h_auto_allocate([7])
    load = m.h2d(chunks, [20])  # issued while the save is held in flight
    cache.release_dma_hold()
    load.result()
    save.result()
    assert np.array_equal(dev.fetch(cache)[20], host[7])


def test_an_unawaited_h2d_is_seen_by_the_next_read_of_the_device(dev):
    m, cache, host = manager(dev)
    m.d2h([2], [0]).result()
    cache.hold_next_dma(300_000)
    m.h2d([0], [9])  # not awaited
    assert np.array_equal(dev.fetch(cache)[9], host[2])


def test_an_op_issued_after_a_d2h_waits_for_its_copies(dev):
    m, cache, host = manager(dev)
    cache.hold_next_dma(HELD_US, until_next_op=True)  # until the op below has taken its place
    future = m.d2h([4], [1])
    cache.write_(np.zeros(SHAPE, np.float32))
    future.result()
    assert m.read_block_bytes(0, 1) == block(host, 4)
    assert not dev.fetch(cache).any()


def test_a_save_while_an_op_runs_moves_what_the_op_leaves(dev):
    m, cache, _ = manager(dev)
    new = np.full(SHAPE, 3.0, np.float32)
    cache.write_(new, run_us=60_000_000, until_needed=True)  # running until the save needs it
    chunks, future = m.d2h_auto_allocate([0, 31])
    future.result()
    assert [m.read_block_bytes(0, c) for c in chunks] == [block(new, 0), block(new, 31)]


def test_transfers_on_jax_arrays_have_landed_when_the_call_returns():
    jax = pytest.importorskip("jax")
    host = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    cache = jax.device_put(host.copy(), jax.devices("cpu")[0])
    m = kvref.KVCacheManager([cache], 8)
    chunks, future = m.d2h_auto_allocate(list(range(8)))
    assert future.done() and m.chunk_state(chunks[-1]) == kvref.ChunkState.SAVED
    assert m.h2d(chunks, list(range(8, 16))).done()
    assert np.array_equal(np.asarray(cache)[8:16], host[:8])


@pytest.mark.parametrize("setting, value, message", [
    ("parallelism", 0, "parallelism must be an integer in \\[1, 1024\\], got 0"),
    ("parallelism", 10**5, "parallelism must be an integer in \\[1, 1024\\], got 100000"),
    ("parallelism", 2.0, "parallelism must be an integer in \\[1, 1024\\], got 2.0"),
    ("timeout_s", 0, "timeout_s must be positive and finite, got 0"),
    ("timeout_s", float("nan"), "timeout_s must be positive and finite, got nan"),
    ("timeout_s", "5", "timeout_s must be a number of seconds, got '5'"),
])
def test_settings_that_mean_nothing_are_refused_by_name(dev, setting, value, message):
    cache, _ = made(dev)
    with pytest.raises((ValueError, TypeError), match=message):
        kvref.KVCacheManager([cache], 4, **{setting: value})


def test_a_manager_timeout_bounds_a_wait_on_its_future(dev):
    m, cache, _ = manager(dev, timeout_s=0.05, parallelism=1)
    cache.hold_next_dma(HELD_US)
    future = m.d2h([0], [0])
    with pytest.raises(TimeoutError):
        future.result()
    cache.release_dma_hold()


def test_exit_with_a_save_in_flight_is_clean():
    script = (
        "import kvref, numpy as np\n"
        "dev = kvref.SimDevice('tpu7x')\n"
        "cache = dev.put(np.ones((64, 8, 128), np.float32)); cache.await_buffer()\n"
        "cache.hold_next_dma(200_000)\n"
        "m = kvref.KVCacheManager([cache], 64)\n"
        "chunks, future = m.d2h_auto_allocate(list(range(64)))\n"
        "print('exiting', len(chunks))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exiting 64" in done.stdout
