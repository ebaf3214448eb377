"""Where each element of a laid-out array lives: byte offsets, pack, unpack."""

from __future__ import annotations

import numpy as np

from kvref.dtypes import element_type
from kvref.limits import check_allocation
from kvref.shape import Shape
from kvref.torch_interop import from_torch, is_torch_tensor


def element_physical_indices(shape: Shape) -> np.ndarray:
    """Physical element index of every logical element (int64, logical shape)."""
    check_allocation(3 * 8 * shape.logical_elements, f"element offsets of {shape}")
    return shape._tiled.element_indices().reshape(shape.dims)


def element_bit_offsets(shape: Shape) -> np.ndarray:
    """Bit offset of every logical element in the physical buffer."""
    return element_physical_indices(shape) * shape.element_bits


def element_byte_offsets(shape: Shape) -> np.ndarray:
    """Byte offset of every logical element (int64, logical shape). Sub-byte
    elements sharing a byte share its offset."""
    return element_bit_offsets(shape) // 8


def pack(array, shape: Shape, out: np.ndarray | None = None) -> np.ndarray:
    """Logical array -> its physical bytes (uint8, `physical_size_bytes` long),
    padding zero. Accepts NumPy arrays and torch tensors; `out`, if given, is a
    uint8 array of that size to write into."""
    logical = _as_logical(array, shape)
    if out is None:
        check_allocation(shape.physical_size_bytes, f"packing {shape}")
    physical = _output(out, (shape.physical_size_bytes,), np.dtype(np.uint8), shape)
    shape._tiled.pack(logical.reshape(-1).view(np.uint8), physical, shape.element.numpy.itemsize)
    return physical


def unpack(buffer, shape: Shape, out: np.ndarray | None = None) -> np.ndarray:
    """Physical bytes (bytes-like, a uint8 NumPy array or torch tensor) -> the
    logical NumPy array; `out`, if given, is a C-contiguous array of the
    logical shape and dtype to write into."""
    physical = _as_bytes(buffer, shape)
    if out is None:
        logical = new_logical(shape, "unpacking")
    else:
        logical = _output(out, shape.dims, shape.element.numpy, shape)
    shape._tiled.unpack(physical, logical.reshape(-1).view(np.uint8), shape.element.numpy.itemsize)
    return logical


def new_logical(shape: Shape, doing: str) -> np.ndarray:
    """An uninitialized array of `shape`'s logical form, once the memory for it may be had."""
    check_allocation(shape.logical_elements * shape.element.numpy.itemsize, f"{doing} {shape}")
    return np.empty(shape.dims, dtype=shape.element.numpy)


def _output(out, dims, dtype: np.dtype, shape: Shape) -> np.ndarray:
    if out is None:
        return np.empty(dims, dtype=dtype)
    if not isinstance(out, np.ndarray) or out.dtype != dtype or tuple(out.shape) != tuple(dims) \
            or not out.flags.c_contiguous or not out.flags.writeable:
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"out must be a writable C-contiguous {dtype}{list(dims)} array for "
                         f"{shape}, got {got}")
    return out


def _as_logical(array, shape: Shape) -> np.ndarray:
    if is_torch_tensor(array):
        array = from_torch(array)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"pack expects a NumPy array or torch tensor, got {type(array).__name__}")
    try:
        got = element_type(array.dtype).name
    except ValueError:
        got = str(array.dtype)
    if got != shape.dtype or tuple(array.shape) != shape.dims:
        raise ValueError(f"array {got}{list(array.shape)} does not match the layout "
                         f"{shape}; expected {shape.key}")
    return np.ascontiguousarray(array)


def _as_bytes(buffer, shape: Shape) -> np.ndarray:
    if is_torch_tensor(buffer):
        buffer = from_torch(buffer)
    if isinstance(buffer, (bytes, bytearray, memoryview)):
        buffer = np.frombuffer(buffer, dtype=np.uint8)
    if not isinstance(buffer, np.ndarray):
        raise TypeError(f"unpack expects bytes or a uint8 NumPy array, got {type(buffer).__name__}")
    if buffer.dtype != np.uint8 or buffer.ndim != 1:
        raise ValueError(f"unpack expects a 1-D uint8 buffer, got {buffer.dtype}{list(buffer.shape)}")
    if buffer.size != shape.physical_size_bytes:
        raise ValueError(f"buffer has {buffer.size} bytes but {shape} takes "
                         f"{shape.physical_size_bytes}")
    return np.ascontiguousarray(buffer)
