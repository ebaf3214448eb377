"""kvref: an exact model of XLA TPU tiled layouts and KV-cache block offload."""

import atexit

from kvref import _core
from kvref.dtypes import ELEMENT_TYPES, element_type
from kvref.errors import (HostBudgetError, HostPoolExhausted, LayoutError, NotAFlag, NotAnInteger, PeerTransferFailed,
                          PoolTooLarge)
from kvref.faults import FAULTS, Faults
from kvref.futures import TransferFuture
from kvref.generations import GENERATIONS
from kvref.kv_store import KVCacheStore, RaidenId
from kvref.limits import AllocationError
from kvref.manager import ChunkState, KVCacheManager
from kvref.settings import ManagerSettings
from kvref.oracle import LayoutAnswer, OracleUnavailable, tpu_layout
from kvref.placement import element_byte_offsets, element_physical_indices, pack, unpack
from kvref.plans import Plan, StartTransferRequest
from kvref.shape import Layout, Shape
from kvref.shape_key import ShapeKey
from kvref.sharding import Sharding
from kvref.sim import BufferState, DeviceArray, DeviceError, SimDevice
from kvref.slices import (
    MajorSlice,
    legacy_major_slice_byte_size,
    major_slice,
    validate_major_slice_addressable,
)
from kvref.torch_interop import from_torch, to_torch, torch_dtype
from kvref.transfer import transfer_d2h, transfer_d2h_async, transfer_h2d, transfer_h2d_async

# A daemon thread inside a kvref call at exit would abort the process as it took the GIL back
# (csrc/released_gil.h): from the atexit hooks on, such a thread is parked instead.
atexit.register(_core.park_other_threads_at_exit, 5.0)

__all__ = [
    "AllocationError", "ChunkState", "ELEMENT_TYPES", "FAULTS", "Faults", "GENERATIONS", "BufferState", "DeviceArray", "DeviceError",
    "HostBudgetError", "HostPoolExhausted", "KVCacheManager", "KVCacheStore", "ManagerSettings", "Layout", "LayoutAnswer", "LayoutError", "MajorSlice",
    "NotAFlag", "NotAnInteger", "OracleUnavailable", "PeerTransferFailed", "Plan", "PoolTooLarge", "RaidenId", "Shape", "ShapeKey", "Sharding", "SimDevice", "StartTransferRequest", "TransferFuture",
    "element_byte_offsets", "from_torch", "to_torch", "torch_dtype", "element_physical_indices", "element_type", "legacy_major_slice_byte_size", "major_slice", "pack",
    "tpu_layout", "transfer_d2h", "transfer_d2h_async", "transfer_h2d", "transfer_h2d_async",
    "unpack", "validate_major_slice_addressable",
]
