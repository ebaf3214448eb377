"""What both sides of a pull probe do: build a manager over caches of their
own, tell the other side what it needs (probes.suite.rendezvous), poll for
what settled, and check the consumer's blocks against the producer's."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.iut.host_data import random_host
from probes.iut.protocol import PullLibrary
from probes.iut.standin_rails import cannot_make_interfaces, enter_rails_namespace, join_namespace
from probes.suite.cases import Case
from probes.suite.rendezvous import DONE, PRODUCER, Rendezvous
from probes.suite.verdicts import SKIP, Outcome

SUBJECT = kvref.ShapeKey("bf16", (256, 8, 1024))  # 16 KiB blocks; contiguous rows on every generation
# A cache split across its kv heads over four devices: four parts to a block.
SHARDED = (kvref.ShapeKey("bf16", (64, 16, 8, 128)), kvref.Sharding.parse("mesh(model=4) spec(None,None,model)"))
LAYERS = 4
PRODUCER_SEED, CONSUMER_SEED = 100, 200  # layer i's contents: random_host(key, seed + i)
COPY_SEEDS = 50  # a worker's second manager (copy 1) has caches of seeds 50 on: no layer shares contents
PULL_TIMEOUT_S = 10.0  # the managers' timeout_s where a pull is meant to land
FAILING_TIMEOUT_S = 5.0  # where one is meant to fail, or to be waited past
PROMPT_S = 2.0  # a failure the manager can see at once (a refusal, a lost peer) is reported within this
SETTLE_GRACE_S = 3.0  # beyond timeout_s, before a pull that never settled is a finding
REPEAT_POLLS = 5  # polls after everything settled, to see nothing is reported twice
POLL_SECONDS = 0.002  # fine enough to time a pull of a few milliseconds
PEER_WAIT_S = 120.0  # for the other worker's start-up (imports, the device) and its calls


RAILS = "rails"  # the producer's message: the pid whose network namespace has the rails


class NoRails(RuntimeError):
    """No namespace with data-plane NICs can be made here (the reason)."""


def pull_library(iut: Adapter) -> PullLibrary | None:
    return iut.library if isinstance(iut.library, PullLibrary) else None


def no_pulls(iut: Adapter) -> Outcome:
    return Outcome(SKIP, f"{iut.name}'s managers do not pull from one another (its library has no "
                   "probes.iut.protocol.PullLibrary)")


def uuid_of(case: Case, n: int = 0) -> int:
    """A request's uuid: under 2**50, as a serving stack makes them."""
    return (case.seed * 7919 + n * 104729 + 12345) % 2**50


def pull_bytes(layer_keys, blocks: int) -> int:
    """The bytes a pull of `blocks` blocks moves over layers of `layer_keys`, every part."""
    return blocks * sum(int(np.prod(k.dims[1:])) * kvref.element_type(k.dtype).numpy.itemsize for k in layer_keys)


