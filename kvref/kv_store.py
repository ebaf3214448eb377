"""The store of saved blocks an offload connector keeps beside its manager:
which block hashes have a copy on the host, and where (a `RaidenId` naming
the host chunk), as tpu-inference's offload connector calls it
(`KVCacheStore(capacity=N)`, `lookup`, `pin`, `release`, `insert`).

What holds (the production store's rules, where its API still has them):

- `lookup` answers the leading run of hits, in request order, stopping at
  the first miss (a prefix cache: block i is only useful after 0..i-1). It
  neither pins nor reorders.
- Pins are counted: each `pin` of a hash needs a `release`. Releasing a hash
  that is not pinned, or not stored, changes nothing (the connector releases
  every hash of a finished request, hits or not). A hash whose last pin is
  released becomes the most recently used.
- `insert` is all or nothing: the new hashes go in only if there is room
  for all of them once unpinned entries are evicted, least recently used
  first; a pinned entry is never evicted. A hash already stored keeps its
  chunk, becomes the most recently used, and is never evicted to make room
  for the hashes inserted with it. It answers whether every hash
  was new and inserted, and the (hash, id) pairs it evicted, whose chunks
  the caller unlocks.

An entry is in flight (being loaded) exactly while the connector holds a
pin on it, so pinned and in-flight are one state here. Every call checks
every argument first and changes nothing when one is wrong.

Built with `shm_key`, the store keeps its table in shared memory
(kvref.store_table): built again under the key after its process died, it
starts with the entries it had, in the same order of use, unpinned
(`recovered`); their chunks are in the pool a manager attached under the
same key recovers (KVCacheManager.adopt_saved locks them). `close()` (also
when the store is dropped) removes the table."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from kvref.endpoints import is_wildcard
from kvref.faults import Faults
from kvref.store_table import StoreTable
from kvref.values import flag, integer

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class RaidenId:
    """Where a saved block lives: a job, its replica, a data set, and the
    index within it (the host chunk, for an offloaded KV block)."""

    job_name: str = ""
    job_replica_id: str = ""
    data_name: str = ""
    data_replica_idx: int = 0

    def __post_init__(self):
        for name in ("job_name", "job_replica_id", "data_name"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"RaidenId.{name} must be a str, got {getattr(self, name)!r}")
        integer(self.data_replica_idx, "RaidenId.data_replica_idx", -INT32_MAX - 1, INT32_MAX)


class KVCacheStore:
    """Block hash -> RaidenId for up to `capacity` saved blocks (see the module)."""

    def __init__(self, capacity: int, *, num_shards: int = 1, store_server_ip: str = "127.0.0.1",
                 raiden_id: RaidenId = RaidenId(), shm_key: str | None = None, model_uid: str = "default_model",
                 faults=()):
        self._capacity = integer(capacity, "capacity", 1)
        self.num_shards = integer(num_shards, "num_shards", 1)
        if not isinstance(store_server_ip, str) or is_wildcard(store_server_ip):
            raise ValueError(f"store_server_ip must name this host as peers reach it (not empty, not a "
                             f"wildcard), got {store_server_ip!r}")
        if not isinstance(raiden_id, RaidenId):
            raise TypeError(f"raiden_id must be a RaidenId, got {raiden_id!r}")
        self.store_server_ip = store_server_ip
        self.raiden_id = raiden_id
        self._faults = Faults.parse(faults)  # names, a Faults, and $KVREF_FAULTS, as the manager takes them
        self._entries: OrderedDict[bytes, RaidenId] = OrderedDict()  # least recently used first
        self._pins: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self._table = None if shm_key is None else StoreTable(shm_key, self._capacity, model_uid, RaidenId,
                                                                self._faults.shm_segment_left)
        self.recovered = list(self._table.recovered) if self._table is not None else []
        for block_hash, raiden_id in self.recovered:
            self._entries[block_hash] = raiden_id
        # The table is released by close() or, for a store dropped unclosed, when it is collected.
        self._release = weakref.finalize(self, self._table.release) if self._table is not None else None

    def close(self) -> None:
        """Release the shared table (removing its segment); again: nothing."""
        if self._release is not None:
            self._release()

    def _kept(self, block_hash: bytes) -> None:
        """Mirror an entry's change (stored or used: the latest; gone) into the shared table."""
        if self._table is None:
            return
        if block_hash in self._entries:
            self._table.put(block_hash, self._entries[block_hash])
        else:
            self._table.remove(block_hash)

    def forget_recovered(self, entries=None) -> None:
        """Drop the entries recovered at construction (`entries` of them, or
        all) that are still as they were: their chunks were not recovered."""
        with self._lock:
            for block_hash, raiden_id in self.recovered if entries is None else entries:
                if self._entries.get(block_hash) == raiden_id and block_hash not in self._pins:
                    del self._entries[block_hash]
                    self._kept(block_hash)
            self.recovered = [] if entries is None else [e for e in self.recovered if e not in entries]

    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._entries)

    def pins(self, block_hash: bytes) -> int:
        """How many pins `block_hash` holds (0 when not stored)."""
        return self._pins.get(_hashes([block_hash], "block_hash")[0], 0)

    def lookup(self, block_hashes) -> list[tuple[bytes, RaidenId]]:
        """The leading run of stored hashes, each with its id."""
        hashes = _hashes(block_hashes, "block_hashes")
        with self._lock:
            found = []
            for h in hashes:
                if h in self._entries:
                    found.append((h, self._entries[h]))
                elif not self._faults.store_lookup_skips_misses:
                    break
            return found

    def pin(self, block_hashes) -> None:
        """One more pin on each hash (every one must be stored)."""
        hashes = _hashes(block_hashes, "block_hashes")
        with self._lock:
            missing = [h for h in hashes if h not in self._entries]
            if missing:
                raise KeyError(f"pin: {len(missing)} of {len(hashes)} hashes are not stored (first: "
                               f"{missing[0]!r}); nothing was pinned")
            for h in hashes:
                self._pins[h] = self._pins.get(h, 0) + 1

    def release(self, block_hashes) -> None:
        """One pin fewer on each pinned hash; others are left as they are."""
        hashes = _hashes(block_hashes, "block_hashes")
        with self._lock:
            for h in hashes:
                if self._pins.get(h, 0) == 0:
                    continue
                self._pins[h] -= 1
                if self._pins[h] == 0:
                    del self._pins[h]
                    if not self._faults.store_fifo_eviction:
                        self._entries.move_to_end(h)
                        self._kept(h)

    def insert(self, block_hashes, raiden_ids, on_host: bool = True) -> tuple[bool, list[tuple[bytes, RaidenId]]]:
        """Store each new hash with its id, all or none: (whether every hash
        was new and stored, the entries evicted to make room)."""
        hashes = _hashes(block_hashes, "block_hashes")
        ids = list(raiden_ids) if isinstance(raiden_ids, (list, tuple)) else None
        if ids is not None and self._faults.store_unchecked_lengths:
            ids = (ids + [RaidenId()] * len(hashes))[:len(hashes)]
        if ids is None or len(ids) != len(hashes) or not all(isinstance(i, RaidenId) for i in ids):
            raise TypeError(f"raiden_ids must be a list of {len(hashes)} RaidenId, one per hash, got {raiden_ids!r}")
        if not flag(on_host, "on_host"):
            raise ValueError("on_host=False: this store holds blocks saved to the host only")
        if len(set(hashes)) != len(hashes):
            raise ValueError(f"block_hashes names a hash twice: {_first_repeat(hashes)!r}")
        with self._lock:
            new = [(h, i) for h, i in zip(hashes, ids) if h not in self._entries]
            free = self._capacity - len(self._entries)
            named = set(hashes)  # a stored hash this insert names is kept for it, not evicted to make room
            evictable = [h for h in self._entries
                         if h not in named and (self._faults.store_evicts_pinned or h not in self._pins)]
            if len(new) > free + len(evictable) and not self._faults.store_partial_insert:
                return False, []
            evicted = []
            for victim in evictable[:max(0, len(new) - free)]:
                evicted.append((victim, self._entries.pop(victim)))
                self._pins.pop(victim, None)
                self._kept(victim)
            stored = new[:self._capacity - len(self._entries)]
            for h in hashes:
                if h in self._entries and not self._faults.store_fifo_eviction:
                    self._entries.move_to_end(h)
                    self._kept(h)
            for h, i in stored:
                self._entries[h] = i
                self._kept(h)
            whole = len(stored) == len(new) or self._faults.store_partial_insert
            return len(new) == len(hashes) and whole, evicted


def _hashes(block_hashes, name: str) -> list[bytes]:
    """A list of block hashes (bytes), or TypeError naming the first that is not."""
    if isinstance(block_hashes, (bytes, str)) or not hasattr(block_hashes, "__iter__"):
        raise TypeError(f"{name} must be a sequence of bytes hashes, got {block_hashes!r}")
    hashes = list(block_hashes)
    for i, h in enumerate(hashes):
        if not isinstance(h, bytes):
            raise TypeError(f"{name}[{i}] must be bytes (a block hash), got {type(h).__name__} {h!r}")
    return hashes


def _first_repeat(hashes: list[bytes]) -> bytes:
    seen = set()
    for h in hashes:
        if h in seen:
            return h
        seen.add(h)
    raise AssertionError("no repeat")
