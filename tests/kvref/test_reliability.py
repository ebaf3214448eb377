"""Regression tests for the defects a fuzz campaign found in kvref: each ran
in a subprocess (a crash there fails this test, not the suite) and must now
end in a clear error or a correct answer."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvref


def run_alone(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("code, needle", [
    # A tile count of (extent + t - 1) / t wrapped: size 0, then SIGSEGV in pack.
    ("""
     import numpy as np, kvref
     kvref.pack(np.arange(4, dtype=np.uint16), kvref.Shape.parse("u16[4]{0:T(9223372036854775807)}"))
     """, "physical bit count overflows int64"),
    ("""
     import kvref
     kvref.SimDevice("v5e").zeros((4,), "u16", shape=kvref.Shape.parse("u16[4]{0:T(9223372036854775807)}"))
     """, "overflows int64"),
    ("""
     import kvref
     kvref.unpack(b"", kvref.Shape.parse("u16[1000000]{0:T(9223372036854775807)}"))
     """, "overflows int64"),
    # The task did not keep the host array alive: freed memory was written.
    ("""
     import gc, time, numpy as np, kvref
     dev = kvref.SimDevice("v5e")
     s = kvref.Shape.parse("bf16[32768,8,128]{2,1,0:T(8,128)(2,1)}")
     x = dev.ones(s.dims, "bf16", shape=s); dev.set_dma_faults(delay_us=20000)
     host = np.zeros(s.physical_size_bytes, np.uint8)
     kvref.transfer_d2h_async(x, host, list(range(64)), list(range(64)))
     del host; gc.collect()
     filler = [np.full(s.physical_size_bytes, 7, np.uint8) for _ in range(4)]
     time.sleep(2)
     assert all((f == 7).all() for f in filler), "the transfer wrote into another array"
     raise SystemExit("ok")
     """, "ok"),
])
def test_crashers_are_clear_errors_now(code, needle):
    done = run_alone(code)
    assert done.returncode in (0, 1), f"died by signal {-done.returncode}: {done.stderr[-2000:]}"
    assert needle in done.stderr, done.stderr[-2000:]


def test_rounding_cannot_make_a_size_negative():
    shape = kvref.Shape.parse("u4[1]{0:T(2305843009213693951)E(4)}")
    assert shape.physical_size_bytes == 2305843009213693951 // 2 + 1  # 4-bit slots, rounded up
    with pytest.raises(kvref.AllocationError, match=r"packing u4\[1\].* would allocate "
                       r"1,152,921,504,606,846,976 bytes .* over the .*-byte limit"):
        kvref.pack(np.zeros(1, kvref.element_type("u4").numpy), shape)


@pytest.mark.parametrize("text", ["f32[512,16,\uff13]", "f8e4m3fn[512,4,1_024]", "f32[+4]",
                                  "bf16[4]{0:T(\u0668)}"])
def test_shape_text_is_ascii_digits_only(text):
    with pytest.raises(kvref.LayoutError, match="ASCII digits|unsupported layout part"):
        kvref.Shape.parse(text)


def test_scalar_and_empty_shapes_get_a_clear_error():
    for text in ("f16[]", "f16[0,4]"):
        with pytest.raises(kvref.LayoutError, match="no dim-0 rows to address"):
            kvref.validate_major_slice_addressable(kvref.Shape.parse(text))


def test_sizes_are_checked_before_allocating(monkeypatch):
    monkeypatch.setenv("KVREF_MAX_ALLOCATION_BYTES", str(2**20))
    shape = kvref.Shape.parse("f32[1024,512]{1,0}")  # 2 MiB
    for call in (lambda: kvref.pack(np.zeros(shape.dims, np.float32), shape),
                 lambda: kvref.unpack(np.zeros(shape.physical_size_bytes, np.uint8), shape),
                 lambda: kvref.SimDevice("v5e").zeros(shape.dims, "f32", shape=shape),
                 lambda: kvref.element_byte_offsets(shape)):
        with pytest.raises(kvref.AllocationError, match=r"would allocate [0-9,]+ bytes .* over the "
                           r"1,048,576-byte limit .*nothing was allocated"):
            call()
    big_rows = kvref.Shape.parse("u8[1099511627776]{0}")
    with pytest.raises(kvref.AllocationError, match="the major-slice analysis of u8"):
        kvref.major_slice(big_rows)


def test_plan_sizes_are_checked_before_protobuf_sees_them():
    dev = kvref.SimDevice("tpu7x")
    m = kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], 4)
    valid = kvref.StartTransferRequest(uuid="p", layer_ids=[0], src_block_ids=[1], dst_block_ids=[2])
    with pytest.raises(ValueError, match=r"a plan request of 2,147,483,655 bytes is over the 67,108,864"):
        m.register_active_plan("p", bytes(2**31 + 7), True)
    padded = valid.SerializeToString() + bytes(2**26)
    with pytest.raises(ValueError, match="over the 67,108,864-byte limit"):
        m.register_active_plan("p", padded, True)
    with pytest.raises(ValueError, match="no active plan with uuid 'p'"):
        m.active_plan("p")


def test_a_huge_pool_is_refused_in_its_own_terms():
    dev = kvref.SimDevice("tpu7x")
    with pytest.raises(kvref.PoolTooLarge, match=r"the host pool would take [0-9,]+ bytes "
                       r"\(4503599627370496 host blocks x 1 layers x 1 shards\)"):
        kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], 2**52)


FORKED = """
import os, kvref, numpy as np
dev = kvref.SimDevice("tpu7x")
cache = dev.put(np.ones((64, 8, 128), np.float32)); cache.await_buffer()
manager = kvref.KVCacheManager([cache], 8)
manager.d2h([0], [0]).result()  # the parent's copy threads exist now
cache.hold_next_dma(2_000_000)
pending = manager.d2h([2], [2])
pid = os.fork()
if pid == 0:
    seen = []
    d = kvref.SimDevice("tpu7x"); fresh = d.put(np.ones((64, 8, 128), np.float32))
    kvref.KVCacheManager([fresh], 8).d2h([0], [0]).result(timeout=10)
    seen.append("new manager ok")
    for what, call in (("future", lambda: pending.result(timeout=10)), ("device", lambda: cache.fill_(2.0))):
        try:
            call()
        except kvref.DeviceError as e:
            seen.append(what + " refused: " + ("before a fork" in str(e) and "said why" or str(e)))
    print(";".join(seen), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
pending.result()
"""


def test_a_forked_child_moves_blocks_and_refuses_what_it_inherited():
    """The copy pool's threads do not exist in a forked child: it gets a pool
    of its own, and a future or device its parent runs is refused, saying
    why, instead of waiting forever."""
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "new manager ok;future refused: said why;device refused: said why" in done.stdout


def test_a_multiprocessing_fork_pool_moves_blocks():
    script = (
        "import multiprocessing as mp, kvref, numpy as np\n"
        "kvref.KVCacheManager([kvref.SimDevice('tpu7x').ones((64, 8, 128), 'f32')], 8).d2h([0], [0]).result()\n"
        "def work(i):\n"
        "    cache = kvref.SimDevice('tpu7x').ones((64, 8, 128), 'f32')\n"
        "    kvref.KVCacheManager([cache], 8).d2h([i], [0]).result(timeout=10)\n"
        "    return i\n"
        "with mp.get_context('fork').Pool(2) as pool:\n"
        "    print(pool.map(work, range(4)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "[0, 1, 2, 3]" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("ids, message", [
    (np.array([1, 2], dtype="m8[s]"), "must hold integers, got timedelta64"),
    ([np.timedelta64(3)], "must be an integer block number that fits in int64, got np.timedelta64"),
    (np.ma.array([1, 2], mask=[0, 1]), "is a masked array"),
    (np.array([2**63], dtype=np.uint64), "fits in int64, got 9223372036854775808"),
])
def test_block_ids_that_mean_nothing_are_refused_with_the_value_given(ids, message):
    cache = kvref.SimDevice("tpu7x").zeros((64, 8, 128), "f32")
    manager = kvref.KVCacheManager([cache], 8)
    with pytest.raises(ValueError, match=message):
        manager.d2h(ids, [0] * len(ids))


def test_block_ids_of_mixed_numpy_integer_types_move_their_blocks():
    """NumPy makes a list of uint64 and int64 scalars a float64 array; such a
    list was once refused as 'must hold integers, got float64'."""
    host = np.arange(64 * 8 * 128, dtype=np.float32).reshape(64, 8, 128)
    manager = kvref.KVCacheManager([kvref.SimDevice("tpu7x").put(host)], 8)
    manager.d2h([np.uint64(5), np.int64(3)], (np.uint8(0), np.int16(1))).result(timeout=30)
    assert manager.read_block_bytes(0, 0) == host[5].tobytes()
    assert manager.read_block_bytes(0, 1) == host[3].tobytes()


@pytest.mark.parametrize("make, needle", [
    (lambda cache: kvref.KVCacheManager([cache], np.timedelta64(8)), "host_blocks must be a positive integer"),
    (lambda cache: kvref.KVCacheManager([cache], 8, parallelism=np.timedelta64(2)), "parallelism must be"),
    (lambda cache: kvref.KVCacheManager([cache], 8).read_block_bytes(np.timedelta64(0), 0), "layer must be"),
    (lambda cache: cache.write_(np.zeros((64, 8, 128), np.float32), run_us=np.timedelta64(1)), "run_us must be"),
    (lambda cache: kvref.ShapeKey("f32", (np.timedelta64(4),)), "dim np.timedelta64.4. of f32.* must be a non-negative integer"),
    (lambda cache: kvref.Layout((np.timedelta64(0),)), "minor_to_major np.timedelta64.0. is not an integer"),
])
def test_one_meaning_of_an_integer_everywhere(make, needle):
    """A NumPy time span counts as a NumPy integer; no kvref integer takes one."""
    cache = kvref.SimDevice("tpu7x").zeros((64, 8, 128), "f32")
    with pytest.raises((ValueError, TypeError), match=needle):
        make(cache)


@pytest.mark.parametrize("value", [1, np.int8(1), "true", np.array(True), [True], None])
def test_one_meaning_of_a_flag_everywhere(value):
    from kvref.compat import tpu_sync

    cache = kvref.SimDevice("tpu7x").zeros((64, 8, 128), "f32")
    request = kvref.StartTransferRequest(uuid="u", layer_ids=[0], src_block_ids=[1], dst_block_ids=[2])
    manager = kvref.KVCacheManager([cache], 8)
    with pytest.raises(kvref.NotAFlag, match="is_sender must be a bool, got"):
        manager.register_active_plan("u", request.SerializeToString(), is_sender=value)
    with pytest.raises(kvref.NotAFlag, match="unsafe_skip_buffer_lock must be a bool, got"):
        tpu_sync.KVCacheManager([cache], 0, host_blocks_to_allocate=8, unsafe_skip_buffer_lock=value)


def test_plan_roles_and_budgets_take_only_what_they_mean():
    cache = kvref.SimDevice("tpu7x").zeros((64, 8, 128), "f32")
    manager = kvref.KVCacheManager([cache], 8)
    request = kvref.StartTransferRequest(uuid="u", layer_ids=[0], src_block_ids=[1], dst_block_ids=[2])
    with pytest.raises(TypeError, match="is_sender must be a bool, got 'false'"):
        manager.register_active_plan("u", request.SerializeToString(), is_sender="false")
    with pytest.raises(kvref.AllocationError, match="the host pool would allocate"):
        kvref.KVCacheManager([cache], 2**32, host_budget_bytes=2**62)
    with pytest.raises(ValueError, match="host_budget_bytes must be a non-negative integer, got -1"):
        kvref.KVCacheManager([cache], 8, host_budget_bytes=-1)
    with pytest.raises(ValueError, match=r"host_budget_bytes must be a non-negative integer no larger than "
                       r"9223372036854775807 \(int64\), got 1180591620717411303424"):
        kvref.KVCacheManager([cache], 8, host_budget_bytes=2**70)


def test_a_layout_of_tens_of_thousands_of_tiles_is_refused_at_parse_not_a_stack_overflow():
    """The layout arithmetic recurses over the tile tree; a layout of 50,000
    tiles once crashed the slice analysis (SIGSEGV). It runs in a process of
    its own, so a crash is a failure, not the end of the test run."""
    script = (
        "import kvref\n"
        "text = 'f32[8,128]{1,0:T' + '(1,1)' * 50000 + '}'\n"
        "for attempt in (lambda: kvref.major_slice(kvref.Shape.parse(text)),\n"
        "                lambda: kvref.Shape('f32', (8, 128), kvref.Layout((1, 0), ((1, 1),) * 50000))):\n"
        "    try:\n"
        "        attempt()\n"
        "    except kvref.LayoutError as e:\n"
        "        assert 'a layout of 50000 tiles; at most 8 are supported' in str(e), str(e)[:300]\n"
        "        assert len(str(e)) < 2000, 'the message repeats the whole input'\n"
        "    else:\n"
        "        raise AssertionError('accepted')\n"
        "print('refused')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "refused" in done.stdout, (done.returncode, done.stderr[-2000:])


RACING_EXIT = """
import sys, time
import numpy as np, kvref
sys.setswitchinterval(30)  # the main thread keeps the GIL: no hand-over to the copy thread


class SlowToFinalize:
    def __del__(self):
        time.sleep(0.3)  # drops the GIL while the interpreter finalizes


slow = SlowToFinalize()
cache = kvref.SimDevice("tpu7x").ones((64, 8, 128), "f32")
cache.await_buffer()
cache.hold_next_dma(300_000)
future = kvref.transfer_d2h_async(cache, np.zeros(4 * 8 * 128, np.float32), [0, 1, 2, 3], [0, 1, 2, 3])
deadline = time.monotonic() + 30
while not future.done() and time.monotonic() < deadline:
    pass  # holding the GIL: the copy ends, and its thread waits to let go of the host array
spin = time.perf_counter() + 0.2
while time.perf_counter() < spin:
    pass
"""


@pytest.mark.parametrize("ending, status", [("sys.exit(0)", 0), ("del future", 0), ("raise SystemExit(0)", 0),
                                            ("raise RuntimeError('planned')", 1)])
def test_the_interpreter_ends_cleanly_while_a_raw_transfer_owns_a_host_array(ending, status):
    """A raw transfer keeps its host array alive until its copy ends. A copy
    thread that had finished and waited for the GIL to let go of it got the
    GIL while the interpreter finalized, which aborted the process
    ('terminate called without an active exception')."""
    done = subprocess.run([sys.executable, "-c", RACING_EXIT + ending], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == status, done.stderr[-2000:]
    assert "terminate called" not in done.stderr and "Fatal Python error" not in done.stderr, done.stderr[-2000:]
