"""A KVCacheStore's table kept in shared memory under a key (tpu-sync's
metadata table under RAIDEN_SHM_KEY), so that a store built again under the
key after its process died recovers its entries: each hash with its id, in
least-recently-used order, unpinned (a pin was a load in flight, which died
with the process).

One slot per entry of the store's capacity: a sequence number (the order
of use), a checksum, the hash (at most HASH_BYTES) and the id. A slot is
written in place; one torn by the crash fails its checksum and is dropped.
An entry whose hash or id does not fit a slot is served but not kept (as
the production table keeps hashes of at most 112 bytes). The table is made
anew where the one left under the key was made for another capacity or
model (`model_uid`)."""

from __future__ import annotations

import json
import struct
import zlib

from kvref.shared_pool import PoolAttachment

PREFIX = "kvref-store-"
HASH_BYTES = 112
ID_BYTES = 128
SLOT = struct.Struct(f"<QIHH{HASH_BYTES}s{ID_BYTES}s")  # seq, crc32, hash length, id length, hash, id


class StoreTable:
    def __init__(self, key, capacity: int, model_uid: str, id_type: type, leave_segment: bool = False):
        """Hold `key` for one store (a second under it is refused by name);
        `id_type`: the store's id value (kvref.kv_store.RaidenId)."""
        if not isinstance(model_uid, str) or not model_uid:
            raise ValueError(f"model_uid must be a non-empty str, got {model_uid!r}")
        self._id_type = id_type
        self._hold = PoolAttachment(key, leave_segment, prefix=PREFIX)
        try:
            geometry = repr(("store", capacity, SLOT.size, model_uid)).encode()
            self._memory, recovered = self._hold.segment("table", capacity * SLOT.size, geometry)
        except BaseException:
            self._hold.release()
            raise
        self._free = list(range(capacity - 1, -1, -1))
        self._slots: dict[bytes, int] = {}
        self._seq = 0
        self.recovered = self._recover() if recovered else []

    def put(self, block_hash: bytes, raiden_id) -> None:
        """Keep `block_hash` -> `raiden_id` as the most recently used entry."""
        id_text = json.dumps([raiden_id.job_name, raiden_id.job_replica_id, raiden_id.data_name,
                              raiden_id.data_replica_idx]).encode()
        if len(block_hash) > HASH_BYTES or len(id_text) > ID_BYTES:
            return self.remove(block_hash)  # served, not kept
        slot = self._slots.get(block_hash)
        if slot is None:
            slot = self._slots[block_hash] = self._free.pop()
        self._seq += 1
        crc = zlib.crc32(struct.pack("<Q", self._seq) + block_hash + id_text)
        SLOT.pack_into(self._memory, slot * SLOT.size, self._seq, crc, len(block_hash), len(id_text), block_hash,
                       id_text)

    def remove(self, block_hash: bytes) -> None:
        slot = self._slots.pop(block_hash, None)
        if slot is not None:
            self._memory[slot * SLOT.size:(slot + 1) * SLOT.size] = 0
            self._free.append(slot)

    def release(self) -> None:
        """Let go of the key, removing the table (a store that closes leaves nothing to recover)."""
        self._hold.release()

    def _recover(self) -> list[tuple[bytes, object]]:
        """The entries left in the table, least recently used first, each
        hash once (its latest); the slots re-taken in that order."""
        found: dict[bytes, tuple[int, object]] = {}
        for slot in range(len(self._free)):
            seq, crc, hash_len, id_len, block_hash, id_text = SLOT.unpack_from(self._memory, slot * SLOT.size)
            if not seq or hash_len > HASH_BYTES or id_len > ID_BYTES:
                continue  # empty, or lengths past their fields, which no store writes
            block_hash, id_text = block_hash[:hash_len], id_text[:id_len]
            if crc != zlib.crc32(struct.pack("<Q", seq) + block_hash + id_text):
                continue  # torn by the crash
            raiden_id = self._parsed_id(id_text)
            if raiden_id is None:
                continue
            if block_hash not in found or found[block_hash][0] < seq:
                found[block_hash] = (seq, raiden_id)
        self._memory[:] = 0
        entries = [(h, i) for h, (_, i) in sorted(found.items(), key=lambda item: item[1][0])]
        for block_hash, raiden_id in entries:
            self.put(block_hash, raiden_id)
        return entries

    def _parsed_id(self, id_text: bytes):
        """The id a slot holds, as put() wrote it (its four fields, in a JSON
        list); None for anything else, which no store wrote."""
        try:
            fields = json.loads(id_text)
            if not isinstance(fields, list) or len(fields) != 4:
                return None
            return self._id_type(*fields)
        except (ValueError, TypeError, RecursionError):
            return None
