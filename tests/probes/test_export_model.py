"""The model of what a manager's process exports: each counter a range
between what landed and what may yet count, the pool gauge the live pools,
and a late count given a bounded wait."""

import threading

import pytest

from probes.suite import export_model
from probes.suite.export_model import ExportModel

D2H, H2D, POOL = "d2h_bytes_total", "h2d_bytes_total", "buffer_allocated_bytes"


class Scrape:
    """A library's scrape, set by the test."""

    def __init__(self, **values):
        self.values = {D2H: 0.0, H2D: 0.0, POOL: 0.0, **values}

    def __call__(self):
        return dict(self.values)


def model(scrape, names=(D2H, H2D, POOL)):
    return ExportModel(names, scrape)


def test_counts_are_judged_from_the_sequence_start():
    scrape = Scrape(**{D2H: 1000.0})
    m = model(scrape)
    m.moved(True, 4096)
    scrape.values[D2H] = 1000 + 4096
    assert m.problem(scrape()) is None
    scrape.values[D2H] = 1000 + 8192
    problem, low = m.problem(scrape())
    assert not low and "grew by 8,192 bytes, more than the 4,096" in problem


def test_a_transfer_in_flight_may_or_may_not_have_counted_and_a_failed_one_never():
    scrape = Scrape()
    m = model(scrape)
    m.begun(3, False, 2048)
    assert m.problem(scrape()) is None
    scrape.values[H2D] = 2048
    assert m.problem(scrape()) is None
    m.ended(3, landed=False)
    assert m.problem(scrape())[0].startswith(f"{H2D} grew by 2,048 bytes, more than the 0")


def test_a_count_that_arrives_late_is_waited_for_and_one_that_never_does_is_a_finding(monkeypatch):
    monkeypatch.setattr(export_model, "LAG_S", 0.5)
    scrape = Scrape()
    m = model(scrape)
    m.moved(True, 512)
    late = threading.Timer(0.1, lambda: scrape.values.__setitem__(D2H, 512.0))
    late.start()
    assert m.judge() is None
    late.join()
    m.moved(True, 512)
    assert "less than the 1,024 of transfers and pulls that landed" in m.judge()


def test_the_pool_gauge_is_every_live_pool_until_pull_managers_make_it_unknown():
    scrape = Scrape(**{POOL: 100.0})
    m = model(scrape)
    m.pool("offload", 100)
    m.pool(("host", 0), 40)
    assert "is 100, not the 140 bytes of the 2 pools alive" in m.judge()
    m.pool(("host", 0), None)
    assert m.judge() is None
    m.pools_unknown()
    scrape.values[POOL] = 7.0
    assert m.judge() is None


@pytest.mark.parametrize("names", [(D2H,), ()])
def test_only_what_the_library_exports_is_judged(names):
    scrape = Scrape(**{H2D: 99.0, POOL: 5.0})
    m = model(scrape, names)
    m.begun(1, False, 10)
    m.ended(1, True)
    m.pool("offload", 1)
    assert m.judge() is None


HISTOGRAM = {'p2p_transfer_time_ms_bucket{le="5"}': 1.0, 'p2p_transfer_time_ms_bucket{le="10"}': 2.0,
             'p2p_transfer_time_ms_bucket{le="+Inf"}': 3.0, "p2p_transfer_time_ms_count": 3.0,
             "p2p_transfer_time_ms_sum": 40.0, "sent_bytes_total": 8192.0, "buffer_allocated_bytes": 4096.0}


@pytest.mark.parametrize("change, before, said", [
    ({"sent_bytes_total": 4096.0}, HISTOGRAM, "sent_bytes_total went down from 8192 to 4096"),
    ({"p2p_transfer_time_ms_count": 2.0, 'p2p_transfer_time_ms_bucket{le="+Inf"}': 2.0}, HISTOGRAM,
     "p2p_transfer_time_ms_bucket{le=\"+Inf\"} went down from 3 to 2"),
    ({"p2p_transfer_time_ms_sum": 30.0}, HISTOGRAM, "p2p_transfer_time_ms_sum went down from 40 to 30"),
    ({'p2p_transfer_time_ms_bucket{le="10"}': 0.5}, None, "bucket le=10 holds 0.5, fewer than le=5's 1"),
    ({"p2p_transfer_time_ms_count": 4.0}, None, "+Inf bucket holds 3, not its count 4"),
    ({"p2p_transfer_time_ms_sum": -1.8e15}, None, "p2p_transfer_time_ms_sum is -1.8e+15: a sum of durations"),
])
def test_what_no_registry_shows_is_found_in_any_metric(change, before, said):
    assert export_model.broken(before, HISTOGRAM) is None
    problem = export_model.broken(before, {**HISTOGRAM, **change})
    assert problem is not None and said in problem, problem


