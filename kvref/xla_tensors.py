"""PyTorch/XLA tensors on the XLA CPU device as KV caches.

A torch_xla tensor is lazy: after ops it holds a graph, not a buffer, until
something materializes it; after an unwaited `torch_xla.sync()` its buffer is
promised but not there yet; and an in-place op followed by a sync gives it a
new buffer (unless buffer donation reuses the old one). So kvref

- materializes a pending tensor (syncs it), then awaits device ops, before it
  touches a buffer; awaiting alone would wait forever on a graph nothing runs;
- holds the buffer it addresses through a DLPack alias, so that buffer stays
  alive whatever happens to the tensor (and a manager that keeps it too long
  moves stale bytes, not freed memory); DLPack has no f8 types in torch_xla,
  so f8 tensors are refused rather than addressed unheld;
- re-resolves before every transfer: a tensor whose buffer changed since is
  re-read, so a transfer always moves the tensor's live storage;
- refuses views (`permute`, slices): a view materializes into a copy of its
  own, so blocks written through it would never reach the tensor it views.

On the XLA CPU device buffers are dense and row-major (its default layout). torch_xla is imported
only when such a tensor is handed over."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvref.dtypes import element_type
from kvref.faults import Faults
from kvref.shape import Layout, Shape

POLL_SECONDS = 0.001


@dataclass(frozen=True)
class XlaDevice:
    """One XLA device, as one object: shards are told apart by device identity."""
    name: str  # "xla:0"
    real: str  # "CPU:0"


_DEVICES: dict[str, XlaDevice] = {}


def is_xla_tensor(obj) -> bool:
    # The module first: a jax.Array's `device` raises once a step on another thread has deleted it.
    return type(obj).__module__.startswith("torch") and getattr(getattr(obj, "device", None), "type", None) == "xla"


def resolve(tensor, faults: Faults = Faults()):
    """(storage address, a DLPack alias that keeps that storage alive, shape,
    device) of a tensor, materialized and awaited first."""
    import torch_xla
    from torch.utils.dlpack import from_dlpack
    from torch_xla.utils.dlpack import to_dlpack

    xla = torch_xla._XLAC
    device = _device(xla, tensor)
    if tensor._is_view():
        raise ValueError(f"a view (shape {tuple(tensor.shape)}) of another XLA tensor (permute, a "
                         "slice, ...): it materializes into a copy of its own, so blocks moved through it "
                         "would never reach the tensor it views; pass the base tensor, or a .clone()")
    shape = Shape(element_type(tensor.dtype).name, tuple(tensor.shape), Layout.default(tensor.dim()))
    if shape.dtype.startswith("f8"):
        raise ValueError(f"a {shape} XLA tensor: torch_xla's DLPack has no f8 types, so kvref cannot "
                         "hold its buffer alive while blocks move; expected a bf16, f16, f32 or "
                         "integer cache")
    if not faults.no_await_before_transfer:
        if faults.no_materialize_before_await:
            _await_without_materializing(xla, tensor)
        elif xla._check_tensor_need_materialization([tensor])[0]:
            xla._xla_sync_multi([tensor], devices=[], wait=True)
        xla._xla_wait_device_ops(devices=[])
    address = xla._unsafe_buffer_pointer(tensor)
    alias = from_dlpack(to_dlpack(tensor))  # never on a pending tensor: that aborts the process
    if alias.data_ptr() != address or not alias.is_contiguous():
        raise ValueError(f"a {shape} XLA tensor whose buffer is not dense row-major; expected the "
                         "XLA CPU device's default layout")
    return address, alias, shape, device


def _await_without_materializing(xla, tensor) -> None:
    # The old bug: wait for a buffer without running the graph that makes it.
    while xla._check_tensor_need_materialization([tensor])[0]:
        time.sleep(POLL_SECONDS)


def _device(xla, tensor) -> XlaDevice:
    name = str(tensor.device)
    if name not in _DEVICES:
        (real,) = xla._xla_real_devices([name])
        _DEVICES[name] = XlaDevice(name, real)
    device = _DEVICES[name]
    if not device.real.startswith("CPU"):
        raise ValueError(f"an XLA tensor on {device.real}: only XLA CPU tensors are read in place here")
    return device
