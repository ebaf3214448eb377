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
    assert "less than the 1,024 of transfers that landed" in m.judge()


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
