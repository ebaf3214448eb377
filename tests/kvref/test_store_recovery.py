"""A store and a manager attached under one shared-memory key recover what
they held after their process died: the store's entries in the same order
of use, unpinned; the pool's bytes, each recovered entry's chunk locked.
A clean close leaves nothing to recover; another geometry, capacity or
model starts anew."""

import json
import os
import struct
import subprocess
import sys
import textwrap
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

import kvref
from kvref.compat import tpu_sync
from kvref.shared_pool import HEADER_BYTES
from kvref.store_table import HASH_BYTES, SLOT

SHAPE = (32, 8, 128)  # f32: 4 KiB blocks
CHUNKS = 16
SAVED = [5, 9, 2, 30]  # device blocks the crashed process saved, in this order

# The process that dies: the offload connector's calls under a key, then no clean exit.
CRASHING = textwrap.dedent("""
    import os, sys
    import numpy as np
    import kvref
    from kvref.compat import tpu_sync
    shape, chunks, saved = eval(sys.argv[1])
    dev = kvref.SimDevice("v6e")
    caches = [dev.put(np.random.default_rng(layer).standard_normal(shape).astype(np.float32)) for layer in range(2)]
    manager = tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=chunks, enable_shm=True)
    store = tpu_sync.KVCacheStore(capacity=chunks)
    for block in saved:  # one request each, as the connector saves them
        ids, future = manager.d2h_auto_allocate([block])
        future.Await()
        store.insert([b"hash-%d" % block], [tpu_sync.RaidenId(data_name="kv", data_replica_idx=ids[0])])
    store.pin([b"hash-%d" % saved[0]])  # a load in flight when it died
    store.release([b"hash-%d" % saved[1]])  # not pinned: changes nothing
    store.pin([b"hash-%d" % saved[2]]); store.release([b"hash-%d" % saved[2]])  # used again: most recent
    os._exit(0)  # no finalizer runs: the segments stay
""")


def contents(layer):
    return np.random.default_rng(layer).standard_normal(SHAPE).astype(np.float32)


def crash(key, shape=SHAPE, chunks=CHUNKS, model="default_model"):
    env = {**os.environ, tpu_sync.SHM_KEY_VARIABLE: key, tpu_sync.MODEL_UID_VARIABLE: model}
    subprocess.run([sys.executable, "-c", CRASHING, repr((shape, chunks, SAVED))], env=env, check=True,
                   timeout=120)


def segments(key):
    return sorted(p.name for p in Path("/dev/shm").glob(f"kvref-*{key}*"))


@pytest.fixture
def key(monkeypatch):
    key = f"recovery-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(tpu_sync.SHM_KEY_VARIABLE, key)
    yield key
    for path in Path("/dev/shm").glob(f"kvref-*{key}*"):
        path.unlink()


def facade_pair(capacity=CHUNKS, shape=SHAPE):
    dev = kvref.SimDevice("v6e")
    caches = [dev.put(np.zeros(shape, np.float32)) for _ in range(2)]
    manager = tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=CHUNKS, enable_shm=True)
    return manager, tpu_sync.KVCacheStore(capacity=capacity), caches, dev


def test_a_restart_after_a_crash_recovers_entries_order_and_bytes(key):
    crash(key)
    manager, store, caches, dev = facade_pair()
    hashes = [b"hash-%d" % b for b in SAVED]
    hits = store.lookup(hashes[:2])
    assert [h for h, _ in hits] == hashes[:2]
    chunks = [i.data_replica_idx for _, i in store.lookup([hashes[0]]) + store.lookup([hashes[1]])]
    chunks += [store.lookup([h])[0][1].data_replica_idx for h in hashes[2:]]
    assert [manager.reference.chunk_state(c) for c in chunks] == [kvref.ChunkState.SAVED] * 4
    assert all(store.pins(h) == 0 for h in hashes)  # the pin in flight died with its process
    manager.h2d(chunks, [0, 1, 2, 3], [1, 1, 1, 1]).Await()
    for layer, cache in enumerate(caches):
        assert np.array_equal(dev.fetch(cache)[:4], contents(layer)[SAVED])
    # Order of use kept: the least recently used goes first: hash-5, saved first (its pin in flight is gone,
    # and a pin is no use), before hash-9 and hash-30, never used again, and hash-2, used last.
    free = CHUNKS - len(SAVED)
    taken, evicted = store.insert([b"new-%d" % i for i in range(free + 1)],
                                  [tpu_sync.RaidenId(data_replica_idx=i) for i in range(free + 1)])
    assert taken and [h for h, _ in evicted] == [hashes[0]]
    taken, evicted = store.insert([b"more-%d" % i for i in range(3)], [tpu_sync.RaidenId()] * 3)
    assert [h for h, _ in evicted] == [hashes[1], hashes[3], hashes[2]]
    store.close()
    manager.reference.close()
    assert segments(key) == []  # closed cleanly: nothing to recover


