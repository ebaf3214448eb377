"""Each seed bug, reproduced by its fault model and absent without it."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import kvref
from tests.kv import random_cache, round_trip

GiB = 2**30


@pytest.mark.parametrize("dims, dtype", [((512, 6144), "bf16"), ((512, 12288), "s8")])
def test_legacy_formula_scrambles_tiled_rank2_round_trips(dims, dtype):
    dev = kvref.SimDevice("tpu7x")
    cache, host = random_cache(dev, dtype, dims)
    with pytest.raises(kvref.LayoutError):
        kvref.KVCacheManager([cache], 512)
    m = kvref.KVCacheManager([cache], 512, faults=["legacy_slice_formula"])
    assert m.bytes_per_block == kvref.legacy_major_slice_byte_size(cache.shape)
    outcome = round_trip(m, [cache], [host])
    assert outcome.verdict == "CORRUPT"
    rows_wrong = int(re.match(r"layer 0: (\d+) of 512 rows differ", outcome.detail).group(1))
    assert rows_wrong > 0.9 * 512


def test_legacy_formula_is_harmless_where_untiled():
    dev = kvref.SimDevice("tpu7x")
    shape = kvref.Shape.parse("bf16[512,6144]{1,0}")
    cache, host = random_cache(dev, "bf16", (512, 6144), shape=shape)
    m = kvref.KVCacheManager([cache], 512, faults=["legacy_slice_formula"])
    assert round_trip(m, [cache], [host]).verdict == "PASS"


def test_legacy_formula_makes_the_whole_buffer_a_block_and_budget_refuses(monkeypatch):
    """The +221 GiB case: 20 layers of bf16[512,3,2048], whose old "slice" is the
    whole 6 MiB buffer, refused before any allocation."""
    dev = kvref.SimDevice("tpu7x")
    caches = [dev.zeros((512, 3, 2048), "bf16") for _ in range(20)]
    host_blocks = 1886
    monkeypatch.setattr(kvref.manager._core, "BlockMover", _must_not_allocate)
    with pytest.raises(kvref.HostBudgetError) as e:
        kvref.KVCacheManager(caches, host_blocks, faults=["legacy_slice_formula"],
                             host_budget_bytes=64 * GiB)
    legacy = 20 * host_blocks * 6 * 2**20
    assert f"{legacy:,} bytes" in str(e.value) and "nothing was allocated" in str(e.value)
    true_block = 3 * 2048 * 2
    assert 220 * GiB < legacy - 20 * host_blocks * true_block < 222 * GiB


def test_mixed_slices_misaddress_under_fault_and_work_per_layer():
    dev = kvref.SimDevice("tpu7x")
    pairs = [random_cache(dev, "bf16", (512, n, 2048), seed=n) for n in (8, 16)]
    caches = [c for c, _ in pairs]
    faulty = kvref.KVCacheManager(caches, 512, faults=["allow_mixed_slices"])
    assert faulty.host_bytes == 2 * 512 * 32768  # everything from layer 0's slice
    outcome = round_trip(faulty, caches, [h for _, h in pairs])
    assert outcome.verdict == "CORRUPT" and outcome.detail.startswith("layer 1: ")  # layer 0 is right

    pairs = [random_cache(dev, "bf16", (512, n, 2048), seed=n) for n in (8, 16)]
    caches = [c for c, _ in pairs]
    fixed = kvref.KVCacheManager(caches, 512, slice_policy="per_layer")
    assert round_trip(fixed, caches, [h for _, h in pairs]).verdict == "PASS"


def test_plan_bytes_accepted_and_refused_by_str_only_binding():
    dev = kvref.SimDevice("tpu7x")
    request = kvref.StartTransferRequest(uuid="p1", layer_ids=[0], src_block_ids=[1, 2],
                                         dst_block_ids=[5, 6])
    fixed = kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], 4)
    fixed.register_active_plan("p1", request.SerializeToString(), is_sender=True)
    assert fixed.active_plan("p1").src_block_ids == [1, 2]
    faulty = kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], 4,
                                  faults=["str_only_plan_binding"])
    # The seed bug: the str-only binding refuses the bytes it is handed, whether
    # the caller passes bytes or a message (serialized on the way). Any other
    # TypeError would be some other failure.
    refused = (r"(?s)add_str\(\): incompatible function arguments"
               r".*Invoked with types: .*, str, bytes, bool")
    with pytest.raises(TypeError, match=refused):
        faulty.register_active_plan("p1", request.SerializeToString(), is_sender=True)
    with pytest.raises(TypeError, match=refused):
        faulty.register_active_plan("p1", request, is_sender=True)


DEFERRED_CONSTRUCTION = textwrap.dedent("""
    import faulthandler, sys
    import kvref
    faulthandler.dump_traceback_later({timeout}, exit=True)
    dev = kvref.SimDevice("tpu7x")
    with dev.defer_and_fuse():
        caches = [dev.zeros((512, 8, 2048), "bf16") for _ in range(2)]
    manager = kvref.KVCacheManager(caches, 4)
    faulthandler.cancel_dump_traceback_later()
    print("constructed", [c.state.name for c in caches])
""")


def run_construction(faults: str, timeout: float = 5.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, KVREF_FAULTS=faults)
    return subprocess.run([sys.executable, "-c", DEFERRED_CONSTRUCTION.format(timeout=timeout)],
                          capture_output=True, text=True, env=env, timeout=60)


def test_deferred_caches_construct_and_stay_materialized():
    done = run_construction("")
    assert done.returncode == 0, done.stderr
    assert "constructed ['MATERIALIZED', 'MATERIALIZED']" in done.stdout


def test_deferred_caches_hang_without_materialize():
    hung = run_construction("no_materialize_before_await", timeout=2.0)
    assert hung.returncode != 0 and "constructed" not in hung.stdout
    assert "Timeout" in hung.stderr and "unpack_buffer" in hung.stderr


def test_unknown_fault_names_are_refused(monkeypatch):
    dev = kvref.SimDevice("tpu7x")
    with pytest.raises(ValueError, match=r"unknown fault model\(s\) \['legacy_slices'\]"):
        kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], 4, faults=["legacy_slices"])
    monkeypatch.setenv("KVREF_FAULTS", "nope")
    with pytest.raises(ValueError, match="'nope'"):
        kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], 4)


def _must_not_allocate(*args, **kwargs):
    raise AssertionError("the host pool was allocated before the budget check")
