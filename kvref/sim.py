"""A simulated TPU device: arrays laid out as the generation's compiler lays
them out, bytes in physical order, and TorchTPU's deferred-buffer lifecycle."""

from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

from kvref import _core
from kvref.dtypes import element_type
from kvref.generations import DEFAULT_GENERATION, check_generation
from kvref.limits import check_allocation
from kvref.oracle import tpu_layout
from kvref.placement import new_logical, pack
from kvref.shape import Shape
from kvref.shape_key import ShapeKey
from kvref.slices import validate_major_slice_addressable
from kvref.torch_interop import as_numpy
from kvref.values import flag, integer

BufferState = _core.BufferState
DeviceError = _core.DeviceError


class DeviceArray:
    """An array on a SimDevice. `.shape` is its kvref.Shape (with layout).

    Donation is modelled as PJRT does it: a step that takes an array donated
    deletes it at once, and its output either aliases the donated storage
    (the same buffer: XLA writes the result in place) or lives in fresh
    storage while the donated one is given up."""

    def __init__(self, device: "SimDevice", shape: Shape, buffer):
        self.device = device
        self.shape = shape
        self._buffer = buffer
        self._deleted = False
        device._live.add(self)

    def is_deleted(self) -> bool:
        """Whether the array was deleted (donated to a step, or by delete())."""
        return self._deleted

    def delete(self) -> None:
        """Give the array up; its storage is no longer any array's."""
        self._deleted = True

    def donate(self, new, *, aliased: bool = True, run_us: int = 0, until_needed: bool = False) -> "DeviceArray":
        """A step that takes this array donated and outputs `new` (computing
        for `run_us` first, launched now; `until_needed`: see write_): the
        output, a new array. `aliased`: it writes into this array's storage,
        after every copy issued on it before; otherwise into fresh storage.
        This array is deleted either way."""
        self._check_live()
        logical = self.device._logical(new, self.shape)
        run_us, until_needed = integer(run_us, "run_us", 0), flag(until_needed, "until_needed")
        if flag(aliased, "aliased"):
            buffer = self._buffer
        else:
            check_allocation(self.shape.physical_size_bytes, f"a {self.shape} device buffer")
            buffer = _core.DeviceBuffer.create(self.device._core, self.shape._tiled, np.zeros_like(logical),
                                               self.shape.element.numpy.itemsize, _core.Arrival.COMPUTED)
        buffer.overwrite(self.shape._tiled, logical, self.shape.element.numpy.itemsize, False, run_us, until_needed)
        output = DeviceArray(self.device, self.shape, buffer)
        self._deleted = True  # after the output is live: whoever sees this deleted finds the output
        return output

    def donate_rows(self, rows, values, *, run_us: int = 0, until_needed: bool = False) -> "DeviceArray":
        """A step that takes this array donated and writes `values` into its
        dim-0 `rows` alone, in place (the output aliases this storage), after
        every copy issued on it before: a serving step that updates some
        blocks of a cache. `run_us`, `until_needed`: as for donate. The rows
        must be contiguous byte ranges in this layout. This array is deleted."""
        self._check_live()
        row_bytes = validate_major_slice_addressable(self.shape)
        rows = [integer(r, "row", 0) for r in rows]
        if len(set(rows)) != len(rows) or any(r >= self.dims[0] for r in rows):
            raise ValueError(f"rows {rows}: each must be below {self.dims[0]} and named once")
        values = np.asarray(values)
        if values.shape != (len(rows), *self.dims[1:]):
            raise ValueError(f"values of shape {values.shape} for rows {rows}; expected "
                             f"{(len(rows), *self.dims[1:])}")
        run_us, until_needed = integer(run_us, "run_us", 0), flag(until_needed, "until_needed")
        logical = np.zeros(self.dims, self.shape.element.numpy)
        logical[rows] = values
        physical = pack(logical, self.shape)  # rows are byte ranges: each row's bytes are its own
        data = np.concatenate([physical[r * row_bytes:(r + 1) * row_bytes] for r in rows]) if rows else physical[:0]
        self._buffer.overwrite_rows(row_bytes, rows, data, run_us, until_needed)
        output = DeviceArray(self.device, self.shape, self._buffer)
        self._deleted = True  # after the output is live, as for donate
        return output

    def holds_storage_of(self, other: "DeviceArray") -> bool:
        """Whether this array's storage is `other`'s (an aliased donation's output)."""
        return self._buffer is other._buffer

    def _check_live(self) -> None:
        if self._deleted:
            raise ValueError(f"{self!r} was deleted (donated to a step?); use the step's output")

    @property
    def state(self) -> BufferState:
        return self._buffer.state

    @property
    def dtype(self) -> str:
        return self.shape.dtype

    @property
    def dims(self) -> tuple[int, ...]:
        return self.shape.dims

    @property
    def nbytes(self) -> int:
        """Physical bytes, padding included."""
        return self.shape.physical_size_bytes

    def materialize(self) -> None:
        """Launch the pending graph that produces this array, in place."""
        self._buffer.materialize()

    def await_buffer(self, timeout: float | None = None) -> None:
        """Wait until materialized; never launches anything. Raises
        TimeoutError when a timeout is given and passes."""
        if not self._buffer.await_(-1.0 if timeout is None else float(timeout)):
            raise TimeoutError(f"{self!r} was not materialized within {timeout}s "
                               f"(state {self.state.name})")

    def write_(self, array, *, run_us: int = 0, until_needed: bool = False) -> "DeviceArray":
        """In-place op: overwrite the contents (recorded under defer_and_fuse).
        The op computes for `run_us` before it writes, and starts only after
        every copy issued on this array before it has ended. `until_needed`:
        it computes only until this device is asked for a result after the
        op was made (a copy, an await, a sync) or while something waits on
        it, at most `run_us`: still running whenever its caller looks, and
        done as soon as anything needs it, whatever the machine's load."""
        self._check_live()
        logical = self.device._logical(array, self.shape)
        run_us, until_needed = integer(run_us, "run_us", 0), flag(until_needed, "until_needed")
        self._buffer.overwrite(self.shape._tiled, logical, self.shape.element.numpy.itemsize,
                               self.device.deferring, run_us, until_needed)
        return self

    def fill_(self, value) -> "DeviceArray":
        if not np.full((), value, dtype=self.shape.element.numpy).tobytes().strip(b"\0"):
            # Every byte zero, as pack leaves padding: the buffer's bytes are written directly.
            self._check_live()
            self._buffer.zero(self.device.deferring)
            return self
        return self.write_(np.full(self.dims, value, dtype=self.shape.element.numpy))

    def fail_dma_in(self, start: int, end: int) -> None:
        """Any later DMA touching bytes [start, end) of this array fails."""
        self._buffer.fail_dma_in(start, end)

    def hold_next_dma(self, delay_us: int, until_next_op: bool = False) -> None:
        """The next DMA of this array first waits `delay_us`: a slow link that
        holds one copy in flight, so what is issued after it overlaps it.
        `until_next_op`: it waits only until an op launched after this call
        has taken its place in program order (waiting for the copies before
        it, or run past them), at most `delay_us`: a window opened by events,
        whatever the machine's load."""
        self._buffer.hold_next_dma(integer(delay_us, "delay_us", 0), flag(until_next_op, "until_next_op"))

    def release_dma_hold(self) -> None:
        """End the hold of hold_next_dma now, whether its copy waits in it or
        is yet to come: a window its caller closes once it has looked."""
        self._buffer.release_dma_hold()

    def physical_bytes(self) -> np.ndarray:
        """A copy of the physical bytes (materialized arrays only)."""
        out = np.empty(self.nbytes, np.uint8)
        self._buffer.read_physical(out)
        return out

    def __repr__(self) -> str:
        state = "DELETED" if self._deleted else self.state.name
        return f"DeviceArray({self.shape}, {self.device.generation}:{self.device.id}, {state})"