def test_a_clean_close_leaves_nothing_to_recover(key):
    manager, store, _, _ = facade_pair()
    ids, future = manager.d2h_auto_allocate([1])
    future.Await()
    store.insert([b"h"], [tpu_sync.RaidenId(data_replica_idx=ids[0])])
    store.close()
    manager.reference.close()
    manager, store, _, _ = facade_pair()
    assert store.lookup([b"h"]) == [] and not manager.reference.recovered
    store.close()
    manager.reference.close()


@pytest.mark.parametrize("change", ["capacity", "model", "geometry"])
def test_another_capacity_model_or_pool_starts_anew(key, monkeypatch, change):
    crash(key)
    if change == "model":
        monkeypatch.setenv(tpu_sync.MODEL_UID_VARIABLE, "another-model")
    manager, store, _, _ = facade_pair(capacity=CHUNKS + 1 if change == "capacity" else CHUNKS,
                                       shape=(32, 8, 64) if change == "geometry" else SHAPE)
    assert store.lookup([b"hash-%d" % SAVED[0]]) == []
    assert manager.reference.recovered == (change != "geometry")
    assert manager.reference.chunks_available == CHUNKS  # nothing adopted
    store.close()
    manager.reference.close()


def test_a_torn_slot_is_dropped_and_the_rest_recovered(key):
    crash(key)
    table = next(Path("/dev/shm").glob(f"kvref-store-{key}+table"))
    data = bytearray(table.read_bytes())
    seqs = [int.from_bytes(data[HEADER_BYTES + s * SLOT.size:][:8], "little") for s in range(CHUNKS)]
    torn = seqs.index(max(seqs))
    data[HEADER_BYTES + torn * SLOT.size + 20] ^= 0xFF  # a byte of its hash, as a write cut short leaves it
    table.write_bytes(bytes(data))
    manager, store, _, _ = facade_pair()
    found = [h for h in (b"hash-%d" % b for b in SAVED) if store.lookup([h])]
    assert len(found) == len(SAVED) - 1
    assert manager.reference.chunks_available == CHUNKS - len(found)
    store.close()
    manager.reference.close()


@pytest.mark.parametrize("bad", ["out_of_the_pool", "named_twice"])
def test_a_slot_naming_a_chunk_the_pool_cannot_hold_is_dropped_and_the_rest_recovered(key, bad, caplog):
    # A table a killed process left, whose checksums hold, with one entry naming a chunk outside the
    # pool, or the chunk a later entry names: the restart drops that entry, saying so, and keeps the rest.
    crash(key)
    table = next(Path("/dev/shm").glob(f"kvref-store-{key}+table"))
    data = bytearray(table.read_bytes())
    slots = {}
    for s in range(CHUNKS):
        seq, _, hash_len, id_len, block_hash, id_text = SLOT.unpack_from(data, HEADER_BYTES + s * SLOT.size)
        if seq:
            slots[block_hash[:hash_len]] = (s, seq, json.loads(id_text[:id_len]))
    victim, (slot, seq, raiden_id) = b"hash-%d" % SAVED[1], slots[b"hash-%d" % SAVED[1]]
    raiden_id[3] = CHUNKS + 5 if bad == "out_of_the_pool" else slots[b"hash-%d" % SAVED[2]][2][3]
    id_text = json.dumps(raiden_id).encode()
    crc = zlib.crc32(struct.pack("<Q", seq) + victim + id_text)
    SLOT.pack_into(data, HEADER_BYTES + slot * SLOT.size, seq, crc, len(victim), len(id_text), victim, id_text)
    table.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="kvref.compat.tpu_sync"):
        manager, store, _, _ = facade_pair()
    assert "dropped 1 of 4 recovered entries" in caplog.text
    kept = [b for b in SAVED if store.lookup([b"hash-%d" % b])]
    assert kept == [b for b in SAVED if b != SAVED[1]]
    chunks = [store.lookup([b"hash-%d" % b])[0][1].data_replica_idx for b in kept]
    assert [manager.reference.chunk_state(c) for c in chunks] == [kvref.ChunkState.SAVED] * 3
    assert manager.reference.chunks_available == CHUNKS - 3
    store.close()
    manager.reference.close()


