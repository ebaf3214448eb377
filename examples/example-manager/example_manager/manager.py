"""The manager under test. Yours replaces this file; kvprobe only calls it
through the Library in iut.py."""

from __future__ import annotations

import kvref


class BlockOffloader:
    """Moves whole blocks of each layer's KV cache between the device and a
    host pool (here by delegating to kvref's reference manager)."""

    def __init__(self, kv_caches, host_blocks: int):
        self._inner = inner = self.mover(kv_caches, host_blocks)
        self.num_layers, self.num_shards, self.host_blocks = inner.num_layers, inner.num_shards, inner.host_blocks
        self.layer_bytes_per_block, self.host_bytes = inner.layer_bytes_per_block, inner.host_bytes

    @staticmethod
    def mover(kv_caches, host_blocks: int) -> kvref.KVCacheManager:
        """What moves the bytes: the stand-in for your own code."""
        return kvref.KVCacheManager(kv_caches, host_blocks)

    def offload(self, device_blocks, host_blocks, run_lengths=None) -> kvref.TransferFuture:
        return self._inner.d2h(device_blocks, host_blocks, run_lengths)

    def restore(self, host_blocks, device_blocks, run_lengths=None) -> kvref.TransferFuture:
        return self._inner.h2d(host_blocks, device_blocks, run_lengths)

    def save(self, device_blocks, run_lengths=None) -> tuple[list[int], kvref.TransferFuture]:
        return self._inner.d2h_auto_allocate(device_blocks, run_lengths)

    def release(self, chunk_ids) -> None:
        self._inner.unlock_blocks(chunk_ids)

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes:
        return self._inner.read_block_bytes(layer, block, shard)

    def register_active_plan(self, uuid: str, request, is_sender: bool) -> None:
        self._inner.register_active_plan(uuid, request, is_sender)

    def active_plan(self, uuid: str):
        return self._inner.active_plan(uuid)