class SimDevice:
    """One simulated TPU chip of `generation`. Buffers take that generation's
    compiler layout unless a `shape=` with an explicit layout is given."""

    def __init__(self, generation: str = DEFAULT_GENERATION, id: int = 0):
        self.generation = check_generation(generation)
        self.id = int(id)
        self._core = _core.SimDevice(self.id)
        self._local = threading.local()
        self._live: weakref.WeakSet[DeviceArray] = weakref.WeakSet()

    def live_arrays(self) -> list[DeviceArray]:
        """This device's arrays that are not deleted (as jax.live_arrays)."""
        return [a for a in list(self._live) if not a._deleted]

    @property
    def deferring(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def defer_and_fuse(self):
        """Inside, ops are recorded (DEFERRED), not run, until materialized."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield self
        finally:
            self._local.depth -= 1

    def zeros(self, dims, dtype="bf16", *, shape: Shape | None = None) -> DeviceArray:
        return self.full(dims, 0, dtype, shape=shape)

    def ones(self, dims, dtype="bf16", *, shape: Shape | None = None) -> DeviceArray:
        return self.full(dims, 1, dtype, shape=shape)

    def full(self, dims, value, dtype="bf16", *, shape: Shape | None = None) -> DeviceArray:
        layout = self._layout(dtype, dims, shape)
        check_allocation(layout.logical_elements * layout.element.numpy.itemsize
                         + layout.physical_size_bytes, f"a {layout} device array")
        return self._create(np.full(layout.dims, value, dtype=layout.element.numpy), layout, self._mode())

    def arange(self, dims, dtype="bf16", *, shape: Shape | None = None) -> DeviceArray:
        """Element i (row-major) holds i, wrapped to the dtype's range."""
        layout = self._layout(dtype, dims, shape)
        check_allocation(9 * layout.logical_elements + layout.physical_size_bytes,
                         f"a {layout} device array")
        n = layout.logical_elements
        values = np.arange(n, dtype=np.int64)
        if layout.element.numpy.kind == "b":
            values = values % 2
        return self._create(values.astype(layout.element.numpy).reshape(layout.dims), layout, self._mode())

    def put(self, host_array, *, shape: Shape | None = None, land_after_us: int = 0,
            until_needed: bool = False) -> DeviceArray:
        """Host -> device (`cpu_tensor.to(device)`): MATERIALIZING until the copy
        lands, `land_after_us` after the DMA engine takes it (`until_needed`:
        at most that, landing as soon as this device is asked for a result,
        as DeviceArray.write_ says)."""
        array = as_numpy(host_array)
        layout = self._layout(array.dtype, array.shape, shape)
        land_after_us = integer(land_after_us, "land_after_us", 0)
        return self._create(array, layout, _core.Arrival.PUT, land_after_us, flag(until_needed, "until_needed"))

    def fetch(self, array: DeviceArray) -> np.ndarray:
        """Device -> host: the logical array (materializes and waits first)."""
        self._check_own(array)
        array._check_live()
        array.materialize()
        array.await_buffer()
        shape = array.shape
        out = new_logical(shape, "fetching")
        array._buffer.read_logical(shape._tiled, out.reshape(-1).view(np.uint8), shape.element.numpy.itemsize)
        return out

    def sync(self) -> None:
        """Run everything pending on this device."""
        self._core.sync()

    def set_dma_faults(self, delay_us: int = 0, fail_every: int = 0) -> None:
        """Every DMA waits `delay_us`; every `fail_every`-th DMA fails (0: never)."""
        self._core.set_dma_faults(int(delay_us), int(fail_every))

    @property
    def dma_count(self) -> int:
        return self._core.dma_count

    def __repr__(self) -> str:
        return f"SimDevice({self.generation!r}, id={self.id})"

    def _mode(self) -> _core.Arrival:
        return _core.Arrival.DEFERRED if self.deferring else _core.Arrival.COMPUTED

    def _layout(self, dtype, dims, shape: Shape | None) -> Shape:
        name = element_type(dtype).name
        dims = tuple(int(d) for d in dims)
        if shape is None:
            return tpu_layout(name, dims, self.generation)
        if not isinstance(shape, Shape):
            raise TypeError(f"shape must be a kvref.Shape, got {type(shape).__name__}")
        if shape.dtype != name or shape.dims != dims:
            raise ValueError(f"shape {shape} does not match {ShapeKey(name, dims)}")
        return shape

    def _logical(self, array, shape: Shape) -> np.ndarray:
        array = as_numpy(array)
        if element_type(array.dtype).name != shape.dtype or tuple(array.shape) != shape.dims:
            raise ValueError(f"array {array.dtype}{list(array.shape)} does not match {shape}")
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8)

    def _create(self, array: np.ndarray, shape: Shape, mode: _core.Arrival, land_after_us: int = 0,
                until_needed: bool = False) -> DeviceArray:
        check_allocation(shape.physical_size_bytes, f"a {shape} device buffer")
        logical = self._logical(array, shape)
        buffer = _core.DeviceBuffer.create(self._core, shape._tiled, logical,
                                           shape.element.numpy.itemsize, mode, land_after_us,
                                           until_needed)
        return DeviceArray(self, shape, buffer)

    def _check_own(self, array) -> None:
        if not isinstance(array, DeviceArray) or array.device is not self:
            raise ValueError(f"{array!r} is not an array of {self!r}")

