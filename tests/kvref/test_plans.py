"""register_active_plan: bytes and messages in, clear errors for the rest."""

import pytest

import kvref


@pytest.fixture
def manager():
    dev = kvref.SimDevice("tpu7x")
    return kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16") for _ in range(2)], 4)


def request(**kw):
    fields = dict(uuid="u1", peer="10.0.0.2:9000", layer_ids=[0, 1], src_block_ids=[3, 4],
                  dst_block_ids=[100, 101])
    fields.update(kw)
    return kvref.StartTransferRequest(**fields)


@pytest.mark.parametrize("as_", [lambda r: r.SerializeToString(), lambda r: r,
                                 lambda r: bytearray(r.SerializeToString()),
                                 lambda r: memoryview(r.SerializeToString())])
def test_bytes_and_messages_register(manager, as_):
    manager.register_active_plan("u1", as_(request()), is_sender=True)
    plan = manager.active_plan("u1")
    assert isinstance(plan, kvref.Plan) and plan.uuid == "u1" and plan.is_sender
    assert plan.peer == "10.0.0.2:9000" and plan.layer_ids == [0, 1]
    assert plan.src_block_ids == [3, 4] and plan.dst_block_ids == [100, 101]
    manager.unregister_active_plan("u1")
    with pytest.raises(ValueError, match="no active plan with uuid 'u1'"):
        manager.active_plan("u1")


@pytest.mark.parametrize("payload, is_sender, error, needle", [
    ("a string", True, TypeError, "as bytes (or the message), got str"),
    (12, True, TypeError, "got int"),
    (b"\xff\xff\xff", True, ValueError, "malformed StartTransferRequest (3 bytes do not parse)"),
    (request(layer_ids=[2]).SerializeToString(), True, ValueError, "layer id 2 at index 0 is out of range [0, 2)"),
    (request(src_block_ids=[512, 1]).SerializeToString(), True, ValueError,
     "source block id 512 at index 0 is out of range [0, 512)"),
    (request(dst_block_ids=[600, 1]).SerializeToString(), False, ValueError,
     "destination block id 600 at index 0 is out of range [0, 512)"),
    (request(dst_block_ids=[-1, 1]).SerializeToString(), True, ValueError, "destination block id -1"),
    (request(dst_block_ids=[1]).SerializeToString(), True, ValueError, "2 source blocks but 1 destination"),
    (request(uuid="other").SerializeToString(), True, ValueError, "does not match the request's uuid 'other'"),
])
def test_bad_plans_are_refused_and_not_registered(manager, payload, is_sender, error, needle):
    with pytest.raises(error) as e:
        manager.register_active_plan("u1", payload, is_sender=is_sender)
    assert needle in str(e.value)
    with pytest.raises(ValueError, match="no active plan"):
        manager.unregister_active_plan("u1")


def test_duplicate_and_unknown_uuids(manager):
    manager.register_active_plan("u1", request(), is_sender=True)
    with pytest.raises(ValueError, match="'u1' is already active"):
        manager.register_active_plan("u1", request(), is_sender=True)
    with pytest.raises(ValueError, match="no active plan with uuid 'zz'"):
        manager.unregister_active_plan("zz")
    with pytest.raises(TypeError, match="uuid must be str"):
        manager.register_active_plan(b"u2", request(), is_sender=True)
