"""An implementation under test: a declared pair of Arrays and Library (see
probes.iut.protocol), and the Adapter the probes call, which hands each call
to the half that owns it."""

from __future__ import annotations

from dataclasses import dataclass

import kvref
from probes.iut.protocol import PROTOCOL_VERSION, Arrays, CacheMode, Library, ShardedArrays


STARTUP_SECONDS = 60.0  # a worker's start-up: imports, the device runtime, the adapter's checks


@dataclass(frozen=True)
class IUT:
    """An implementation under test, as a team declares it (probes.iut.registry
    says how kvprobe finds it)."""

    name: str
    arrays: type[Arrays]
    library: type[Library]
    targets: tuple[str, ...]  # the --generation values it runs on
    # "main" (kvprobe's own), a peer environment's name, a path to a Python, or a
    # PeerEnv the harness builds (probes.iut.peer_env)
    interpreter: object = "main"
    jax_platforms: str | None = "cpu"  # JAX_PLATFORMS for its workers; None: leave as is
    owns_device: bool = False  # a worker holds a real TPU: cases run one at a time
    startup_seconds: float = STARTUP_SECONDS  # a worker's start-up limit (a cold TPU runtime takes minutes)
    preload: tuple[str, ...] = ()  # modules a warm parent imports once for its workers; never a device
    environment: tuple[tuple[str, str], ...] = ()  # variables its workers run with
    any_tpu_type: bool = False  # also runs on TPU types beyond the shipped ones (v2:2x2, a new chip)
    build: str | None = None  # a build of its library other than the pinned one (probes.iut.builds)
    loopback_only: bool = False  # its workers run in a network namespace of their own with only lo
    protocol: int = PROTOCOL_VERSION  # the version of probes.iut.protocol it was written for
    # (probe or probe/kind, why it does not apply): cases this IUT cannot exercise, never run for it
    not_applicable: tuple[tuple[str, str], ...] = ()
    # (dtype, why): caches of these element types are never made for it (no shape probe runs on them)
    unheld_dtypes: tuple[tuple[str, str], ...] = ()

    def applies(self, probe: str, kind: str = "") -> bool:
        declared = dict(self.not_applicable)
        return probe not in declared and f"{probe}/{kind}" not in declared

    @property
    def shards(self) -> bool:
        """Whether its arrays can split a cache over several devices."""
        return issubclass(self.arrays, ShardedArrays)

    def layout_of(self, generation: str, key: kvref.ShapeKey,
                  sharding: kvref.Sharding | None = None) -> tuple[kvref.Shape, str]:
        """The layout its device gives an array of `key` (with a sharding, one
        device's shard of it), and where that answer came from."""
        if sharding is None:
            return self.arrays.layout_of(generation, key)
        if not self.shards:
            raise ValueError(f"{self.name}'s arrays make every cache on one device; {sharding} needs "
                             "arrays that provide probes.iut.protocol.ShardedArrays")
        return self.arrays.sharded_layout_of(generation, key, sharding)

    def holds(self, dtype: str) -> bool:
        """Whether caches of this element type are made for it."""
        return dtype not in dict(self.unheld_dtypes)

    def check_target(self, generation: str) -> None:
        if generation in self.targets:
            return
        if self.any_tpu_type and generation != "cpu" and not kvref.generations.is_shipped(generation):
            kvref.generations.check_generation(generation)
            return
        also = " or any TPU type the installed libtpu compiles for" if self.any_tpu_type else ""
        raise ValueError(f"{self.name} runs on {', '.join(self.targets)}{also}, not {generation!r}")

    def runs_on(self, generation: str) -> bool:
        try:
            self.check_target(generation)
        except ValueError:
            return False
        return True

    def check_faults(self, faults: kvref.Faults) -> None:
        if faults and not self.library.supports_faults:
            raise ValueError(f"{self.name} has no fault models; --faults {faults} switches on "
                             "kvref's old bugs, for the kvref IUTs only")