def test_a_gauge_may_go_down_and_a_counter_not_yet_exported_reads_as_zero():
    assert export_model.broken(HISTOGRAM, {**HISTOGRAM, "buffer_allocated_bytes": 0.0}) is None
    assert export_model.broken({"d2h_bytes_total": 0.0}, {}) is None
    assert "d2h_bytes_total went down from 5 to 0" in export_model.broken({"d2h_bytes_total": 5.0}, {})


def test_a_counter_going_down_is_a_finding_at_once():
    scrape = Scrape(**{"transfer_failures_total": 2.0})
    m = model(scrape)
    scrape.values["transfer_failures_total"] = 1.0
    assert "transfer_failures_total went down from 2 to 1" in m.judge()


def test_a_pull_that_landed_counts_its_bytes_and_one_sample_and_one_that_failed_no_sample():
    sent, received, samples = "sent_bytes_total", "received_bytes_total", "transfer_duration_ms_count"
    scrape = Scrape()
    m = model(scrape, (sent, received, "transfer_duration_ms"))
    m.pull_begun("a", 4096, sent_here=True, received_here=True, layers=(2, 2))
    m.pull_begun("b", 2048, sent_here=False, received_here=True, layers=(2, 2))
    m.pull_begun("c", 1024, sent_here=True, received_here=True, layers=(2, 2))
    scrape.values.update({sent: 5120.0, received: 7168.0, samples: 1.0})  # in flight: any of it may have counted
    assert m.problem(scrape()) is None
    m.pull_ended("a", landed=True, crossed_some=True)
    m.pull_ended("b", landed=False, crossed_some=True)  # some of it may have crossed before it failed
    m.pull_ended("c", landed=False, crossed_some=False)  # the producer had nothing it asked for
    assert m.problem(scrape())[0].startswith(f"{sent} grew by 5,120 bytes, more than the 4,096")
    scrape.values[sent] = 4096.0
    assert m.problem(scrape())[0].startswith(f"{received} grew by 7,168 bytes, more than the 6,144")
    scrape.values[received] = 4096.0
    assert m.problem(scrape()) is None
    scrape.values[samples] = 2.0
    assert "transfer_duration_ms holds 2 more samples" in m.problem(scrape())[0]


def test_samples_that_sum_past_the_time_their_transfers_can_have_taken_are_a_finding():
    name = "d2h_transfer_time_ms"
    scrape = Scrape(**{f"{name}_count": 0.0, f"{name}_sum": 0.0})
    m = model(scrape, (D2H, name))
    began = m.scraped_at
    m.moved(True, 512)
    scrape.values.update({D2H: 512.0, f"{name}_count": 1.0, f"{name}_sum": 0.5})
    at = began + 0.010  # the scrape that holds it, 10 ms after the one before the transfer was issued
    assert m.problem(scrape(), at) is None
    scrape.values[f"{name}_sum"] = 0.5 + 20.0
    assert "samples sum to 20.500 ms more, over the 10.000 ms" in m.problem(scrape(), at)[0]


