"""Transfer plans: the StartTransferRequest message and its serialized form."""

from __future__ import annotations

from kvref import _core
from kvref.proto.transfer_pb2 import StartTransferRequest

__all__ = ["Plan", "StartTransferRequest", "request_bytes"]

Plan = _core.Plan  # a registered plan, as the manager parsed it (read-only fields)


MAX_PLAN_BYTES = _core.MAX_PLAN_BYTES  # csrc/plans.h: a plan is a few block lists


def request_bytes(request) -> bytes:
    """The serialized request from bytes-like data or the message itself,
    checked against the size limit before protobuf sees it."""
    data = _serialized(request)
    if len(data) > MAX_PLAN_BYTES:
        raise ValueError(f"a plan request of {len(data):,} bytes is over the {MAX_PLAN_BYTES:,}-byte "
                         "limit; a StartTransferRequest is a few block lists")
    return data


def _serialized(request) -> bytes:
    if isinstance(request, str):
        raise TypeError("a plan request must be the serialized StartTransferRequest as bytes "
                        "(or the message), got str")
    if isinstance(request, StartTransferRequest):
        return request.SerializeToString()
    if isinstance(request, (bytes, bytearray, memoryview)):
        return bytes(request)
    raise TypeError(f"a plan request must be bytes or a StartTransferRequest, "
                    f"got {type(request).__name__}")
