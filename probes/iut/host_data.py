"""Random logical contents for KV caches, the one generator the probes and the
tests share."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import numpy.random  # noqa: F401  NumPy loads it on first use: a zygote's workers find it loaded

import kvref


def random_host(key: kvref.ShapeKey, seed: int, finite: bool = False) -> np.ndarray:
    """Random contents of `key`'s logical array. Every bit pattern of the dtype
    (NaN payloads included) by default; with `finite`, small integers in the
    dtype, which survive any float conversion. Only values the type can hold:
    pred is 0 or 1, sub-byte types stay within their range."""
    element = kvref.element_type(key.dtype)
    # SFC64 draws 64-bit words about twice as fast as the default PCG64: the
    # contents need only differ from block to block, and every case draws them.
    rng = np.random.Generator(np.random.SFC64(seed))
    if element.name == "pred":
        return rng.integers(0, 2, key.dims).astype(np.bool_)
    if element.is_sub_byte:
        info = ml_dtypes.iinfo(element.numpy)
        return rng.integers(int(info.min), int(info.max) + 1, key.dims).astype(element.numpy)
    if finite:
        return _small_integers(rng, element.numpy, key.dims)
    count = int(np.prod(key.dims)) * element.numpy.itemsize
    return _random_bytes(rng, count).view(element.numpy).reshape(key.dims)


def _random_bytes(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` random bytes, drawn as 64-bit words (several times faster than rng.bytes)."""
    return rng.integers(0, 2**64 - 1, -(-count // 8), dtype=np.uint64, endpoint=True).view(np.uint8)[:count]


def _small_integers(rng: np.random.Generator, dtype: np.dtype, dims: tuple[int, ...]) -> np.ndarray:
    """-8..7 in `dtype`, uniformly: each random byte picks two elements at
    once from a table of every pair (no conversion per element)."""
    values = np.arange(-8, 8).astype(dtype)
    pairs = np.ascontiguousarray(values[np.array(np.divmod(np.arange(256), 16)).T])  # byte b: values b//16, b%16
    count = int(np.prod(dims))
    picks = _random_bytes(rng, -(-count // 2))
    return pairs.view(f"V{2 * values.itemsize}").ravel()[picks].view(dtype)[:count].reshape(dims)