def test_adopting_needs_a_recovered_pool_and_free_chunks(key):
    crash(key)
    dev = kvref.SimDevice("v6e")
    reference = kvref.KVCacheManager([dev.put(np.zeros(SHAPE, np.float32)) for _ in range(2)], CHUNKS,
                                     shm_key=key)
    assert reference.recovered
    ids, future = reference.d2h_auto_allocate([0])
    future.result()
    with pytest.raises(ValueError, match="SAVED: only a FREE chunk"):
        reference.adopt_saved([ids[0]])
    with pytest.raises(ValueError, match="named twice"):
        reference.adopt_saved([7, 7])
    assert reference.chunks_available == CHUNKS - 1  # none adopted
    reference.close()
    fresh = kvref.KVCacheManager([dev.put(np.zeros(SHAPE, np.float32))], CHUNKS)
    with pytest.raises(ValueError, match="made anew"):
        fresh.adopt_saved([1])


def test_a_second_store_under_a_held_key_is_refused(key):
    store = kvref.KVCacheStore(4, shm_key=key)
    with pytest.raises(ValueError, match="attached by another"):
        kvref.KVCacheStore(4, shm_key=key)
    store.close()


def rewrite_first_saved_slot(key, rewrite) -> None:
    """The crashed table with the slot of SAVED[0]'s hash as `rewrite(seq, hash, id_text)` packs it, its
    checksum made to hold: (hash, stated hash length, id_text)."""
    table = next(Path("/dev/shm").glob(f"kvref-store-{key}+table"))
    data = bytearray(table.read_bytes())
    for s in range(CHUNKS):
        seq, _, hash_len, id_len, block_hash, id_text = SLOT.unpack_from(data, HEADER_BYTES + s * SLOT.size)
        if seq and block_hash[:hash_len] == b"hash-%d" % SAVED[0]:
            new_hash, stated, new_id = rewrite(block_hash[:hash_len], id_text[:id_len])
            crc = zlib.crc32(struct.pack("<Q", seq) + new_hash + new_id)
            SLOT.pack_into(data, HEADER_BYTES + s * SLOT.size, seq, crc, stated, len(new_id), new_hash, new_id)
    table.write_bytes(bytes(data))


def restart_keeps_all_but_the_first_saved(lost_hash: bytes) -> None:
    manager, store, _, _ = facade_pair()
    assert store.lookup([lost_hash]) == []
    assert [b for b in SAVED if store.lookup([b"hash-%d" % b])] == SAVED[1:]
    store.close()
    manager.reference.close()


@pytest.mark.parametrize("id_text", [b'["job", "0", "kv"]', b'{"data_replica_idx": 3}', b'"kv"', b'["a", "b", "c", 3, 4]'])
def test_a_slot_whose_id_is_not_the_four_fields_a_store_writes_is_dropped(key, id_text):
    # Spread into a RaidenId, a list of three fields, a dict's keys or a string's letters made an id whose
    # missing fields default: chunk 0, whose bytes are another block's.
    crash(key)
    rewrite_first_saved_slot(key, lambda block_hash, _: (block_hash, len(block_hash), id_text))
    restart_keeps_all_but_the_first_saved(b"hash-%d" % SAVED[0])


def test_a_slot_whose_stated_length_passes_its_field_is_dropped(key):
    # A hash filling its field with a stated length past it: truncated to the field, its checksum held,
    # and the entry was taken, though no store writes such a slot (make fuzz, store_tables).
    crash(key)
    long_hash = b"x" * HASH_BYTES
    rewrite_first_saved_slot(key, lambda _, id_text: (long_hash, len(long_hash) + 1000, id_text))
    restart_keeps_all_but_the_first_saved(long_hash)
