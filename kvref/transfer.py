"""Raw transfers of dim-0 blocks between one device array and one host array,
with the same unpack and checks as the manager."""

from __future__ import annotations

import numpy as np

from kvref import _core
from kvref.addressing import layer_slice_bytes, plan_host
from kvref.buffers import unpack_buffer
from kvref.faults import Faults
from kvref.futures import TransferFuture
from kvref.offsets import transfer_lists


def transfer_d2h_async(device_array, host_array, src_offsets, dst_offsets, copy_sizes=None,
                       *, faults=()) -> TransferFuture:
    """Device blocks -> rows of `host_array` (a writable, C-contiguous array
    whose bytes are whole blocks)."""
    return _transfer(_core.Direction.DEVICE_TO_HOST, device_array, host_array, src_offsets, dst_offsets, copy_sizes, faults)


def transfer_h2d_async(device_array, host_array, src_offsets, dst_offsets, copy_sizes=None,
                       *, faults=()) -> TransferFuture:
    """Blocks of `host_array` -> device blocks."""
    return _transfer(_core.Direction.HOST_TO_DEVICE, device_array, host_array, src_offsets, dst_offsets, copy_sizes, faults)


def transfer_d2h(*args, **kwargs) -> None:
    transfer_d2h_async(*args, **kwargs).result()


def transfer_h2d(*args, **kwargs) -> None:
    transfer_h2d_async(*args, **kwargs).result()


def _transfer(direction, device_array, host_array, src, dst, sizes, faults) -> TransferFuture:
    faults = Faults.parse(faults)
    src, dst, sizes = transfer_lists(src, dst, sizes)
    if not isinstance(host_array, np.ndarray):
        raise TypeError(f"host_array must be a NumPy array, got {type(host_array).__name__}")
    if host_array.dtype.hasobject:  # its memory holds pointers, which blocks would overwrite
        raise TypeError(f"host_array must hold plain data, got an array of {host_array.dtype}")
    if not host_array.flags.c_contiguous or not host_array.flags.writeable:
        raise ValueError("host_array must be C-contiguous and writable")
    view = unpack_buffer(device_array, faults)
    block = layer_slice_bytes(view, 0, faults)
    if block == 0 or host_array.nbytes % block or not host_array.nbytes:
        raise ValueError(f"host_array has {host_array.nbytes} bytes, not a whole number of "
                         f"{block}-byte blocks of {view.shape}")
    host_blocks = host_array.nbytes // block
    plan = plan_host([[view]], host_blocks, "uniform", faults)
    # The mover holds the host array, and its tasks hold the mover: whatever
    # the caller drops, the memory stays until the last copy is done.
    mover = _core.BlockMover(plan.layers, host_blocks, plan.allocate_bytes,
                             host_array.reshape(-1).view(np.uint8))
    return TransferFuture(mover.copy(direction, src, dst, sizes))
