"""kvref over torch_xla tensors, checked inside the xla environment's
interpreter (tests/integration/test_xla.py runs `python -m tests.xla_checks NAME`; the
test process itself has no torch_xla). Each check raises on failure."""

import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402

import kvref  # noqa: E402
from probes.iut.host_data import random_host  # noqa: E402

KEY = kvref.ShapeKey("bf16", (64, 8, 128))
XLA = torch_xla._XLAC


def placed(seed: int):
    host = random_host(KEY, seed)
    tensor = kvref.to_torch(host).to(torch_xla.device())
    torch_xla.sync(wait=True)
    return tensor, host


def rows(array: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in array]


def host_rows(manager) -> list[bytes]:
    return [manager.read_block_bytes(0, b) for b in range(manager.host_blocks)]


def modified_in_place_between_transfers(faults=()):
    """d2h, overwrite the cache in place (a new XLA buffer), d2h again: the host
    gets the new contents; zero it in place (pending), h2d: the cache holds
    what came back."""
    cache, first = placed(1)
    manager = kvref.KVCacheManager([cache], KEY.dims[0], faults=faults)
    every = list(range(KEY.dims[0]))
    manager.d2h(every, every).result(timeout=60)
    assert host_rows(manager) == rows(first)
    before = XLA._unsafe_buffer_pointer(cache)
    second = random_host(KEY, 2, finite=True)  # copied by an XLA op: no NaN payloads to canonicalize
    cache.copy_(kvref.to_torch(second).to(cache.device))
    torch_xla.sync(wait=True)
    assert XLA._unsafe_buffer_pointer(cache) != before, "the update kept its buffer: nothing to re-resolve"
    manager.d2h(every, every).result(timeout=60)
    assert host_rows(manager) == rows(second), "d2h after an in-place update moved stale bytes"
    cache.zero_()
    assert XLA._check_tensor_need_materialization([cache])[0]
    manager.h2d(every, every).result(timeout=60)
    assert rows(kvref.from_torch(cache)) == rows(second), "h2d did not reach the live storage"


def stale_with_the_buffer_resolved_once():
    try:
        modified_in_place_between_transfers(faults=("buffer_resolved_once",))
    except AssertionError as e:
        print(f"failed as the fault model should: {e}")
        return
    raise AssertionError("buffer_resolved_once moved the live storage anyway")


def deferred_and_unwaited_caches_round_trip():
    """A pending computation, and one synced without waiting, as caches."""
    base, host = placed(3)
    pending = base.flip(0).flip(0)
    assert XLA._check_tensor_need_materialization([pending])[0]
    manager = kvref.KVCacheManager([pending], KEY.dims[0])
    manager.d2h([5], [0]).result(timeout=60)
    assert manager.read_block_bytes(0, 0) == host[5].tobytes()
    landing = base.flip(0).flip(0)
    torch_xla.sync(wait=False)
    manager = kvref.KVCacheManager([landing], KEY.dims[0])
    manager.d2h([7], [1]).result(timeout=60)
    assert manager.read_block_bytes(0, 1) == host[7].tobytes()


def views_are_refused_by_name():
    stacked = torch.zeros(2, *KEY.dims, dtype=torch.bfloat16, device=torch_xla.device())
    torch_xla.sync(wait=True)
    for view in (stacked[0], stacked.permute(1, 0, 2, 3)):
        try:
            kvref.KVCacheManager([view], 8)
        except ValueError as e:
            assert "view" in str(e) and "pass the base tensor" in str(e), e
        else:
            raise AssertionError(f"a view {tuple(view.shape)} was taken")


CHECKS = {f.__name__: f for f in (modified_in_place_between_transfers, stale_with_the_buffer_resolved_once,
                                  deferred_and_unwaited_caches_round_trip, views_are_refused_by_name)}

if __name__ == "__main__":
    CHECKS[sys.argv[1]]()
    print("ok")
