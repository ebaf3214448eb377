"""What managers export besides their return values: the process's counters
of the bytes their transfers moved and their pulls sent and received,
histograms of how long those transfers and pulls took, and the gauge of the
host pools they hold, under the production library's metric names (a
serving stack's dashboards read either), as Prometheus text rendered by
prometheus_client.

A transfer's bytes count, and its time is observed, once it has completed
successfully: a refused or failed transfer counts nothing. Completion is
read when the metrics are (a scrape), so a count never runs ahead of what
landed, and a time is from the transfer's issue until it was seen done.
A pull's bytes count as each run of blocks goes out of its producer and
into its consumer (a pull that fails partway counts what crossed); its
time is observed once it landed. A transfer or pull that failed counts one
failure (on the consumer's side)."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from kvref.faults import Faults

PREFIX = "tpu_raiden_"  # the production library's, so one dashboard reads both


@dataclass(frozen=True)
class Metric:
    name: str  # as a scrape shows it, after the prefix
    kind: str  # "counter", "gauge" or "histogram"
    description: str


D2H_BYTES = Metric("d2h_bytes_total", "counter",
                   "Bytes of device-to-host transfers (saves included) that completed successfully.")
H2D_BYTES = Metric("h2d_bytes_total", "counter", "Bytes of host-to-device transfers that completed successfully.")
D2H_TIME = Metric("d2h_transfer_time_ms", "histogram",
                  "Milliseconds from a device-to-host transfer's issue until it was seen complete.")
H2D_TIME = Metric("h2d_transfer_time_ms", "histogram",
                  "Milliseconds from a host-to-device transfer's issue until it was seen complete.")
POOL_BYTES = Metric("buffer_allocated_bytes", "gauge", "Host bytes of the pools of every manager alive in the process.")
SENT_BYTES = Metric("sent_bytes_total", "counter", "Bytes of blocks producers sent to pulls, as each run went out.")
RECEIVED_BYTES = Metric("received_bytes_total", "counter", "Bytes of blocks pulls received, as each run came in.")
PULL_TIME = Metric("transfer_duration_ms", "histogram", "Milliseconds from a pull's start until it landed.")
# kvref copies a transfer's blocks in one stage, so the copies' time is the transfer's.
D2H_DMA_TIME = Metric("d2h_dma_time_ms", "histogram", "Milliseconds a device-to-host transfer's copies took.")
H2D_DMA_TIME = Metric("h2d_dma_time_ms", "histogram", "Milliseconds a host-to-device transfer's copies took.")
P2P_TIME = Metric("p2p_transfer_time_ms", "histogram",
                  "Milliseconds a producer took to send a pull, from its first stream until the pull landed: one "
                  "sample per layer.")
FAILURES = Metric("transfer_failures_total", "counter", "Transfers and pulls that failed (a refused call is none).")
METRICS = (D2H_BYTES, H2D_BYTES, D2H_TIME, H2D_TIME, POOL_BYTES, SENT_BYTES, RECEIVED_BYTES, PULL_TIME,
           D2H_DMA_TIME, H2D_DMA_TIME, P2P_TIME, FAILURES)
TIME_OF = {D2H_BYTES.name: D2H_TIME.name, H2D_BYTES.name: H2D_TIME.name}  # a transfer's counter -> its histogram
DMA_OF = {D2H_TIME.name: D2H_DMA_TIME.name, H2D_TIME.name: H2D_DMA_TIME.name}  # a transfer's histogram -> its copies'
BUCKETS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, math.inf)
SWEEP_AT = 64  # transfers tracked before the completed ones are counted without a scrape


class Histogram:
    """Observations in BUCKETS_MS, as prometheus_client renders them (cumulative)."""

    def __init__(self):
        self.counts = [0] * len(BUCKETS_MS)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[next(i for i, bound in enumerate(BUCKETS_MS) if value <= bound)] += 1
        self.total += value

    def family(self, name: str, description: str) -> HistogramMetricFamily:
        cumulative, seen = [], 0
        for bound, count in zip(BUCKETS_MS, self.counts):
            seen += count
            cumulative.append(("+Inf" if bound == math.inf else str(bound), seen))
        return HistogramMetricFamily(name, description, buckets=cumulative, sum_value=self.total)


class Ledger:
    """The process's counts: transfers tracked until they complete, and the
    pool of each manager alive."""

    def __init__(self):
        self._lock = threading.Lock()
        self._totals = {m.name: 0 for m in METRICS if m.kind == "counter"}
        self._times = {m.name: Histogram() for m in METRICS if m.kind == "histogram"}
        # (core future, counter, bytes, when it was issued, the manager's token, its faults)
        self._tracked: list[tuple[object, str, int, float, int, Faults]] = []
        self._pools: dict[int, int] = {}  # a manager's token -> its pool's bytes
        self._last_pool: int | None = None  # the gauge_of_last_pool fault model's value, once it is on
        self._counted: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # counts_drop_with_manager's
        self._dropping: set[int] = set()  # managers whose counts go with them (counts_drop_with_manager)

    def track(self, core_future, metric: Metric, amount: int, faults: Faults, token: int = 0) -> None:
        """Count `amount` bytes into `metric` once the transfer completes successfully."""
        with self._lock:
            if faults.counts_requested_bytes:
                self._totals[metric.name] += amount
                return
            self._tracked.append((core_future, metric.name, amount, time.monotonic(), token, faults))
            if len(self._tracked) >= SWEEP_AT:
                self._sweep()

    def count(self, metric: Metric, amount: int) -> None:
        """Bytes that crossed now (a pull's run, sent or received)."""
        with self._lock:
            self._totals[metric.name] += amount

    def pull_landed(self, started: float) -> None:
        """A pull that began at `started` (time.monotonic()) has landed."""
        with self._lock:
            self._times[PULL_TIME.name].observe((time.monotonic() - started) * 1000.0)

    def pull_sent(self, started: float, layers: int) -> None:
        """A producer's pull, whose first stream began at `started`, landed: each of its `layers` crossed."""
        took_ms = (time.monotonic() - started) * 1000.0
        with self._lock:
            for _ in range(layers):
                self._times[P2P_TIME.name].observe(took_ms)

    def pool_opened(self, token: int, nbytes: int, faults: Faults) -> None:
        with self._lock:
            self._pools[token] = nbytes
            self._last_pool = nbytes if faults.gauge_of_last_pool else None
            if faults.counts_drop_with_manager:
                self._dropping.add(token)

    def pool_closed(self, token: int) -> None:
        with self._lock:
            self._pools.pop(token, None)
            if token in self._dropping:
                self._dropping.discard(token)
                for name, amount in self._counted.pop(token, {}).items():
                    self._totals[name] -= amount

    def values(self) -> dict[str, int]:
        """Every counter's and gauge's value now, by name."""
        with self._lock:
            self._sweep()
            pools = sum(self._pools.values()) if self._last_pool is None else self._last_pool
            return {**self._totals, POOL_BYTES.name: pools}

    def histograms(self) -> dict[str, Histogram]:
        with self._lock:
            self._sweep()
            return dict(self._times)

    def _sweep(self) -> None:
        kept = []
        for tracked in self._tracked:
            core, name, amount, issued, token, faults = tracked
            if not core.done():
                kept.append(tracked)
                continue
            try:
                core.rethrow()
            except Exception:  # a failed transfer counts nothing but its failure
                self._totals[FAILURES.name] += 1
                if faults.times_failed_transfers:
                    self._observe(name, issued, faults)
                continue
            self._totals[name] += amount
            if token in self._dropping:
                self._counted[token][name] += amount
            self._observe(name, issued, faults)
        self._tracked = kept

    def _observe(self, counter: str, issued: float, faults: Faults) -> None:
        # transfer_time_on_two_clocks: the start read from the wall clock, the end from the monotonic one
        start = time.time() - (time.monotonic() - issued) if faults.transfer_time_on_two_clocks else issued
        per_second = 1e6 if faults.transfer_time_in_microseconds else 1000.0  # what the name says: milliseconds
        took = (time.monotonic() - start) * per_second
        self._times[TIME_OF[counter]].observe(took)
        for _ in range(2 if faults.dma_time_per_stage else 1):  # the fault: its device read's, its host write's
            self._times[DMA_OF[TIME_OF[counter]]].observe(took)


LEDGER = Ledger()


class _Collector:
    """prometheus_client's view of the ledger, read at each scrape."""

    def collect(self):
        values, histograms = LEDGER.values(), LEDGER.histograms()
        for metric in METRICS:
            name = PREFIX + metric.name
            if metric.kind == "counter":
                yield CounterMetricFamily(name.removesuffix("_total"), metric.description, value=values[metric.name])
            elif metric.kind == "histogram":
                yield histograms[metric.name].family(name, metric.description)
            else:
                yield GaugeMetricFamily(name, metric.description, value=values[metric.name])


_REGISTRY = CollectorRegistry(auto_describe=False)
_REGISTRY.register(_Collector())


def prometheus_text() -> str:
    """The metrics of every manager in the process, as a scrape reads them."""
    return generate_latest(_REGISTRY).decode()
