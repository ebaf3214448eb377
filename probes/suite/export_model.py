"""What a manager's process exports besides return values (its metrics), as
a projection of the contract model, judged after every step.

Counters (kvref.metrics' names, which are the production library's): the
bytes of transfers that completed successfully since the sequence began,
every layer's block counted; and each counter's histogram of transfer
times, one sample per such transfer (a call, whatever its blocks and
layers). The model knows each as a range: what landed for sure, up to
that plus what is still in flight or ended in a way the model leaves open
(a request of no blocks may copy the whole cache; a pull may count as a
device transfer on either side, once, its time in samples of the library's
choosing). A refused or failed transfer counts nothing, in bytes or
samples; a host-to-host transfer moves no device bytes. A histogram's sum
grows by no more than its samples' transfers can have taken: each from the
scrape before it was issued until the first scrape that held it.

The network counters: the bytes of blocks pulls sent (where the producer
is in the process) and received (where the consumer is), exactly those of
each pull that landed; of a pull that failed, what crossed before it did
(open), and nothing where the producer had nothing the pull asked for. A
host-to-host transfer may count its bytes there too. The pull histogram:
one sample per pull that landed on a consumer in the process, none for
one that failed.

The copies' histograms (`d2h_dma_time_ms`, `h2d_dma_time_ms`): at most
one sample per transfer that landed (a library may time none), never more
samples than their transfer's histogram, their sum no more than its. The
crossing times (`p2p_transfer_time_ms`): up to a sample per layer on each
side in the process of a pull or host-to-host transfer, landed or not, open
for good (a library may time a pull only when its producer closes). The
failure counter, an upper bound: at most one per transfer that failed (or
whose end the model leaves open), per side in the process of a pull that
failed or is in flight (a pull's device side opens none), and per
registration in the process that no pull landed (it may expire unpulled);
a transfer or pull that landed counts none.

The pool gauge: the host pools of every manager alive in the process (the
sequence's, and its host managers'). A pull manager's pool is the
library's to size, so while a sequence has pull managers the gauge is not
judged.

Whatever a library counts, every metric of its scrape is also held to what
no sound registry shows (`broken`): a counter, a histogram's count, bucket
or sum of durations or sizes going down between two scrapes; buckets that
are not cumulative, or a +Inf bucket that is not the count; a sum of
durations or sizes below zero. These hold for every metric it exports, the
ones the model does not count too.

A count may reach a scrape late (the library's thread counts after it
wakes the waiter): one below its range is read again for up to LAG_S
(and garbage collected first: a manager the harness dropped may linger in
a cycle), one above it is a finding at once."""

from __future__ import annotations

import gc
import itertools
import math
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field

from kvref.metrics import (D2H_BYTES, DMA_OF, FAILURES, H2D_BYTES, P2P_TIME, POOL_BYTES, PULL_TIME, RECEIVED_BYTES,
                           SENT_BYTES, TIME_OF)
from kvref.polling import wait_for

LAG_S = 2.0
POLL_S = 0.01
COUNTERS = (D2H_BYTES.name, H2D_BYTES.name, SENT_BYTES.name, RECEIVED_BYTES.name)
NETWORK = (SENT_BYTES.name, RECEIVED_BYTES.name)
COPIES = tuple(DMA_OF.values())
BUCKET = re.compile(r'^(?P<base>.+)_bucket\{le="(?P<le>[^"]+)"\}$')  # as probes.iut.exports names a bucket
SIZES = re.compile(r"_(ms|us|seconds|bytes)$")  # a histogram of durations or sizes: no sample is below zero