class Adapter:
    """What a probe holds: one IUT on one generation, with the fault models
    the reference should switch on."""

    def __init__(self, iut: IUT, generation: str, faults: kvref.Faults = kvref.Faults(),
                 options: dict | None = None):
        self.iut, self.generation, self.faults, self.options = iut, generation, faults, options
        self.arrays = iut.arrays(generation)
        self.library = iut.library(faults, options)
        self._layouts: dict[kvref.ShapeKey, kvref.Shape] = {}  # a shape's layout on this device does not change

    def fresh(self) -> "Adapter":
        """This IUT made again, arrays and library: for a forked child, whose
        parent's device and executors run in the parent only."""
        return Adapter(self.iut, self.generation, self.faults, self.options)

    @property
    def name(self) -> str:
        return self.iut.name

    @property
    def backend(self) -> str:
        return self.arrays.backend

    @property
    def version(self) -> str:
        return self.library.version

    @property
    def device_kind(self) -> str:
        return self.arrays.device_kind

    def sharded_arrays(self) -> ShardedArrays | None:
        """The arrays, where they can split a cache over several devices."""
        return self.arrays if self.iut.shards else None

    def skip_reason(self) -> str | None:
        """Every reason this IUT cannot run here (library and arrays), or None."""
        reasons = [r for r in (self.library.skip_reason(), self.arrays.skip_reason()) if r]
        return "; ".join(reasons) or None

    def layout(self, key: kvref.ShapeKey) -> kvref.Shape:
        if key not in self._layouts:
            self._layouts[key] = self.iut.layout_of(self.generation, key)[0]
        return self._layouts[key]

    def make_caches(self, key: kvref.ShapeKey, seeds, mode: CacheMode | str = CacheMode.PUT, finite: bool = False):
        if mode not in tuple(CacheMode):
            raise ValueError(f"cache mode {mode!r}; expected one of {', '.join(CacheMode)}")
        return self.arrays.make_caches(key, list(seeds), CacheMode(mode), finite)

    def make_cache(self, key: kvref.ShapeKey, seed: int, mode: CacheMode | str = CacheMode.PUT,
                   finite: bool = False):
        return self.make_caches(key, [seed], mode, finite)[0]

    def fetch(self, cache):
        return self.arrays.fetch(cache)

    def scramble(self, cache) -> None:
        self.arrays.scramble(cache)

    def is_pending(self, cache) -> bool:
        return self.arrays.is_pending(cache)

    def serving_step(self, cache, new):
        return self.arrays.serving_step(cache, new)

    def dispatch_step(self, cache, new):
        return self.arrays.dispatch_step(cache, new)

    def read_by_step(self, cache):
        return self.arrays.read_by_step(cache)

    def donating_step(self, cache, new, in_place: bool):
        return _optional(self.arrays, "donating_step", "Arrays")(cache, new, in_place)

    def update_blocks(self, cache, blocks: list[int], values):
        return _optional(self.arrays, "update_blocks", "Arrays")(cache, blocks, values)

    def kv_store(self, capacity: int):
        """A StoreView."""
        return _optional(self.library, "kv_store", "Library")(capacity)

    def hold_copies(self, cache, seconds: float, until_step: bool = False) -> bool:
        if until_step:
            return self.arrays.hold_copies(cache, seconds, until_step=True)
        return self.arrays.hold_copies(cache, seconds)

    @staticmethod
    def in_flight(pending) -> bool | None:
        """Whether a transfer is still running, asked without waiting; None
        where its future cannot say (Pending's optional done())."""
        done = getattr(pending, "done", None)
        try:
            return None if done is None else not done()
        except NotImplementedError:
            return None

    def refuses(self, e: BaseException) -> bool:
        return self.library.refuses(e)

    def manager(self, caches, host_blocks: int, **options):
        return self.library.manager(caches, host_blocks, **options)

    def transfer(self, manager, d2h: bool, src, dst, sizes=None) -> None:
        self.library.transfer(manager, d2h, src, dst, sizes)

    def start(self, manager, d2h: bool, src, dst, sizes=None):
        return self.library.start(manager, d2h, src, dst, sizes)

    def save(self, manager, src, sizes=None):
        return self.library.save(manager, src, sizes)

    def unlock(self, manager, chunk_ids) -> None:
        self.library.unlock(manager, chunk_ids)

    def d2h(self, manager, src, dst, sizes=None) -> None:
        self.transfer(manager, True, src, dst, sizes)

    def h2d(self, manager, src, dst, sizes=None) -> None:
        self.transfer(manager, False, src, dst, sizes)

    def plan_request(self, uuid: str, src_block: int, dst_block: int):
        return self.library.plan_request(uuid, src_block, dst_block)


def _optional(part, name: str, protocol: str):
    """An optional member of an IUT's Arrays or Library; NotImplementedError naming it where absent."""
    member = getattr(part, name, None)
    if member is None:
        raise NotImplementedError(f"{type(part).__name__} has no {name} (optional in probes.iut.protocol.{protocol})")
    return member
