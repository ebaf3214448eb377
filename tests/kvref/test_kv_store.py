"""The reference store of saved blocks (kvref.kv_store): prefix lookups,
counted pins, all-or-nothing inserts, LRU eviction that never takes a pinned
entry, every argument checked with nothing changed."""

import pytest
from hypothesis import given, settings, strategies as st

from kvref.kv_store import KVCacheStore, RaidenId


def rid(i: int) -> RaidenId:
    return RaidenId("tpu_inference", "0", "kv_cache", i)


def filled(capacity: int, count: int, **kw) -> KVCacheStore:
    store = KVCacheStore(capacity=capacity, **kw)
    for i in range(count):
        assert store.insert([bytes([i])], [rid(i)], on_host=True) == (True, [])
    return store


def contents(store: KVCacheStore) -> list:
    """Every stored (hash, id), least recently used first, with its pins."""
    return [(h, i, store.pins(h)) for h, i in store.lookup(list(store._entries))]


def test_lookup_answers_the_leading_run_of_hits_without_pinning_or_reordering():
    store = filled(4, 3)
    assert [h for h, _ in store.lookup([b"\0", b"\1", b"\x09", b"\2"])] == [b"\0", b"\1"]
    assert store.lookup([b"\x09", b"\0"]) == []
    assert store.lookup([b"\2", b"\2"]) == [(b"\2", rid(2)), (b"\2", rid(2))]
    assert all(store.pins(bytes([i])) == 0 for i in range(3))
    assert store.insert([b"\3", b"\4"], [rid(3), rid(4)]) == (True, [(b"\0", rid(0))])  # still the LRU


def test_pins_are_counted_and_a_pinned_entry_is_never_evicted():
    store = filled(2, 2)
    store.pin([b"\0", b"\0"])
    assert store.insert([b"\5"], [rid(5)]) == (True, [(b"\1", rid(1))])
    assert store.insert([b"\6"], [rid(6)]) == (True, [(b"\5", rid(5))])
    store.release([b"\0"])
    assert store.insert([b"\7"], [rid(7)]) == (True, [(b"\6", rid(6))])  # one pin left
    store.release([b"\0", b"\0", b"never stored"])  # the extra release and the unknown hash change nothing
    assert store.pins(b"\0") == 0
    assert store.insert([b"\x08"], [rid(8)]) == (True, [(b"\7", rid(7))])  # released last: most recent


def test_an_insert_that_cannot_fit_every_new_hash_inserts_none():
    store = filled(3, 3)
    store.pin([b"\0", b"\1"])
    before = contents(store)
    assert store.insert([b"\5", b"\6"], [rid(5), rid(6)]) == (False, [])
    assert contents(store) == before
    # A stored hash the insert names is not evicted to make room for the others.
    assert store.insert([b"\2", b"\5"], [rid(20), rid(5)]) == (False, [])
    assert contents(store) == before
    store.release([b"\1"])
    assert store.insert([b"\2", b"\5"], [rid(20), rid(5)]) == (False, [(b"\1", rid(1))])  # \2 was not new
    assert store.lookup([b"\2", b"\5"]) == [(b"\2", rid(2)), (b"\5", rid(5))]  # \2 keeps its chunk


BAD_CALLS = {
    "a str hash": lambda s: s.lookup(["abc"]),
    "one bytes value as the list": lambda s: s.pin(b"\0"),
    "an int hash": lambda s: s.release([1]),
    "ids of another length": lambda s: s.insert([b"x", b"y"], [rid(1)]),
    "an id that is not a RaidenId": lambda s: s.insert([b"x"], [("job", "0", "kv", 1)]),
    "a hash twice": lambda s: s.insert([b"x", b"x"], [rid(1), rid(2)]),
    "on_host not a bool": lambda s: s.insert([b"x"], [rid(1)], on_host=1),
    "a device-only entry": lambda s: s.insert([b"x"], [rid(1)], on_host=False),
    "pinning a hash not stored": lambda s: s.pin([b"\0", b"missing"]),
}


