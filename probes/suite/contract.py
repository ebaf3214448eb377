"""The contract of a KV-cache manager's offload calls, as one executable
model: what a correct manager must do, must refuse, or may choose, for
every call a serving stack makes, and what it must hold afterwards.

State: every device block and host block as bytes (None: not known, as
after a copy that failed part-way), the host chunks saves have locked,
saves that failed, transfers not yet awaited, blocks whose copies the
device fails, whether a step gave up a cache's storage, and the store
of saved blocks (probes.suite.store_model).

Effects apply in program order: a call's effect is what every later call
and every later step sees, awaited or not (a load not awaited before the
next step, a save issued while the step before it still computes). Only
a host block a transfer still in flight writes is not compared: reading
it is no call of the contract.

Judgments (`Must`): DO, a correct manager carries the call out exactly;
REFUSE, it refuses cleanly (its own refusal) and changes nothing; EITHER,
it may do either (said once, here, with the reason); FAIL, the call
touches a block whose copies fail, so it must report the failure (a
refusal, or a wait that raises) and never report it done; MAY_FAIL, a
transfer in flight when a block it touches began to fail may land or
fail (either way said, and a failure leaves its destinations unknown),
and so may one that reads what such a transfer still writes (a d2h or
save of device blocks a load that may fail writes lands unknown: the
load may have ended, failed, before it was issued)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from probes.suite.block_model import BlockModel
from probes.suite.store_model import StoreModel


class Must(StrEnum):
    DO = "do"
    REFUSE = "refuse"
    EITHER = "either"
    FAIL = "fail"
    MAY_FAIL = "may fail"  # in flight when a block it touches began to fail: it lands, or it fails


@dataclass(frozen=True)
class Judgment:
    must: Must
    why: str = ""


@dataclass
class Save:
    """What d2h_auto_allocate handed back: its blocks, the chunks locked for
    them, and whether its copy failed or it was unlocked."""

    blocks: list[int]
    chunks: list[int]
    pending: object = None  # the IUT's Pending, until awaited
    failed: bool = False
    unlocked: bool = False


@dataclass
class ContractModel:
    blocks: BlockModel
    store: StoreModel | None = None
    locked: dict[int, int] = field(default_factory=dict)  # chunk -> the step that locked it
    saves: dict[int, Save] = field(default_factory=dict)  # step -> its save
    failing: dict[int, set[int]] = field(default_factory=dict)  # layer -> its blocks whose copies fail
    storage_moved: bool = False  # a step gave a cache's storage up: transfers may be refused
    in_flight: dict[int, set[int]] = field(default_factory=dict)  # step -> host blocks it still writes
    reading: dict[int, set[int]] = field(default_factory=dict)  # step -> host blocks a load in flight reads
    touched: set[int] = field(default_factory=set)  # host blocks written since they were last compared

    @property
    def host_blocks(self) -> int:
        return self.blocks.host_blocks

    @property
    def rows(self) -> int:
        return self.blocks.rows

    @property
    def free_chunks(self) -> int:
        return self.host_blocks - len(self.locked)

    def unsettled_host(self) -> set[int]:
        return set().union(*self.in_flight.values()) if self.in_flight else set()

    # --- judgments -------------------------------------------------------

    def judge_transfer(self, d2h: bool, src, dst, sizes) -> Judgment:
        if is_empty(src, dst, sizes):
            return Judgment(Must.EITHER, "a request of no blocks: refused, nothing moved, or (the wrapper's API) "
                                         "the whole cache copied, so what it may have written is not known")
        problem = self.blocks.problem(d2h, src, dst, sizes)
        if problem is not None:
            return Judgment(Must.REFUSE, problem)
        device, host = (src, dst) if d2h else (dst, src)
        spans = _spans(device, sizes)
        if self.failing_blocks() & spans:
            return Judgment(Must.FAIL, f"device blocks {sorted(self.failing_blocks() & spans)} fail every copy")
        host_spans = _spans(host, sizes)
        if not d2h and {self.locked[c] for c in host_spans if c in self.locked} & self.failed_saves():
            return Judgment(Must.REFUSE, "a load from chunks whose save failed")
        if d2h and host_spans & set(self.locked):
            return Judgment(Must.EITHER, "a plain d2h into a locked chunk: refused, or it overwrites exactly it")
        if self.storage_moved:
            return Judgment(Must.EITHER, "a step gave a cache's storage up: refused by name, or moved exactly")
        if not d2h and any(self.blocks.host[0][c] is None for c in host_spans):
            return Judgment(Must.EITHER, "a load from host blocks never written: refused, or its blocks unknown")
        return Judgment(Must.DO)

    def judge_save(self, blocks, sizes) -> Judgment:
        problem = _save_problem(blocks, sizes, self.rows)
        if problem is not None:
            return Judgment(Must.REFUSE, problem)
        wanted = len(_runs(blocks, sizes))
        if wanted > self.free_chunks:
            return Judgment(Must.REFUSE, f"{wanted} chunks asked, {self.free_chunks} free")
        if self.failing_blocks() & _spans(blocks, sizes):
            return Judgment(Must.FAIL, f"device blocks {sorted(self.failing_blocks() & _spans(blocks, sizes))} fail")
        busy = (self.unsettled_host() | set().union(*self.reading.values())) - set(self.locked)
        if wanted > self.free_chunks - len(busy):
            return Judgment(Must.EITHER, f"{len(busy)} of the free chunks are in use by copies in flight: "
                                         "refused, or saved once they are done")
        if not blocks:
            return Judgment(Must.EITHER, "a save of no blocks: refused, or no chunks")
        if self.storage_moved:
            return Judgment(Must.EITHER, "a step gave a cache's storage up: refused by name, or saved exactly")
        return Judgment(Must.DO)

    def judge_unlock(self, chunks: list[int]) -> Judgment:
        if len(set(chunks)) != len(chunks):
            return Judgment(Must.REFUSE, "an id named twice")
        loose = [c for c in chunks if c not in self.locked]
        if loose:
            return Judgment(Must.REFUSE, f"chunk {loose[0]} is not locked")
        if any(self.saves[self.locked[c]].pending is not None for c in chunks):
            return Judgment(Must.EITHER, "its save is still in flight: refused, or unlocked once it lands")
        return Judgment(Must.DO)

    def failing_blocks(self) -> set[int]:
        """Blocks whose copies fail in some layer (a transfer moves every layer's)."""
        return set().union(*self.failing.values()) if self.failing else set()

    def failed_saves(self) -> set[int]:
        return {step for step, save in self.saves.items() if save.failed}

    # --- effects ---------------------------------------------------------

    def transfer(self, step: int, d2h: bool, src, dst, sizes, awaited: bool, failed: bool = False) -> None:
        """A transfer carried out (or failed part-way: its destinations unknown)."""
        if is_empty(src, dst, sizes):
            whole = list(range(min(self.rows, self.host_blocks) if d2h else self.rows))
            self.forget(d2h, whole, None)
            return
        if failed:
            self.forget(d2h, dst, sizes)
            return
        self.blocks.apply(d2h, src, dst, sizes)
        if d2h:
            self.touched |= _spans(dst, sizes)
        if not awaited:
            (self.in_flight if d2h else self.reading)[step] = _spans(dst if d2h else src, sizes)

    def forget(self, d2h: bool, dst, sizes) -> None:
        targets = self.blocks.host if d2h else self.blocks.device
        for layer in targets:
            for block in _spans(dst, sizes):
                layer[block] = None

    def saved(self, step: int, blocks, sizes, chunks: list[int], pending, awaited: bool,
              doubtful: set[int] = frozenset()) -> None:
        sources = _runs(blocks, sizes)
        self.blocks.apply(True, sources, chunks, None)
        self.forget_copies(sources, chunks, None, doubtful)
        self.touched |= set(chunks)
        for c in chunks:
            self.locked[c] = step
        self.saves[step] = Save(list(blocks), list(chunks), None if awaited else pending)
        if not awaited:
            self.in_flight[step] = set(chunks)

    def forget_copies(self, src, dst, sizes, doubtful: set[int]) -> None:
        """The host blocks a d2h copied from device blocks a load in flight
        may fail to write: not known. The manager orders the d2h after the
        load, but a load that ended (failed) before the d2h was issued is no
        longer in flight: the d2h then copies what the failed load left."""
        sizes = [1] * len(src) if sizes is None else sizes
        unknown = [d + k for s, d, n in zip(src, dst, sizes) for k in range(n) if s + k in doubtful]
        self.forget(True, unknown, None)

    def received(self, step: int, chunks: list[int], contents: list[list[bytes | None]]) -> None:
        """A peer's host blocks landed in `chunks`, locked (contents: per layer, per chunk)."""
        for layer, blocks in zip(self.blocks.host, contents):
            for c, data in zip(chunks, blocks):
                layer[c] = data
        for c in chunks:
            self.locked[c] = step
        self.saves[step] = Save([], list(chunks))

    def save_failed(self, step: int) -> None:
        save = self.saves[step]
        save.failed, save.pending = True, None
        self.in_flight.pop(step, None)
        self.forget(True, save.chunks, None)

    def settled(self, step: int) -> None:
        self.in_flight.pop(step, None)
        self.reading.pop(step, None)
        if step in self.saves:
            self.saves[step].pending = None

    def unlocked(self, chunks: list[int]) -> None:
        steps = {self.locked[c] for c in chunks}
        for c in chunks:
            if self.saves[self.locked.pop(c)].failed:
                self.forget(True, [c], None)
        for step in steps:
            save = self.saves[step]
            save.unlocked = not any(self.locked.get(c) == step for c in save.chunks)

    def rebuilt(self) -> None:
        """A new manager over the same caches: a new pool, nothing locked."""
        self.blocks.host = [[None] * self.host_blocks for _ in self.blocks.device]
        self.locked.clear()
        self.saves.clear()
        self.in_flight.clear()
        self.reading.clear()
        self.storage_moved = False

    def stepped(self, layer: int, blocks: list[bytes], moved: bool) -> None:
        self.blocks.device[layer] = list(blocks)
        self.storage_moved |= moved
        if moved:  # the failing copies were the old storage's
            self.failing.pop(layer, None)


def is_empty(src, dst, sizes) -> bool:
    return isinstance(src, list) and isinstance(dst, list) and not src and not dst and not sizes


def requested(starts, sizes) -> int:
    """The blocks a request of runs asks to move, each run counted in full."""
    return len(starts) if sizes is None else sum(max(0, n) for n in sizes)


def device_side(d2h: bool, src, dst, sizes) -> set[int]:
    """The device blocks a transfer reads or writes."""
    return _spans(src if d2h else dst, sizes)


def host_side(d2h: bool, src, dst, sizes) -> set[int]:
    """The host blocks a transfer reads or writes."""
    return _spans(dst if d2h else src, sizes)


def _spans(starts, sizes) -> set[int]:
    sizes = [1] * len(starts) if sizes is None else sizes
    return {s + k for s, n in zip(starts, sizes) for k in range(max(0, n))}


def _runs(blocks, sizes) -> list[int]:
    """A save's device blocks one by one, in the order its chunks follow."""
    sizes = [1] * len(blocks) if sizes is None else sizes
    return [b + k for b, n in zip(blocks, sizes) for k in range(n)]


def _save_problem(blocks, sizes, rows: int) -> str | None:
    sizes = [1] * len(blocks) if sizes is None else sizes
    if len(sizes) != len(blocks):
        return "blocks and copy sizes of different lengths"
    for b, n in zip(blocks, sizes):
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (b, n)):
            return f"({b!r}, {n!r}) is not a pair of block numbers"
        if n < 1 or b < 0 or b + n > rows:
            return f"run ({b}, {n}) outside the cache's {rows} blocks"
    return None
