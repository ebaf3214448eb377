"""kvref: an exact model of XLA TPU tiled layouts and KV-cache block offload."""

from kvref.dtypes import ELEMENT_TYPES, element_type
from kvref.errors import LayoutError
from kvref.generations import GENERATIONS
from kvref.oracle import LayoutAnswer, OracleUnavailable, tpu_layout
from kvref.placement import element_byte_offsets, pack, unpack
from kvref.shape import Layout, Shape
from kvref.slices import (
    MajorSlice,
    legacy_major_slice_byte_size,
    major_slice,
    validate_major_slice_addressable,
)

__all__ = [
    "ELEMENT_TYPES", "GENERATIONS", "Layout", "LayoutAnswer", "LayoutError", "MajorSlice",
    "OracleUnavailable", "Shape", "element_byte_offsets", "element_type",
    "legacy_major_slice_byte_size", "major_slice", "pack", "tpu_layout", "unpack",
    "validate_major_slice_addressable",
]