@pytest.mark.parametrize("call", BAD_CALLS, ids=list(BAD_CALLS))
def test_a_bad_argument_is_refused_by_name_and_changes_nothing(call):
    store = filled(3, 2)
    store.pin([b"\1"])
    before = contents(store)
    with pytest.raises((TypeError, ValueError, KeyError)) as refused:
        BAD_CALLS[call](store)
    assert any(word in str(refused.value) for word in ("block_hashes", "raiden_ids", "on_host", "not stored",
                                                        "twice"))
    assert contents(store) == before


@pytest.mark.parametrize("kwargs, says", [
    ({"capacity": 0}, "capacity must be a positive integer"),
    ({"capacity": True}, "capacity must be a positive integer"),
    ({"capacity": 4, "num_shards": 0}, "num_shards must be a positive integer"),
    *[({"capacity": 4, "store_server_ip": spelling}, "not a wildcard")
      for spelling in ("0.0.0.0", "0", "0x0", "::", "[::]", "0:0::0", "::ffff:0.0.0.0", "")],
    ({"capacity": 4, "raiden_id": "job"}, "raiden_id must be a RaidenId"),
])
def test_a_bad_constructor_argument_is_refused_by_name(kwargs, says):
    with pytest.raises((TypeError, ValueError), match=says):
        KVCacheStore(**kwargs)


def test_a_raiden_id_checks_its_fields_and_compares_by_value():
    assert rid(3) == RaidenId("tpu_inference", "0", "kv_cache", 3) and len({rid(3), rid(3)}) == 1
    with pytest.raises(ValueError, match="data_replica_idx"):
        RaidenId(data_replica_idx=2**31)
    with pytest.raises(TypeError, match="job_name must be a str"):
        RaidenId(job_name=7)


OPERATIONS = st.lists(st.tuples(st.sampled_from(["insert", "pin", "release", "lookup"]),
                                st.lists(st.integers(0, 7), min_size=1, max_size=4)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_under_any_sequence_pinned_entries_stay_and_the_store_never_overflows(operations):
    store = KVCacheStore(capacity=4)
    pinned: dict[bytes, int] = {}
    for op, ids in operations:
        hashes = [bytes([i]) for i in ids]
        if op == "insert" and len(set(hashes)) == len(hashes):
            stored_before = dict(store.lookup(list(store._entries)))
            all_new, evicted = store.insert(hashes, [rid(i) for i in ids])
            assert all(pinned.get(h, 0) == 0 for h, _ in evicted)
            assert all(stored_before[h] == i for h, i in evicted)
            inserted = all(h in dict(store.lookup([h])) for h in hashes)
            assert all_new == (inserted and not any(h in stored_before for h in hashes))
            if not inserted:
                assert not evicted and dict(store.lookup(list(store._entries))) == stored_before
        elif op == "pin" and all(store.lookup([h]) for h in hashes):
            store.pin(hashes)
            for h in hashes:
                pinned[h] = pinned.get(h, 0) + 1
        elif op == "release":
            store.release(hashes)
            for h in hashes:
                pinned[h] = max(0, pinned.get(h, 0) - 1)
        elif op == "lookup":
            found = [h for h, _ in store.lookup(hashes)]
            assert found == hashes[:len(found)] and (len(found) == len(hashes) or not store.lookup([hashes[len(found)]]))
        assert len(store) <= 4
        assert all(store.lookup([h]) and store.pins(h) == n for h, n in pinned.items() if n)


@pytest.mark.parametrize("fault, shows", [
    ("store_lookup_skips_misses", lambda s: len(s.lookup([b"\0", b"missing", b"\1"])) == 2),
    ("store_evicts_pinned", lambda s: (s.pin([b"\0"]), s.insert([b"\5"], [rid(5)]))[1][1] == [(b"\0", rid(0))]),
    ("store_partial_insert", lambda s: (s.pin([b"\0", b"\1"]), s.insert([b"\5", b"\6"], [rid(5), rid(6)]))[1][0]),
])
def test_each_store_fault_model_changes_what_its_rule_guarantees(fault, shows):
    assert not shows(filled(2, 2))
    assert shows(filled(2, 2, faults=[fault]))
