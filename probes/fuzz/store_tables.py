"""Fuzz category `store_tables`: the store table a killed process leaves in
shared memory (kvref.store_table), slot by slot as a crash, a torn write or
a hostile writer may leave it, under a pool the same process left; then the
facade restarts under the key, as a serving engine does.

What must come back is known without kvref, from the table's format: a slot
holds an entry when its sequence number is set, its lengths fit their
fields, its checksum holds and its id is a RaidenId's four fields (three
strings and an int32); each hash's latest entry counts, in order of use; of
those, from the latest back, one whose chunk is in the pool and named by no
later entry is adopted, and every other dropped. The restart never fails,
and afterwards the store serves exactly the adopted entries, each chunk
locked SAVED, and the rest of the pool free."""

from __future__ import annotations

import json
import os
import struct
import uuid
import zlib
from pathlib import Path

import numpy as np

import kvref
from kvref.compat import tpu_sync
from kvref.shared_pool import HEADER_BYTES
from kvref.store_table import HASH_BYTES, ID_BYTES, PREFIX, SLOT
from probes.fuzz.mismatch import Mismatch

CHUNKS = 8  # the pool's chunks, and the store's capacity: its table's slots
SHAPE = (16, 4, 128)  # f32: 2 KiB blocks
INT32 = 2**31


def _id(rng) -> tuple[list, bool]:
    """A RaidenId's JSON fields, and whether they make one."""
    chunk = int(rng.integers(-2, CHUNKS + 2))
    odd = rng.random()
    if odd < 0.6:
        return ["job", "0", "kv", chunk], True
    choices = [(["job", "0", "kv"], False), (["job", "0", "kv", chunk, 1], False), ([1, "0", "kv", chunk], False),
               (["job", "0", "kv", float(chunk)], False), (["job", "0", "kv", True], False),
               (["job", "0", "kv", None], False), (["job", "0", "kv", str(chunk)], False),
               (["job", "0", "kv", INT32 * int(rng.choice([1, -2, 10**30]))], False),
               ({"data_replica_idx": chunk}, False), ("kv", False)]
    return choices[int(rng.integers(len(choices)))]


def _slot(rng, seq: int, hashes: list[bytes]) -> dict:
    fields, makes_id = _id(rng)
    block_hash = hashes[int(rng.integers(len(hashes)))]
    id_text = json.dumps(fields).encode()
    slot = {"seq": seq, "hash": block_hash.hex(), "id": id_text.hex(), "hash_len": len(block_hash),
            "id_len": len(id_text), "torn": bool(rng.random() < 0.1), "entry": makes_id}
    odd = rng.random()
    if odd < 0.05:  # a length past its field: no store writes one
        slot["hash_len"] = int(rng.integers(HASH_BYTES + 1, 2**16))
    elif odd < 0.1:
        slot["id_len"] = int(rng.integers(ID_BYTES + 1, 2**16))
    elif odd < 0.13:
        slot.update(id=os.urandom(int(rng.integers(1, ID_BYTES))).hex(), entry=False)  # bytes no store wrote
        slot["id_len"] = len(slot["id"]) // 2
    return slot


def _clean(rng) -> list[dict]:
    chunks, seqs = rng.permutation(CHUNKS), rng.choice(np.arange(1, 4 * CHUNKS), CHUNKS, replace=False)
    slots = []
    for n in range(CHUNKS):
        id_text = json.dumps(["job", "0", "kv", int(chunks[n])]).encode()
        slots.append({"seq": int(seqs[n]) if rng.random() < 0.7 else 0, "hash": (b"h-%d" % n).hex(),
                      "id": id_text.hex(), "hash_len": len(b"h-%d" % n), "id_len": len(id_text), "torn": False,
                      "entry": True})
    return slots


def expected(slots: list[dict]) -> list[tuple[bytes, int]]:
    """(hash, chunk) of each entry the restart must adopt, least recently used first."""
    latest: dict[bytes, tuple[int, object]] = {}
    for s in slots:
        block_hash, id_text = bytes.fromhex(s["hash"]), bytes.fromhex(s["id"])
        if not (s["seq"] and s["hash_len"] == len(block_hash) <= HASH_BYTES and s["id_len"] == len(id_text) <= ID_BYTES
                and not s["torn"] and s["entry"]):
            continue
        if block_hash not in latest or latest[block_hash][0] < s["seq"]:
            latest[block_hash] = (s["seq"], json.loads(id_text)[3])
    adopted, named = [], set()
    for block_hash, (_, chunk) in sorted(latest.items(), key=lambda item: -item[1][0]):
        if 0 <= chunk < CHUNKS and chunk not in named:
            adopted.append((block_hash, chunk))
        named.add(chunk)
    return adopted[::-1]


