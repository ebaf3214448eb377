"""Each library's store of saved blocks behind the calls the store probes
make (probes.iut.protocol.StoreView): kvref's (the reference and its facade
share it) and tpu-sync-jax's native one, whose API has moved on from the one
tpu-inference's offload connector calls."""

from __future__ import annotations

import kvref

JOB = ("kvprobe", "0", "kv_cache")  # job, replica and data name of every id the probes insert


class KvrefStoreView:
    """kvref.KVCacheStore: the connector's calls as they are; a chunk is its
    RaidenId's data_replica_idx."""

    def __init__(self, store: kvref.KVCacheStore):
        self.store = store

    def lookup(self, hashes):
        return [(h, rid.data_replica_idx) for h, rid in self.store.lookup(hashes)]

    def pin(self, hashes) -> None:
        self.store.pin(hashes)

    def release(self, hashes) -> None:
        self.store.release(hashes)

    def insert(self, hashes, chunks):
        ids = [kvref.RaidenId(*JOB, c) for c in chunks]
        taken, evicted = self.store.insert(hashes, ids, on_host=True)
        return taken, [h for h, _ in evicted]


class NativeStoreView:
    """tpu-sync-jax's native KVCacheStore, in its own terms: `lookup` pins what
    it finds unless told not to (so a pin is a pinning lookup of each hash,
    and a plain lookup passes pin_found=False); `insert` takes RaidenBlockIds,
    answers a bool and pins what it stored (so the view gives that pin back,
    as a connector that does not hold one must); evictions are not reported.
    It is built as the wheel requires: one shard, its controller on loopback."""

    def __init__(self, capacity: int):
        from tpu_sync.frameworks.jax import _tpu_raiden_jax as native

        self.native = native
        self.store = native.KVCacheStore(capacity=capacity, num_shards=1, store_server_ip="127.0.0.1")

    def lookup(self, hashes):
        return [(h, int(block.host_block_id)) for h, block in self.store.lookup(hashes, pin_found=False)]

    def pin(self, hashes) -> None:
        hashes = list(hashes)
        if len(self.store.lookup(hashes, pin_found=False)) != len(hashes):
            raise KeyError("pin: a hash is not stored")
        self.store.lookup(hashes, pin_found=True)

    def release(self, hashes) -> None:
        self.store.release(hashes)

    def insert(self, hashes, chunks):
        blocks = [self.native.RaidenBlockId(self.native.RaidenId(*JOB, c), c, status=self.native.BlockStatus.HOST)
                  for c in chunks]
        taken = bool(self.store.insert(hashes, blocks, True))
        if taken:
            self.store.release(hashes)
        return taken, None
