"""The manager's settings, many of which a serving engine passes through
unchecked (often from the environment): one record, `ManagerSettings`, each
field checked by its own `_check_<field>` with an error naming the setting,
the value and what was expected. A KVCacheManager is built from one."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from kvref.addressing import SLICE_POLICIES
from kvref.endpoints import address, port_of
from kvref.faults import Faults
from kvref.shared_pool import check_key
from kvref.values import flag, integer

MAX_PULL_SLOTS = 1024

MAX_PARALLELISM = 1024  # parts per transfer; more only costs threads and bookkeeping


def check_parallelism(value) -> int | None:
    """None (the copy pool's threads) or an integer in [1, MAX_PARALLELISM]."""
    return None if value is None else integer(value, "parallelism", 1, MAX_PARALLELISM)


MAX_TIMEOUT_S = 1e7  # a wait's limit converts to the steady clock's int64 nanoseconds: far below their 292 years


def check_timeout(value, name: str = "timeout_s") -> float | None:
    """None (no limit) or a positive, finite number of seconds (a manager's
    timeout_s, a future's result(timeout): every wait's limit)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not (value > 0 and (value > MAX_TIMEOUT_S or math.isfinite(value))):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"{name} must be at most {MAX_TIMEOUT_S:.0f} s (about 116 days: past what the "
                         f"waits' clocks hold, every wait would fail at once; None waits without a limit), "
                         f"got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ManagerSettings:
    """What a KVCacheManager is built with besides its caches and fault models.

    host_blocks: blocks of the host pool (every layer and shard of each).
    host_budget_bytes: the most the pool may take (None: half the memory available now).
    slice_policy: "uniform" (every layer one block size) or "per_layer".
    parallelism: the most parts one transfer is split into (None: the copy pool's threads).
    timeout_s: the longest a future's result() waits by default (None: until done), and a
        transfer between managers (None: two minutes).
    listen: 'host:port' (port 0: any free one) to serve pulls of what the manager
        registers (kvref.pulls); None: it opens no listening socket.
    pull_slots, pull_slot_blocks: slots of that many blocks that pulls pass through
        (kvref.staging; allocated at the first pull).
    sub_managers: listeners on consecutive ports, each serving its share of the parts of
        a block, as a manager split by NUMA node.
    shm_key: attach the pool under this shared-memory key, which no other manager may
        hold meanwhile (kvref.shared_pool), its bytes recovered after a crash.
    serve_host: the listener also serves host-to-host transfers (kvref.host_transfers:
        peers read its host blocks and write into its free chunks); needs `listen`."""

    host_blocks: int
    host_budget_bytes: int | None = None
    slice_policy: str = "uniform"
    parallelism: int | None = None
    timeout_s: float | None = None
    listen: str | None = None
    pull_slots: int = 4
    pull_slot_blocks: int = 64
    sub_managers: int = 1
    shm_key: str | None = None
    serve_host: bool = False

    @classmethod
    def checked(cls, faults: Faults = Faults(), **values) -> "ManagerSettings":
        """The record of `values` (host_blocks and any others by name), each
        field checked, in declaration order (a fault model may let some through
        unchecked, as an old bug did)."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise TypeError(f"unknown manager setting(s) {unknown}; expected any of {known}")
        if "host_blocks" not in values:
            raise TypeError("host_blocks is required: the blocks of the host pool")
        settings = cls(**values)
        checked = {f.name: getattr(cls, f"_check_{f.name}")(getattr(settings, f.name), faults) for f in fields(cls)}
        if checked["serve_host"] and checked["listen"] is None and not faults.offload_only_listens:
            raise ValueError("serve_host=True serves host-to-host transfers on the listener; give listen= too")
        base = port_of(checked["listen"]) if checked["listen"] is not None else 0
        if base and base + checked["sub_managers"] - 1 > 65535:
            raise ValueError(f"{checked['sub_managers']} sub-managers listen on consecutive ports from {base}: the "
                             f"last, {base + checked['sub_managers'] - 1}, is past 65535")
        return replace(settings, **checked)

    @staticmethod
    def _check_host_blocks(value, faults):
        return int(integer(value, "host_blocks", 1))

    @staticmethod
    def _check_host_budget_bytes(value, faults):
        return None if value is None else int(integer(value, "host_budget_bytes", 0))

    @staticmethod
    def _check_slice_policy(value, faults):
        if value not in SLICE_POLICIES:
            raise ValueError(f"slice_policy {value!r} is not one of {SLICE_POLICIES}")
        return value

    @staticmethod
    def _check_parallelism(value, faults):
        return value if faults.unchecked_settings else check_parallelism(value)

    @staticmethod
    def _check_timeout_s(value, faults):
        return value if faults.unchecked_settings else check_timeout(value)

    @staticmethod
    def _check_listen(value, faults):
        return None if value is None else address(value, "listen")

    @staticmethod
    def _check_pull_slots(value, faults):
        return int(integer(value, "pull_slots", 1, MAX_PULL_SLOTS))

    @staticmethod
    def _check_pull_slot_blocks(value, faults):
        return int(integer(value, "pull_slot_blocks", 1))

    @staticmethod
    def _check_sub_managers(value, faults):
        return int(integer(value, "sub_managers", 1))

    @staticmethod
    def _check_shm_key(value, faults):
        return None if value is None else check_key(value)

    @staticmethod
    def _check_serve_host(value, faults):
        return flag(value, "serve_host")
