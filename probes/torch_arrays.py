"""Byte-exact conversion between the probes' logical NumPy arrays and torch
tensors. torch cannot take ml_dtypes arrays (bf16, fp8) directly, so the bytes
cross as uint8 and are reinterpreted on each side: every bit pattern, NaN
payloads included, arrives unchanged."""

from __future__ import annotations

import numpy as np

import kvref


def torch_dtype(dtype: str):
    """The torch dtype for an XLA element type name; ValueError if torch has
    none that stores it one element per item."""
    import torch

    element = kvref.element_type(dtype)
    if element.is_sub_byte or element.torch_name is None or not hasattr(torch, element.torch_name):
        raise ValueError(f"{dtype} has no torch dtype that holds one element per item; expected "
                         "one of " + ", ".join(n for n, t in kvref.ELEMENT_TYPES.items()
                                               if not t.is_sub_byte and t.torch_name))
    return getattr(torch, element.torch_name)


def to_torch(host: np.ndarray):
    """A CPU tensor with the same shape, element type and bytes as `host`."""
    import torch

    dtype = torch_dtype(kvref.element_type(host.dtype).name)
    host = np.ascontiguousarray(host)
    raw = torch.from_numpy(host.reshape(-1).view(np.uint8).copy())
    return raw.view(dtype).reshape(host.shape)


def from_torch(tensor) -> np.ndarray:
    """The logical NumPy array of a tensor on any device, bytes unchanged."""
    import torch

    element = kvref.element_type(tensor.dtype)
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return raw.view(element.numpy).reshape(tuple(tensor.shape))