def test_the_copies_histogram_holds_one_sample_per_transfer_and_no_more_time_than_it():
    took, copies = "h2d_transfer_time_ms", "h2d_dma_time_ms"
    scrape = Scrape(**{f"{name}_{part}": 0.0 for name in (took, copies) for part in ("count", "sum")})
    m = model(scrape, (H2D, took, copies))
    at = m.scraped_at + 0.010
    m.moved(False, 512)
    scrape.values.update({H2D: 512.0, f"{took}_count": 1.0, f"{took}_sum": 2.0, f"{copies}_count": 1.0,
                          f"{copies}_sum": 2.0})
    assert m.problem(scrape(), at) is None
    scrape.values[f"{copies}_sum"] = 4.0
    problem, low = m.problem(scrape(), at)
    assert low and "h2d_dma_time_ms's samples sum to 4.000 ms more, over the 2.000 ms" in problem
    scrape.values.update({f"{copies}_count": 2.0, f"{copies}_sum": 2.0})
    problem, low = m.problem(scrape(), at)
    assert not low and "h2d_dma_time_ms holds 2 more samples, not one per transfer" in problem


def test_failures_count_only_what_failed_or_may_yet():
    failures = "transfer_failures_total"
    scrape = Scrape(**{failures: 3.0})
    m = model(scrape, (failures,))
    m.moved(True, 512)  # landed: no failure
    m.begun(1, True, 512)  # in flight: may fail
    m.pull_begun("p", 1024, sent_here=True, received_here=True, layers=(2, 2))
    m.pull_ended("p", landed=True, crossed_some=True)
    scrape.values[failures] = 4.0
    assert m.problem(scrape()) is None
    m.ended(1, landed=True)
    problem, low = m.problem(scrape())
    assert not low and "transfer_failures_total grew by 1, more than the 0" in problem
    m.pull_begun("q", 1024, sent_here=True, received_here=True, layers=(2, 2))
    m.pull_ended("q", landed=False, crossed_some=True)  # failed: each side may count it, for good
    scrape.values[failures] = 5.0
    assert m.problem(scrape()) is None
    scrape.values[failures] = 6.0
    assert "grew by 3, more than the 2" in m.problem(scrape())[0]
    m.registered(("registered", 9))  # may expire unpulled, and count as failed
    assert m.problem(scrape()) is None
    m.pull_begun("r", 1024, sent_here=True, received_here=False, layers=(2, 2))
    m.pull_ended("r", landed=True, crossed_some=True, registration=("registered", 9))  # it landed: no failure
    assert "grew by 3, more than the 2" in m.problem(scrape())[0]


def test_a_pulls_crossing_times_are_up_to_one_sample_per_layer_on_each_side_here_landed_or_not():
    p2p = "p2p_transfer_time_ms"
    scrape = Scrape(**{f"{p2p}_count": 0.0, f"{p2p}_sum": 0.0})
    m = model(scrape, (p2p,))
    m.pull_begun("a", 4096, sent_here=True, received_here=False, layers=(2, 3))
    m.pull_ended("a", landed=False, crossed_some=True)  # its samples may still come (the producer's, late)
    scrape.values.update({f"{p2p}_count": 2.0, f"{p2p}_sum": 0.5})
    assert m.problem(scrape(), m.scraped_at + 0.010) is None
    scrape.values[f"{p2p}_count"] = 3.0
    problem, low = m.problem(scrape(), m.scraped_at + 0.010)
    assert not low and "p2p_transfer_time_ms holds 3 more samples" in problem
    m.may_cross(1024, layers=2)  # a host-to-host transfer: up to a sample per layer on each side
    scrape.values[f"{p2p}_count"] = 6.0
    assert m.problem(scrape(), m.scraped_at + 0.010) is None


def test_copies_are_never_ahead_of_their_transfers_and_may_be_untimed():
    took, copies = "d2h_transfer_time_ms", "d2h_dma_time_ms"
    scrape = Scrape(**{f"{name}_{part}": 0.0 for name in (took, copies) for part in ("count", "sum")})
    m = model(scrape, (took, copies))
    at = m.scraped_at + 0.010
    m.moved(True, 512)
    m.begun(2, True, 512)  # in flight: its samples may be there, or not yet
    scrape.values.update({f"{took}_count": 1.0, f"{took}_sum": 2.0})
    assert m.problem(scrape(), at) is None  # a library that times no copy
    scrape.values.update({f"{copies}_count": 2.0, f"{copies}_sum": 2.0})
    problem, low = m.problem(scrape(), at)
    assert low and "d2h_dma_time_ms holds 2 more samples, more than the 1 of the transfers" in problem
