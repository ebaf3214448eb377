"""What managers export besides their return values: the process's counters
of the bytes their transfers moved and the gauge of the host pools they
hold, under the production library's metric names (a serving stack's
dashboards read either), as Prometheus text rendered by prometheus_client.

A transfer's bytes count once it has completed successfully: a refused or
failed transfer counts nothing. Completion is read when the metrics are
(a scrape), so a count never runs ahead of what landed."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvref.faults import Faults

PREFIX = "tpu_raiden_"  # the production library's, so one dashboard reads both


@dataclass(frozen=True)
class Metric:
    name: str  # as a scrape shows it, after the prefix
    kind: str  # "counter" or "gauge"
    description: str


D2H_BYTES = Metric("d2h_bytes_total", "counter",
                   "Bytes of device-to-host transfers (saves included) that completed successfully.")
H2D_BYTES = Metric("h2d_bytes_total", "counter", "Bytes of host-to-device transfers that completed successfully.")
POOL_BYTES = Metric("buffer_allocated_bytes", "gauge", "Host bytes of the pools of every manager alive in the process.")
METRICS = (D2H_BYTES, H2D_BYTES, POOL_BYTES)
SWEEP_AT = 64  # transfers tracked before the completed ones are counted without a scrape


class Ledger:
    """The process's counts: transfers tracked until they complete, and the
    pool of each manager alive."""

    def __init__(self):
        self._lock = threading.Lock()
        self._totals = {m.name: 0 for m in METRICS if m.kind == "counter"}
        self._tracked: list[tuple[object, str, int]] = []  # (core future, counter, bytes)
        self._pools: dict[int, int] = {}  # a manager's token -> its pool's bytes
        self._last_pool: int | None = None  # the gauge_of_last_pool fault model's value, once it is on

    def track(self, core_future, metric: Metric, amount: int, faults: Faults) -> None:
        """Count `amount` bytes into `metric` once the transfer completes successfully."""
        with self._lock:
            if faults.counts_requested_bytes:
                self._totals[metric.name] += amount
                return
            self._tracked.append((core_future, metric.name, amount))
            if len(self._tracked) >= SWEEP_AT:
                self._sweep()

    def pool_opened(self, token: int, nbytes: int, faults: Faults) -> None:
        with self._lock:
            self._pools[token] = nbytes
            self._last_pool = nbytes if faults.gauge_of_last_pool else None

    def pool_closed(self, token: int) -> None:
        with self._lock:
            self._pools.pop(token, None)

    def values(self) -> dict[str, int]:
        """Every metric's value now, by name."""
        with self._lock:
            self._sweep()
            pools = sum(self._pools.values()) if self._last_pool is None else self._last_pool
            return {**self._totals, POOL_BYTES.name: pools}

    def _sweep(self) -> None:
        kept = []
        for core, name, amount in self._tracked:
            if not core.done():
                kept.append((core, name, amount))
                continue
            try:
                core.rethrow()
            except Exception:  # a failed transfer counts nothing
                continue
            self._totals[name] += amount
        self._tracked = kept


LEDGER = Ledger()


class _Collector:
    """prometheus_client's view of the ledger, read at each scrape."""

    def collect(self):
        values = LEDGER.values()
        for metric in METRICS:
            name = PREFIX + metric.name
            if metric.kind == "counter":
                yield CounterMetricFamily(name.removesuffix("_total"), metric.description, value=values[metric.name])
            else:
                yield GaugeMetricFamily(name, metric.description, value=values[metric.name])


_REGISTRY = CollectorRegistry(auto_describe=False)
_REGISTRY.register(_Collector())


def prometheus_text() -> str:
    """The metrics of every manager in the process, as a scrape reads them."""
    return generate_latest(_REGISTRY).decode()
