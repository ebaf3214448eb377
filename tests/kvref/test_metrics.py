"""What managers export: bytes of transfers that completed successfully,
and the pools of the managers alive, as a Prometheus scrape reads them."""

import gc

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kvref
from kvref import metrics
from tests.kv import random_cache

KEY = (64, 8, 128)  # bf16: 2,048 bytes a block
BLOCK = 8 * 128 * 2


@pytest.fixture
def dev():
    return kvref.SimDevice("tpu7x")


def scrape() -> dict[str, float]:
    """The scrape as a dashboard reads it, by the production library's names."""
    return {sample.name: sample.value for family in text_string_to_metric_families(metrics.prometheus_text())
            for sample in family.samples}


def grew(before: dict, name: str) -> float:
    return scrape()[metrics.PREFIX + name] - before[metrics.PREFIX + name]


def caches(dev, layers=2):
    return [random_cache(dev, "bf16", KEY, seed=i)[0] for i in range(layers)]


def test_a_transfer_counts_its_bytes_once_it_landed_and_a_refused_one_nothing(dev):
    m = kvref.KVCacheManager(caches(dev), 16)
    before = scrape()
    m.d2h([0, 1, 2], [0, 1, 2]).result()
    m.h2d([0, 1], [3, 4], [1, 1]).result()
    with pytest.raises(ValueError):
        m.h2d([0], [999])
    ids, future = m.d2h_auto_allocate([5, 6])
    future.result()
    assert grew(before, "d2h_bytes_total") == (3 + len(ids)) * 2 * BLOCK
    assert grew(before, "h2d_bytes_total") == 2 * 2 * BLOCK


@pytest.mark.parametrize("faults, counted", [((), 0), (("counts_requested_bytes",), 2 * BLOCK)])
def test_a_failed_copy_counts_nothing(dev, faults, counted):
    layer = caches(dev, 1)
    m = kvref.KVCacheManager(layer, 8, faults=faults)
    layer[0].fail_dma_in(0, BLOCK)
    before = scrape()
    with pytest.raises(kvref.DeviceError):
        m.d2h([0, 1], [0, 1]).result()
    assert grew(before, "d2h_bytes_total") == counted


@pytest.mark.parametrize("faults, samples", [((), 2), (("times_failed_transfers",), 3)])
def test_each_transfer_that_landed_is_one_sample_of_its_time(dev, faults, samples):
    layer = caches(dev, 2)
    m = kvref.KVCacheManager(layer, 8, faults=faults)
    before = scrape()
    m.d2h([0, 1, 2], [0, 1, 2]).result()  # one transfer of three blocks on two layers: one sample
    m.d2h([3], [3]).result()
    layer[0].fail_dma_in(0, BLOCK)
    with pytest.raises(kvref.DeviceError):
        m.d2h([0], [4]).result()
    assert grew(before, "d2h_transfer_time_ms_count") == samples
    assert grew(before, "d2h_bytes_total") == 4 * 2 * BLOCK


@pytest.mark.parametrize("faults", [(), ("gauge_of_last_pool",)])
def test_the_pool_gauge_is_the_pools_of_every_manager_alive(dev, faults):
    gc.collect()
    base = scrape()[metrics.PREFIX + "buffer_allocated_bytes"]
    first = kvref.KVCacheManager(caches(dev), 16, faults=faults)
    second = kvref.KVCacheManager(caches(dev), 4, faults=faults)
    both = scrape()[metrics.PREFIX + "buffer_allocated_bytes"]
    del first
    gc.collect()
    left = scrape()[metrics.PREFIX + "buffer_allocated_bytes"]
    if faults:  # the last manager's pool, whatever else is alive
        assert both == second.host_bytes
    else:
        assert both == base + (16 + 4) * 2 * BLOCK
        assert left == base + second.host_bytes


def test_the_facade_scrapes_the_same_registry(dev):
    from kvref.compat import tpu_sync
    assert tpu_sync.get_raiden_metrics_prometheus_text is metrics.prometheus_text


@pytest.mark.parametrize("faults, copies", [((), 2), (("dma_time_per_stage",), 4)])
def test_each_transfer_that_landed_is_one_sample_of_its_copies_time_and_one_that_failed_a_failure(dev, faults,
                                                                                                  copies):
    layer = caches(dev, 2)
    m = kvref.KVCacheManager(layer, 8, faults=faults)
    before = scrape()
    m.d2h([0, 1, 2], [0, 1, 2]).result()
    m.d2h([3], [3]).result()
    layer[0].fail_dma_in(0, BLOCK)
    with pytest.raises(kvref.DeviceError):
        m.d2h([0], [4]).result()
    assert grew(before, "d2h_dma_time_ms_count") == copies
    assert grew(before, "d2h_dma_time_ms_sum") == pytest.approx(grew(before, "d2h_transfer_time_ms_sum") * copies / 2)
    assert grew(before, "transfer_failures_total") == 1
