"""The simulated device: layouts, physical bytes, lifecycle, DMA faults."""

import time

import numpy as np
import pytest

import kvref
from kvref import BufferState
from tests import numpy_model
from probes.iut.host_data import random_host
from tests.strategies import same_bytes


def test_arrays_take_the_generations_layout_and_physical_order():
    """The physical bytes against the NumPy model: kvref.pack and fetch share the
    device's C++ placement, so a buffer compared with its own round trip passes
    whatever order the bytes are in."""
    dev = kvref.SimDevice("tpu7x")
    a = dev.arange((512, 6144), "bf16")
    assert str(a.shape) == "bf16[512,6144]{1,0:T(8,128)(2,1)}"
    want = np.arange(512 * 6144).astype(kvref.element_type("bf16").numpy).reshape(512, 6144)
    host = dev.fetch(a)
    assert host.dtype == want.dtype and same_bytes(host, want)
    np.testing.assert_array_equal(a.physical_bytes(), numpy_model.pack(want, a.shape))
    v3 = kvref.SimDevice("v3").zeros((512, 12288), "s8")
    assert v3.shape.layout.tiles[0] == (8, 128)


def test_put_element_lands_at_the_hand_computed_byte():
    """bf16[512,6144]{1,0:T(8,128)(2,1)} by hand: 8x128 tiles, 48 to a row of
    tiles, 2,048 bytes each; in a tile, (2,1) sub-tiles put (r, c) in slot
    256*(r//2) + 2*c + r%2. Element (9, 130) is in tile 1*48 + 1 = 49 (byte
    100,352), slot 2*2 + 1 = 5 (byte 10): bytes 100,362 and 100,363."""
    dev = kvref.SimDevice("tpu7x")
    x = np.zeros((512, 6144), kvref.element_type("bf16").numpy)
    x[9, 130] = 1.5  # bf16 0x3FC0, little-endian
    a = dev.put(x)
    assert str(a.shape) == "bf16[512,6144]{1,0:T(8,128)(2,1)}"
    a.await_buffer(timeout=10)
    physical = a.physical_bytes()
    np.testing.assert_array_equal(np.flatnonzero(physical), [100_362, 100_363])
    assert physical[100_362] == 0xC0 and physical[100_363] == 0x3F


def test_put_and_write_place_bytes_as_the_model_does():
    """Random contents put, then overwritten in place, on the transposed
    layout tpu7x picks for bf16[512,3,2048]: the physical bytes each time are
    the NumPy model's packing."""
    dev = kvref.SimDevice("tpu7x")
    shape = kvref.Shape.parse("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}")
    x = random_host(shape.key, 1)
    a = dev.put(x)
    assert a.shape == shape
    a.await_buffer(timeout=10)
    np.testing.assert_array_equal(a.physical_bytes(), numpy_model.pack(x, shape))
    y = random_host(shape.key, 2)
    a.write_(y)
    a.await_buffer(timeout=10)
    np.testing.assert_array_equal(a.physical_bytes(), numpy_model.pack(y, shape))


def test_explicit_shape_overrides_and_must_match():
    dev = kvref.SimDevice("v5e")
    shape = kvref.Shape.parse("f32[4,8]{0,1}")
    a = dev.ones((4, 8), "f32", shape=shape)
    assert a.shape == shape and dev.fetch(a).sum() == 32
    with pytest.raises(ValueError, match=r"does not match f32\[4,9\]"):
        dev.ones((4, 9), "f32", shape=shape)


