"""Byte-exact conversion between NumPy arrays and torch tensors, the one place
kvref and the probes cross into torch. torch cannot take ml_dtypes arrays (bf16,
fp8) directly, so the bytes cross as uint8 and are reinterpreted on each side:
every bit pattern, NaN payloads included, arrives unchanged. torch is imported
only when a tensor is actually converted."""

from __future__ import annotations

import numpy as np

from kvref.dtypes import ELEMENT_TYPES, element_type


def is_torch_tensor(obj) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "detach")


def torch_dtype(dtype):
    """The torch dtype for an element type, or ValueError where torch has none
    that stores one element per item (sub-byte types)."""
    import torch

    element = element_type(dtype)
    if element.is_sub_byte or element.torch_name is None or not hasattr(torch, element.torch_name):
        raise ValueError(f"{element.name} has no torch dtype that holds one element per item; "
                         "expected one of " + ", ".join(
                             n for n, t in ELEMENT_TYPES.items() if not t.is_sub_byte and t.torch_name))
    return getattr(torch, element.torch_name)


def to_torch(array: np.ndarray):
    """A CPU tensor with the same shape, element type and bytes as `array`."""
    import torch

    dtype = torch_dtype(array.dtype)
    array = np.ascontiguousarray(array)
    raw = torch.from_numpy(array.reshape(-1).view(np.uint8).copy())
    return raw.view(dtype).reshape(array.shape)


def from_torch(tensor) -> np.ndarray:
    """The NumPy array of a tensor on any device, bytes unchanged."""
    import torch

    element = element_type(tensor.dtype)
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return raw.view(element.numpy).reshape(tuple(tensor.shape))


def as_numpy(array) -> np.ndarray:
    """A NumPy array from a NumPy array, torch tensor or array-like."""
    return from_torch(array) if is_torch_tensor(array) else np.asarray(array)