def broken(before: dict | None, now: dict) -> str | None:
    """What no sound registry's scrape shows, whatever the library counts,
    in `now` (and since `before`, the last scrape); None if nothing."""
    buckets = defaultdict(list)
    for name, value in now.items():
        found = BUCKET.match(name)
        if found:
            buckets[found["base"]].append((float(found["le"]), value))
    for base, bounds in sorted(buckets.items()):
        bounds.sort()
        for (low, fewer), (high, more) in zip(bounds, bounds[1:]):
            if more < fewer:
                return f"{base}'s bucket le={high:g} holds {more:g}, fewer than le={low:g}'s {fewer:g}: its " \
                       f"buckets are not cumulative"
        count = now.get(f"{base}_count")
        if bounds[-1][0] == math.inf and count is not None and bounds[-1][1] != count:
            return f"{base}'s +Inf bucket holds {bounds[-1][1]:g}, not its count {count:g}"
    sums = [name for name in now if name.endswith("_sum") and SIZES.search(name.removesuffix("_sum"))]
    for name in sorted(sums):
        if now[name] < 0:
            return f"{name} is {now[name]:g}: a sum of durations or sizes below zero (a sample below zero)"
    for name in sorted(set(before or {}) | set(now)):
        grows = name.endswith(("_total", "_count")) or BUCKET.match(name) or name in sums
        if grows and before and now.get(name, 0.0) < before.get(name, 0.0):
            return f"{name} went down from {before[name]:g} to {now.get(name, 0.0):g} between two scrapes: " \
                   f"it only grows in a process's life"
    return None


@dataclass
class Span:
    """A count since the sequence began (a counter's bytes, a histogram's
    samples): `settled` for sure, and each open amount that may or may not
    be in it yet."""

    settled: int = 0
    open: dict = field(default_factory=dict)  # key -> bytes

    @property
    def high(self) -> int:
        return self.settled + sum(self.open.values())


@dataclass
class Durations:
    """How many milliseconds a histogram's samples may sum to: each is at
    most the time from the scrape before its transfer was issued until the
    first scrape that held it."""

    closed_ms: float = 0.0  # of samples a scrape has held
    began: dict = field(default_factory=dict)  # key -> (the scrape before it was issued, its samples): open
    closing: list = field(default_factory=list)  # (began, samples) of those that landed, until a scrape holds them

    def bound_ms(self, at: float) -> float:
        spans = [*self.closing, *self.began.values()]
        return self.closed_ms + sum(samples * (at - began) * 1000.0 for began, samples in spans)

    def held(self, at: float) -> None:
        """A scrape at `at` holds every sample of what landed."""
        self.closed_ms += sum(samples * (at - began) * 1000.0 for began, samples in self.closing)
        self.closing.clear()