@dataclass
class Side:
    """One worker of a pull probe: its rendezvous, library, caches and manager."""

    case: Case
    iut: Adapter
    lib: PullLibrary
    key: kvref.ShapeKey = SUBJECT
    keys: tuple[kvref.ShapeKey, ...] = ()  # per layer; () = LAYERS layers of `key`
    sharding: kvref.Sharding | None = None  # each cache split over a mesh of the arrays' devices
    caches: list = field(default_factory=list)
    manager: object = None
    copy: int = 0  # which of the worker's managers: each has caches of its own contents

    def another(self) -> "Side":
        """The worker's next manager, over caches of other contents (a probe of
        more than two managers runs several in one worker)."""
        return Side(self.case, self.iut, self.lib, self.key, self.keys, self.sharding, copy=self.copy + 1)

    @property
    def rendezvous(self) -> Rendezvous:
        return Rendezvous(self.case.rendezvous, self.case.role)

    @property
    def producer(self) -> bool:
        return self.case.role == PRODUCER

    @property
    def layer_keys(self) -> tuple[kvref.ShapeKey, ...]:
        return self.keys or (self.key,) * LAYERS

    @property
    def seed(self) -> int:
        return self.seed_of(self.producer, self.copy)

    @staticmethod
    def seed_of(producer: bool, copy: int = 0) -> int:
        """The first layer's seed of a producer's or a consumer's manager `copy`."""
        return (PRODUCER_SEED if producer else CONSUMER_SEED) + COPY_SEEDS * copy

    def build(self, listen: bool | None = None, timeout_s: float = PULL_TIMEOUT_S, form: str = "slots",
              max_blocks: int | None = None, sub_managers: int = 1):
        """Caches (layer i: random_host(key, seed + i)) and a manager over them;
        the producer listens, the consumer does not, unless `listen` says."""
        if sub_managers > 1 and getattr(self.lib, "NEEDS_INTERFACES", False):
            self._share_rails(sub_managers)
        self.make_caches()
        listen = self.producer if listen is None else listen
        blocks = max_blocks or self.layer_keys[0].dims[0]
        self.manager = self.lib.pull_manager(self.caches, form, listen, timeout_s, blocks, sub_managers)
        return self.manager

    def _share_rails(self, rails: int) -> None:
        """Both workers into one network namespace with `rails` data-plane
        NICs, before either makes a socket: the producer makes it, the
        consumer joins it. NoRails where none can be made here."""
        reason = cannot_make_interfaces()
        if reason:
            raise NoRails(reason)
        if self.producer:
            enter_rails_namespace(rails)
            self.rendezvous.post(RAILS, os.getpid())
        else:
            join_namespace(self.rendezvous.wait(RAILS, PEER_WAIT_S))

    def make_caches(self) -> list:
        """Layer i: random_host(its key, seed + i), on one device or split as `sharding` says."""
        if self.sharding is None:
            self.caches = [self.iut.make_cache(k, self.seed + i)[0] for i, k in enumerate(self.layer_keys)]
        else:
            self.caches = [self.iut.sharded_arrays().make_sharded_caches(k, self.sharding, [self.seed + i])[0][0]
                           for i, k in enumerate(self.layer_keys)]
        return self.caches

    def pull_bytes(self, blocks: int) -> int:
        return pull_bytes(self.layer_keys, blocks)

    def contents(self, layer: int) -> np.ndarray:
        """A layer's cache as it is now (of a sharded one, assembled from every device's part)."""
        cache = self.caches[layer]
        if self.sharding is None:
            return self.iut.fetch(cache)
        whole = np.empty(self.layer_keys[layer].dims, self.expected(layer, self.seed).dtype)
        for index, part in self.iut.sharded_arrays().fetch_shards(cache):
            whole[index] = part
        return whole

    def drop(self) -> None:
        """Close the manager (the probe goes on)."""
        if self.manager is not None:
            self.lib.close_manager(self.manager)
            self.manager = None

    def close(self) -> None:
        """Close the manager, and tell the other side this one is done."""
        try:
            self.drop()
        finally:
            self.rendezvous.post(DONE)

    def expected(self, layer: int, seed: int) -> np.ndarray:
        return random_host(self.layer_keys[layer], seed + layer)

    @property
    def other_seed(self) -> int:
        return self.seed_of(not self.producer)

    def check_blocks(self, pairs: list[tuple[int, int]], from_copy: int = 0) -> str:
        """"" when each local block of `pairs` (remote, local) holds the other
        side's remote block (of its manager `from_copy`) in every layer and
        every other local block still holds its own contents; else what differs."""
        seed = self.seed_of(not self.producer, from_copy)
        return self.check_landed({local: (seed, remote) for remote, local in pairs})

    def check_landed(self, landed: dict[int, tuple[int, int]]) -> str:
        """"" when each local block of `landed` {local: (the seed of the
        caches it came from, their block)} holds that block in every layer and
        every other local block still holds its own contents; else what differs."""
        for layer, cache in enumerate(self.caches):
            got = _rows(self.contents(layer))
            sources = {seed: _rows(self.expected(layer, seed)) for seed, _ in landed.values()}
            ours = _rows(self.expected(layer, self.seed))
            for block in range(got.shape[0]):
                seed, remote = landed.get(block, (None, None))
                want = ours[block] if seed is None else sources[seed][remote]
                if not np.array_equal(got[block], want):
                    source = "its own bytes" if seed is None else f"block {remote} of the caches it came from " \
                        f"(seed {seed})"
                    return f"layer {layer} block {block} does not hold {source}"
        return ""

    def unchanged(self) -> str:
        """"" when every block still holds this side's own contents."""
        return self.check_blocks([])


def _rows(host: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(host).view(np.uint8).reshape(host.shape[0], -1)


@dataclass
class Settled:
    """What poll_stats said about some requests while they were polled."""

    done: dict[str, float] = field(default_factory=dict)  # request -> seconds after the start it was reported
    failed: dict[str, float] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)
    twice: list[str] = field(default_factory=list)  # reported more than once, or in two lists

    def state(self, req: str) -> str:
        return "done" if req in self.done else "failed" if req in self.failed else "unsettled"


def poll(manager, started: float, until, seconds: float, settled: Settled | None = None) -> Settled:
    """Poll `manager` until `until(settled)` holds or `seconds` pass, then a
    few times more to see nothing is reported again."""
    settled = settled or Settled()
    deadline = time.monotonic() + seconds
    extra = REPEAT_POLLS
    while extra:
        sending, receiving, failing = manager.poll_stats()
        now = time.monotonic() - started
        for where, reported in ((settled.sent, sending), (settled.done, receiving), (settled.failed, failing)):
            for req in reported:
                if req in where or (where is not settled.sent and (req in settled.done or req in settled.failed)):
                    settled.twice.append(req)
                where.setdefault(req, now)
        if until(settled) or time.monotonic() > deadline:
            extra -= 1
        time.sleep(POLL_SECONDS)
    return settled


def plain_copy_gbps(nbytes: int, repeats: int = 3) -> float:
    """GB/s of np.copyto of `nbytes` on this host, the best of `repeats`: the
    baseline a pull of as many bytes is reported against."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms the pages
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def endpoint_for(endpoints: list[dict]):
    """What a serving stack passes to start_read: one endpoint's 'host:port',
    or every sub-manager's descriptor."""
    return endpoints[0]["endpoint"] if len(endpoints) == 1 else endpoints