def test_dtype_spellings():
    import ml_dtypes

    dev = kvref.SimDevice("tpu7x")
    for dtype in ("bf16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)):
        assert dev.zeros((512, 6144), dtype).dtype == "bf16"
    torch = pytest.importorskip("torch")
    assert dev.zeros((512, 6144), torch.bfloat16).dtype == "bf16"
    t = torch.arange(512 * 6144, dtype=torch.float32).reshape(512, 6144).to(torch.bfloat16)
    np.testing.assert_array_equal(dev.fetch(dev.put(t)).astype(np.float32), t.float().numpy())


def test_deferred_lifecycle():
    dev = kvref.SimDevice("tpu7x")
    with dev.defer_and_fuse():
        a = dev.full((512, 6144), 3, "bf16")
        assert a.state == BufferState.DEFERRED
    with pytest.raises(TimeoutError, match="DEFERRED"):
        a.await_buffer(timeout=0.2)  # awaiting never launches
    assert a.state == BufferState.DEFERRED
    a.materialize()
    a.await_buffer(timeout=10)
    assert a.state == BufferState.MATERIALIZED and dev.fetch(a)[7, 9] == 3


def test_sync_runs_everything_pending():
    dev = kvref.SimDevice("tpu7x")
    with dev.defer_and_fuse():
        arrays = [dev.ones((512, 6144), "bf16") for _ in range(3)]
    dev.sync()
    assert all(a.state == BufferState.MATERIALIZED for a in arrays)


def test_in_place_op_is_deferred_too():
    dev = kvref.SimDevice("tpu7x")
    a = dev.ones((512, 6144), "bf16")
    a.await_buffer()
    with dev.defer_and_fuse():
        a.fill_(5)
    assert a.state == BufferState.DEFERRED
    assert dev.fetch(a)[0, 0] == 5


def test_put_is_materializing_until_the_copy_lands():
    dev = kvref.SimDevice("tpu7x")
    a = dev.put(np.ones((512, 6144), kvref.element_type("bf16").numpy), land_after_us=300_000)
    assert a.state == BufferState.MATERIALIZING
    a.await_buffer(timeout=10)
    assert a.state == BufferState.MATERIALIZED


BOUND_US = 60_000_000  # far beyond any wait below: an op that ends did so because it was needed


@pytest.mark.parametrize("ask", ["await", "fetch", "sync", "copy"])
def test_an_op_until_needed_runs_until_its_device_is_asked(ask):
    """An op launched until_needed is in flight whenever its caller looks,
    and ends as soon as anything needs a result of its device."""
    dev = kvref.SimDevice("v5e")
    other = dev.put(np.zeros((64, 128), np.float32))
    other.await_buffer(timeout=10)
    a = dev.put(np.ones((64, 128), np.float32), land_after_us=BOUND_US, until_needed=True)
    assert a.state == BufferState.MATERIALIZING
    a.fill_(5)  # queued behind the landing put
    b = dev.zeros((64, 128), "f32").write_(np.full((64, 128), 6, np.float32), run_us=BOUND_US, until_needed=True)
    assert a.state == b.state == BufferState.EXECUTING
    if ask == "await":
        a.await_buffer(timeout=30)
    elif ask == "fetch":
        dev.fetch(other)  # a result of the same device, not of the ops in flight
    elif ask == "sync":
        dev.sync()
    else:
        m = kvref.KVCacheManager([other], 4)
        m.d2h([0], [0]).result(timeout=30)
    assert _materialized_without_asking([a, b])
    assert dev.fetch(a)[0, 0] == 5 and dev.fetch(b)[0, 0] == 6


def _materialized_without_asking(arrays, seconds: float = 30.0) -> bool:
    """Polls their state (which asks the device nothing) for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(a.state == BufferState.MATERIALIZED for a in arrays):
            return True
        time.sleep(0.01)
    return False


def test_an_op_until_needed_still_ends_at_its_bound():
    dev = kvref.SimDevice("v5e")
    a = dev.put(np.ones((8, 128), np.float32), land_after_us=1, until_needed=True)
    assert _materialized_without_asking([a])  # nothing asks; the bound (1 us) ends it


def test_failed_put_fails_the_buffer():
    dev = kvref.SimDevice("tpu7x")
    dev.set_dma_faults(fail_every=1)
    a = dev.put(np.ones((8, 128), np.float32), shape=kvref.Shape.parse("f32[8,128]{1,0}"))
    with pytest.raises(kvref.DeviceError, match="injected DMA failure"):
        a.await_buffer(timeout=10)
    assert a.state == BufferState.FAILED


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown TPU generation 'V2'"):
        kvref.SimDevice("V2")
    dev = kvref.SimDevice("tpu7x")
    with pytest.raises(ValueError, match="must not be negative"):
        dev.set_dma_faults(delay_us=-1)
    a = dev.zeros((512, 6144), "bf16")
    with pytest.raises(ValueError, match="within the buffer"):
        a.fail_dma_in(0, a.nbytes + 1)
    with pytest.raises(ValueError, match="is not an array of"):
        kvref.SimDevice("tpu7x").fetch(a)


def test_await_covers_every_op_in_flight():
    dev = kvref.SimDevice("tpu7x")
    a = dev.put(np.ones((512, 6144), kvref.element_type("bf16").numpy), land_after_us=200_000)
    a.fill_(7)  # queued behind the slow put
    a.await_buffer(timeout=10)
    assert a.state == BufferState.MATERIALIZED and dev.fetch(a)[3, 4] == 7


def test_op_recorded_while_another_runs_stays_deferred():
    dev = kvref.SimDevice("tpu7x")
    a = dev.put(np.ones((512, 6144), kvref.element_type("bf16").numpy), land_after_us=200_000)
    with dev.defer_and_fuse():
        a.fill_(9)
    with pytest.raises(TimeoutError, match="DEFERRED"):
        a.await_buffer(timeout=0.5)  # the put landed; the recorded op has not run
    assert dev.fetch(a)[0, 0] == 9


@pytest.mark.parametrize("dtype, dims", [("bf16", (512, 1, 576)), ("s8", (5, 7, 9)), ("f32", (64, 3, 128))])
def test_filling_with_zeros_leaves_the_bytes_writing_zeros_leaves(dtype, dims):
    """fill_ with a value whose bytes are all zero writes the buffer's bytes
    directly: the same physical bytes, padding included, as packing zeros,
    and recorded like any op under defer_and_fuse."""
    dev = kvref.SimDevice("v5e")
    numpy_type = kvref.element_type(dtype).numpy
    filled, written = (dev.put(random_host(kvref.ShapeKey(dtype, dims), seed)) for seed in (1, 2))
    with dev.defer_and_fuse():
        filled.fill_(0)
    assert filled.state == BufferState.DEFERRED
    written.write_(np.zeros(dims, numpy_type))
    dev.sync()
    assert np.asarray(filled.physical_bytes()).tobytes() == np.asarray(written.physical_bytes()).tobytes()
    assert not dev.fetch(filled).view(np.uint8).any()


def test_a_held_copy_is_let_go_when_its_hold_is_released():
    """A window a test opens and closes itself: the copy held (far longer
    than the waits below) ends once released, whether it was waiting in the
    hold or came after the release."""
    dev = kvref.SimDevice("v5e")
    cache = dev.put(np.ones((64, 8, 128), np.float32))
    cache.await_buffer()
    m = kvref.KVCacheManager([cache], 4)
    cache.hold_next_dma(BOUND_US)
    held = m.d2h([0], [0])
    assert not held.done()
    cache.release_dma_hold()
    held.result(timeout=30)
    cache.hold_next_dma(BOUND_US)
    cache.release_dma_hold()
    m.d2h([1], [1]).result(timeout=30)


def test_a_step_that_writes_some_rows_writes_them_alone_in_place():
    """donate_rows: a serving step that updates some blocks of a cache,
    donated and written in place; every other byte stays, copies issued
    before it end first, and rows that are not byte ranges are refused."""
    device = kvref.SimDevice("v5e")
    host = np.arange(16 * 8 * 128, dtype=np.float32).reshape(16, 8, 128)
    cache = device.put(host)
    out = cache.donate_rows([2, 9], np.full((2, 8, 128), -1, np.float32), run_us=1000)
    want = host.copy()
    want[[2, 9]] = -1
    assert cache.is_deleted() and out.holds_storage_of(cache) and np.array_equal(device.fetch(out), want)
    for rows, values, why in (([16], np.zeros((1, 8, 128)), "below 16"), ([3, 3], np.zeros((2, 8, 128)), "once"),
                              ([3], np.zeros((2, 8, 128)), "expected")):
        with pytest.raises(ValueError, match=why):
            out.donate_rows(rows, values)
    interleaved = device.put(np.zeros((512, 1024), np.float32))  # v5e tiles rows 8 at a time
    with pytest.raises(kvref.LayoutError, match="not contiguous byte ranges"):
        interleaved.donate_rows([0], np.zeros((1, 1024), np.float32))
