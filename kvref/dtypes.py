"""XLA element types and their NumPy, ml_dtypes, torch and JAX counterparts."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class ElementType:
    name: str  # XLA's name: "bf16", "s4", ...
    numpy: np.dtype  # in memory, one element per numpy item
    bit_width: int  # the value's width; sub-byte types are < 8
    torch_name: str | None  # attribute of the torch module, if torch has one

    @property
    def storage_bits(self) -> int:
        """Bits an element takes when the layout does not pack it (no E(n))."""
        return self.numpy.itemsize * 8

    @property
    def is_sub_byte(self) -> bool:
        return self.bit_width < 8


def _t(name, dtype, bits, torch_name):
    return ElementType(name, np.dtype(dtype), bits, torch_name)


ELEMENT_TYPES: dict[str, ElementType] = {
    t.name: t
    for t in [
        _t("pred", np.bool_, 8, "bool"),
        _t("s4", ml_dtypes.int4, 4, "int4"),
        _t("u4", ml_dtypes.uint4, 4, "uint4"),
        _t("s8", np.int8, 8, "int8"),
        _t("u8", np.uint8, 8, "uint8"),
        _t("s16", np.int16, 16, "int16"),
        _t("u16", np.uint16, 16, "uint16"),
        _t("s32", np.int32, 32, "int32"),
        _t("u32", np.uint32, 32, "uint32"),
        _t("s64", np.int64, 64, "int64"),
        _t("u64", np.uint64, 64, "uint64"),
        _t("f8e4m3fn", ml_dtypes.float8_e4m3fn, 8, "float8_e4m3fn"),
        _t("f8e5m2", ml_dtypes.float8_e5m2, 8, "float8_e5m2"),
        _t("f16", np.float16, 16, "float16"),
        _t("bf16", ml_dtypes.bfloat16, 16, "bfloat16"),
        _t("f32", np.float32, 32, "float32"),
        _t("f64", np.float64, 64, "float64"),
    ]
}

_BY_NUMPY = {t.numpy: t for t in ELEMENT_TYPES.values()}


def element_type(dtype) -> ElementType:
    """The XLA element type for an XLA name, a NumPy/ml_dtypes/JAX dtype, or a
    torch dtype. Raises ValueError naming the input otherwise."""
    if isinstance(dtype, ElementType):
        return dtype
    if isinstance(dtype, str) and dtype in ELEMENT_TYPES:
        return ELEMENT_TYPES[dtype]
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        name = str(dtype).removeprefix("torch.")
        for t in ELEMENT_TYPES.values():
            if t.torch_name == name:
                return t
        raise ValueError(f"torch dtype {dtype!r} has no XLA element type here; "
                         f"expected one of {_torch_names()}")
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype in _BY_NUMPY:
        return _BY_NUMPY[np_dtype]
    raise ValueError(f"unknown element type {dtype!r}; expected an XLA name "
                     f"({', '.join(ELEMENT_TYPES)}) or a matching NumPy, ml_dtypes, "
                     "JAX or torch dtype")


def _torch_names() -> str:
    return ", ".join(f"torch.{t.torch_name}" for t in ELEMENT_TYPES.values())