class RecoveredStoreTables:
    name = "store_tables"

    def generate(self, rng) -> dict:
        if rng.random() < 0.3:  # as a store that died left it: every entry whole
            return {"slots": _clean(rng)}
        hashes = [b"h-%d" % i for i in range(int(rng.integers(1, CHUNKS + 3)))]
        hashes += [os.urandom(int(rng.integers(1, HASH_BYTES + 1)))] if rng.random() < 0.3 else []
        seqs = rng.choice(np.arange(1, 4 * CHUNKS), CHUNKS, replace=False)  # distinct: a table's are
        return {"slots": [_slot(rng, int(seq), hashes) if rng.random() < 0.8 else {"seq": 0, "hash": "", "id": "",
                                                                                      "hash_len": 0, "id_len": 0,
                                                                                      "torn": False, "entry": False}
                          for seq in seqs]}

    def run(self, case: dict) -> str:
        key = f"fuzz-{uuid.uuid4().hex[:16]}"
        try:
            _crash(key, case["slots"])
            return _restart(key, case["slots"])
        finally:
            for path in Path("/dev/shm").glob(f"kvref-*{key}*"):
                path.unlink()


def _caches() -> list:
    device = kvref.SimDevice("v6e")
    return [device.put(np.zeros(SHAPE, np.float32)) for _ in range(2)]


def _crash(key: str, slots: list[dict]) -> None:
    """A pool and a store under `key` whose process died, its table's slots as `slots` say."""
    left = kvref.Faults(shm_segment_left=True)  # released, as a killed process releases: the segments stay
    kvref.KVCacheManager(_caches(), CHUNKS, shm_key=key, faults=left).close()
    kvref.KVCacheStore(CHUNKS, shm_key=key, faults=left).close()
    table = Path("/dev/shm") / f"{PREFIX}{key}+table"
    data = bytearray(table.read_bytes())
    for n, s in enumerate(slots):
        block_hash, id_text = bytes.fromhex(s["hash"]), bytes.fromhex(s["id"])
        crc = zlib.crc32(struct.pack("<Q", s["seq"]) + block_hash + id_text) ^ (1 if s["torn"] else 0)
        SLOT.pack_into(data, HEADER_BYTES + n * SLOT.size, s["seq"], crc, s["hash_len"], s["id_len"], block_hash,
                       id_text)
    table.write_bytes(bytes(data))


def _restart(key: str, slots: list[dict]) -> str:
    before = os.environ.get(tpu_sync.SHM_KEY_VARIABLE)
    os.environ[tpu_sync.SHM_KEY_VARIABLE] = key
    try:
        manager = tpu_sync.KVCacheManager(_caches(), 0, host_blocks_to_allocate=CHUNKS, enable_shm=True)
        store = tpu_sync.KVCacheStore(capacity=CHUNKS)
    except Exception as e:  # noqa: BLE001 (a restart must take what a crash left)
        raise Mismatch(f"the restart failed: {type(e).__name__}: {e}") from None
    finally:
        if before is None:
            del os.environ[tpu_sync.SHM_KEY_VARIABLE]
        else:
            os.environ[tpu_sync.SHM_KEY_VARIABLE] = before
    try:
        hashes = {bytes.fromhex(s["hash"]) for s in slots}
        adopted = expected(slots)
        _judge(manager.reference, store, hashes, adopted)
        return "refused" if len(adopted) < sum(bool(s["seq"]) for s in slots) else "accepted"  # dropped some
    finally:
        store.close()
        manager.reference.close()


def _judge(reference, store, hashes: set[bytes], adopted: list[tuple[bytes, int]]) -> None:
    served = {h: found[0][1].data_replica_idx for h in hashes for found in [store.lookup([h])] if found}
    if served != dict(adopted):
        raise Mismatch(f"the restart serves {served}; the table's format says {dict(adopted)}")
    states = [reference.chunk_state(c) for c in range(CHUNKS)]
    saved = sorted(c for c, state in enumerate(states) if state == kvref.ChunkState.SAVED)
    if saved != sorted(c for _, c in adopted) or reference.chunks_available != CHUNKS - len(adopted):
        raise Mismatch(f"chunks SAVED {saved}, {reference.chunks_available} free; adopted {adopted}")