class ExportModel:
    """The exports of one sequence's process, as the model says they must read."""

    def __init__(self, exported: tuple[str, ...], read):
        self.read = read  # () -> {name: value}: the IUT's scrape
        gc.collect()  # managers earlier sequences left in cycles: gone before the baseline
        self.scraped_at = time.monotonic()  # when the last scrape began: what a step issues comes after it
        self.baseline = read()
        self.last = self.baseline  # the last scrape read
        self.counters = {name: Span() for name in COUNTERS if name in exported}
        self.samples = {name: Span() for name in (*TIME_OF.values(), *DMA_OF.values(), PULL_TIME.name, P2P_TIME.name)
                        if name in exported}
        self.failures = Span() if FAILURES.name in exported else None  # one at most per transfer or pull side
        self.durations = {name: Durations() for name in self.samples}
        self.pools: dict[object, int] | None = {} if POOL_BYTES.name in exported else None
        self.pools_known = True
        self._keys = itertools.count()

    # --- what the rules tell it --------------------------------------------

    def begun(self, key, d2h: bool, nbytes: int) -> None:
        """A transfer the manager accepted: its bytes count once it lands.
        One of no bytes (a save of no blocks) may be timed or not."""
        if nbytes == 0:
            return self.maybe(d2h, 0)
        self._open(key, d2h, nbytes, 1)

    def ended(self, key, landed: bool) -> None:
        for span in (*self.counters.values(), *self.samples.values()):
            amount = span.open.pop(key, 0)
            if landed:
                span.settled += amount
        if self.failures is not None and (failed := self.failures.open.pop(key, 0)) and not landed:
            self.failures.open[("failed", next(self._keys))] = failed  # may be counted, for good
        for durations in self.durations.values():
            began = durations.began.pop(key, None)
            if landed and began is not None:
                durations.closing.append(began)

    def moved(self, d2h: bool, nbytes: int) -> None:
        """A transfer that landed, awaited."""
        key = ("moved", next(self._keys))  # never a step's own key
        self.begun(key, d2h, nbytes)
        self.ended(key, True)

    def maybe(self, d2h: bool, nbytes: int, samples: int = 1, may_fail: bool = True) -> None:
        """A transfer the model leaves open for good, counted or not: its
        bytes, and up to `samples` samples of its time (a pull's device side
        is the library's to split); `may_fail`: it may count a failure (a
        pull's device side does not: its failure is the pull's)."""
        self._open(("maybe", next(self._keys)), d2h, nbytes, samples, may_fail)

    def pull_begun(self, key, nbytes: int, sent_here: bool, received_here: bool, layers: tuple[int, int]) -> None:
        """A pull accepted: its `nbytes` cross the network once, counted sent
        where its producer is in this process, received where its consumer
        is; once it lands, its time is one sample on the consumer's side.
        Its layers' crossing times (`layers`: the producer's and the
        consumer's) are up to a sample per layer on each side here, landed or
        not, and may come late (the wheel's come from the producer, at times
        only when it closes): open for good."""
        if P2P_TIME.name in self.samples:
            crossing = layers[0] * sent_here + layers[1] * received_here
            self._sampled(P2P_TIME.name, ("maybe", next(self._keys)), crossing)
        for name, here in zip(NETWORK, (sent_here, received_here)):
            if here and name in self.counters:
                self.counters[name].open[key] = nbytes
        if self.failures is not None:
            self.failures.open[key] = sent_here + received_here
        if received_here and PULL_TIME.name in self.samples:
            self._sampled(PULL_TIME.name, key, 1)

    def registered(self, key) -> None:
        """A registration on a producer in this process: until a pull of it
        lands, it may expire unpulled, and a library may count that a failure."""
        if self.failures is not None:
            self.failures.open[key] = 1

    def pull_ended(self, key, landed: bool, crossed_some: bool, registration=None) -> None:
        """A pull settled. Landed: every byte crossed, and one sample, and its
        `registration` (registered's key) is no failure. Failed: no sample,
        and of its bytes what crossed before it failed, which the model
        leaves open; none where the producer had nothing it asked for
        (`crossed_some` False)."""
        if landed and self.failures is not None:
            self.failures.open.pop(registration, None)
        for name in NETWORK:
            span = self.counters.get(name)
            if span is None:
                continue
            amount = span.open.pop(key, 0)
            if landed:
                span.settled += amount
            elif crossed_some and amount:
                span.open[("maybe", next(self._keys))] = amount
        self.ended(key, landed)

    def may_cross(self, nbytes: int, layers: int) -> None:
        """Bytes a host-to-host transfer moves between pools of `layers`
        layers: the network counters may count them, and the pull histograms
        its time."""
        self.pull_begun(("maybe", next(self._keys)), nbytes, True, True, (layers, layers))  # open, both ways

    def pool(self, key, nbytes: int | None) -> None:
        """A manager built (its pool's bytes), or dropped (None)."""
        if self.pools is None:
            return
        self.pools.pop(key, None)
        if nbytes is not None:
            self.pools[key] = nbytes

    def pools_unknown(self) -> None:
        self.pools_known = False

    def _open(self, key, d2h: bool, nbytes: int, samples: int, may_fail: bool = True) -> None:
        """A transfer one way, open: its bytes, and samples of its time."""
        name = D2H_BYTES.name if d2h else H2D_BYTES.name
        if name in self.counters:
            self.counters[name].open[key] = nbytes
        for histogram in (TIME_OF[name], DMA_OF[TIME_OF[name]]):  # the copies' time: one per transfer's
            if histogram in self.samples:
                self._sampled(histogram, key, samples)
        if self.failures is not None and may_fail:
            self.failures.open[key] = 1

    def _sampled(self, histogram: str, key, samples: int) -> None:
        self.samples[histogram].open[key] = samples
        self.durations[histogram].began[key] = (self.scraped_at, samples)

    # --- judging -----------------------------------------------------------

    def problem(self, now: dict, at: float | None = None) -> tuple[str, bool] | None:
        """What in a scrape (read by `at`, time.monotonic()) disagrees with
        the model, and whether it is low (it may yet arrive); None if it all
        agrees."""
        at = time.monotonic() if at is None else at
        for name, span in self.counters.items():
            grew = now.get(name, 0) - self.baseline.get(name, 0)
            if grew > span.high:
                return f"{name} grew by {grew:,.0f} bytes, more than the {span.high:,} the transfers and pulls " \
                       f"may have counted ({span.settled:,} landed, {len(span.open)} in flight or open)", False
            if grew < span.settled:
                return f"{name} grew by {grew:,.0f} bytes, less than the {span.settled:,} of transfers and pulls " \
                       f"that landed", True
        for name, span in self.samples.items():
            grew = now.get(f"{name}_count", 0) - self.baseline.get(f"{name}_count", 0)
            settled = 0 if name in COPIES else span.settled  # a library may time no copy (none on its device)
            if not settled <= grew <= span.high:
                return f"{name} holds {grew:,.0f} more samples, not one per transfer or pull that landed " \
                       f"({settled:,}" \
                       f"{'' if span.high == settled else f' to {span.high:,} with those in flight or open'})", \
                    grew < settled
            durations = self.durations[name]
            durations.held(at)
            took = now.get(f"{name}_sum", 0) - self.baseline.get(f"{name}_sum", 0)
            if took > durations.bound_ms(at) + 1.0:  # a millisecond for the clocks' reads
                return f"{name}'s samples sum to {took:,.3f} ms more, over the {durations.bound_ms(at):,.3f} ms " \
                       f"the transfers they time can have taken (from before each was issued until a scrape " \
                       f"held it): not milliseconds?", False
        for transfer, copies in DMA_OF.items():
            if transfer in self.samples and copies in self.samples:
                timed, took, copied_n, copied = (now.get(f"{name}_{part}", 0) - self.baseline.get(f"{name}_{part}", 0)
                                                 for name in (transfer, copies) for part in ("count", "sum"))
                if copied_n > timed:  # the transfer's samples may yet arrive
                    return f"{copies} holds {copied_n:,.0f} more samples, more than the {timed:,.0f} of the " \
                           f"transfers whose copies they time ({transfer})", True
                if copied > took + 1.0 + 0.01 * copied_n:  # for rounding, and clocks read apart
                    return f"{copies}'s samples sum to {copied:,.3f} ms more, over the {took:,.3f} ms of the " \
                           f"transfers whose copies they time ({transfer})", True
        if self.failures is not None:
            grew = now.get(FAILURES.name, 0) - self.baseline.get(FAILURES.name, 0)
            if grew > self.failures.high:
                return f"{FAILURES.name} grew by {grew:,.0f}, more than the {self.failures.high:,} transfers and " \
                       f"pulls that failed or may yet (each side of a pull in the process counted once)", False
        if self.pools is not None and self.pools_known:
            gauge, pools = now.get(POOL_BYTES.name, 0), sum(self.pools.values())
            if gauge != pools:
                return f"{POOL_BYTES.name} is {gauge:,.0f}, not the {pools:,} bytes of the {len(self.pools)} " \
                       f"pools alive", gauge < pools
        return None

    def judge(self) -> str | None:
        """What the exports say that no registry or the model may, after the
        bounded wait a late count gets; None if they agree."""
        first = self._problem()
        if first is None or not first[1]:  # agrees, or disagrees in a way no later count mends
            return None if first is None else first[0]
        gc.collect()  # a manager the harness dropped, not yet collected, still holds its pool
        found = [None]

        def settled() -> bool:  # agrees, or disagrees in a way no later count mends
            found[0] = self._problem()
            return found[0] is None or not found[0][1]

        wait_for(settled, LAG_S, POLL_S)
        return None if found[0] is None else found[0][0]

    def _problem(self) -> tuple[str, bool] | None:
        self.scraped_at = time.monotonic()
        now = self.read()
        wrong = broken(self.last, now)
        self.last = now
        return (wrong, False) if wrong else self.problem(now, time.monotonic())
