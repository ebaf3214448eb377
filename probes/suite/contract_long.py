"""Long runs of the contract: thousands of save, load, unlock, store and
rebuild steps, every step held to the model as in any sequence, and what
the process holds judged two ways once every transfer is awaited and every
chunk unlocked:

- growth per operation: after a warm-up the run goes in phases, each
  favouring one rule, and the C heap's bytes in use (where a native
  library's allocations live; glibc's mallinfo2) are measured between them;
  over the later half they are fitted to the operations made, and a slope
  and total growth past their bounds is a leak, so a kilobyte lost per save
  shows in hundreds of saves, not after a fixed arena's slack (the model
  forgets what it no longer needs, so the harness does not grow with it);
- back to the baseline: address space, file descriptors, threads and
  shared-memory mappings within their slack of where they stood after the
  warm-up, and the whole pool saved into again.

A long run goes on past what its campaign knows (probes.suite.contract_known):
a broken rule is said on the worker's output, its pattern is not drawn
again, and the run continues on a fresh manager over fresh caches, so the
resource check it exists for runs whatever the library's other bugs."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
from collections import deque
from dataclasses import dataclass

import numpy as np

from probes.suite import contract_rules as rules
from probes.suite.contract_draws import Parts, draw_step
from probes.suite.contract_known import Known, Pattern, key_of, say_found, signature
from probes.suite.contract_rules import Broken, Session, Stop
from probes.suite.host_budget import address_space_bytes
from probes.suite.verdicts import ERROR

# The rules a serving engine repeats for hours; model steps and faults stay in the short sequences.
CYCLE_RULES = ("transfer", "save", "wait", "load", "unlock", "fill", "rebuild", "store_call", "check")
WARM_UP = 0.1  # of the steps, before the baseline is taken
PHASE_STEPS = 50  # steps between two measures, each phase favouring one rule
# What may differ from the baseline without being a leak: an allocator's arena, a lazily started thread.
SLACK = {"address space": 96 << 20, "file descriptors": 2, "threads": 2, "shared-memory mappings": 0}
# A leak where the heap's fitted slope, and what it adds up to over the later half of the run, both pass these
# bounds (measured on kvref-sim, 6,000 steps, 3 seeds: 9-24 bytes per operation and 22-54 KiB correct; a kilobyte
# lost per save, 177-201 bytes per operation and about 500 KiB).
PER_OPERATION = 64.0  # bytes
AT_LEAST = 192 << 10  # bytes
# A kind's own slope counts where it is this many standard errors clear of none and adds up to this much: on
# kvref-sim (6,000 steps, 8 seeds) a correct manager's largest was 3.6 standard errors and 257 KiB; a kilobyte
# lost per save, 6.7-7.1 standard errors and about 500 KiB in two seeds of four (the total's fit finds all four).
SURE = 5.0
KIND_AT_LEAST = 384 << 10  # bytes
KEPT_STEPS = 200  # the last steps of a long run its finding keeps
MOST_RESTARTS = 50  # fresh managers a long run starts past broken rules, at most
# Pools of 16 MiB: a leak of one per rebuilt manager passes the slack within tens of rebuilds.
LONG_SPEC = {"shape": "bf16[128,8,1024]", "layers": 2, "host_blocks": 512, "mode": "put"}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2():
    """glibc's mallinfo2, loaded once; None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc.mallinfo2


def _heap_in_use() -> int:
    """Bytes malloc has handed out and not had back, in every arena and mapped chunk; 0 without mallinfo2."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return 0
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


@dataclass(frozen=True)
class Held:
    """What this process holds now."""

    address_space: int
    file_descriptors: int
    threads: int
    shm_mappings: int
    heap_bytes: int = 0  # what the C heap has handed out (the library's native allocations among them)

    @classmethod
    def now(cls) -> "Held":
        gc.collect()
        with open("/proc/self/maps") as maps:
            shm = sum(1 for line in maps if "/dev/shm/" in line)
        return cls(address_space_bytes(), len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task")), shm,
                   _heap_in_use())

    def grown_from(self, baseline: "Held") -> list[str]:
        grown = []
        for name, now, then in (("address space", self.address_space, baseline.address_space),
                                ("file descriptors", self.file_descriptors, baseline.file_descriptors),
                                ("threads", self.threads, baseline.threads),
                                ("shared-memory mappings", self.shm_mappings, baseline.shm_mappings)):
            if now - then > SLACK[name]:
                unit = f" ({(now - then) >> 20} MiB)" if name == "address space" else ""
                grown.append(f"{name} {then} -> {now}{unit}")
        return grown


def leaks(samples: list[tuple[dict[str, int], Held]]) -> list[str]:
    """The heap in use, fitted (least squares) to the operations made, over the
    later half of the run (the allocator settles during the first): a leak
    where its slope and what the slope adds up to both pass their bounds;
    then fitted to each kind of operation at once (the phases favour one rule
    each, so the kinds' counts vary apart), so a leak in a rare kind is not
    averaged away by the common ones."""
    later = samples[len(samples) // 2:]
    if len(later) < 6:
        return []
    made = np.array([float(sum(counts.values())) for counts, _ in later])
    heap = np.array([float(held.heap_bytes) for _, held in later])
    slope = float(np.polyfit(made, heap, 1)[0])
    total = made[-1] - made[0]
    kinds = {kind: n - later[0][0].get(kind, 0) for kind, n in sorted(later[-1][0].items())}
    if slope > PER_OPERATION and slope * total > AT_LEAST:
        return [f"the heap in use grows by {slope:,.0f} bytes per operation ({slope * total:,.0f} over the later "
                f"half's {int(total)}: " + ", ".join(f"{kind} {n}" for kind, n in kinds.items() if n) + ")"]
    return [f"the heap in use grows by {rate:,.0f} bytes per {kind} ({rate * kinds[kind]:,.0f} over the later half's "
            f"{kinds[kind]} of them, {rate / error:.0f} standard errors from none)"
            for kind, (rate, error) in per_kind(later, [k for k, n in kinds.items() if n]).items()
            if rate > PER_OPERATION and rate * kinds[kind] > KIND_AT_LEAST and rate > SURE * error]


def per_kind(later: list[tuple[dict[str, int], Held]], kinds: list[str]) -> dict[str, tuple[float, float]]:
    """Each kind's bytes per operation and its standard error, fitted to
    every kind at once on what each phase added (the heap's changes phase by
    phase against each kind's operations in it: a heap's drift is a walk, so
    its levels are not independent, its steps nearly are); nothing where the
    phases cannot tell the kinds apart."""
    counts = np.diff(np.array([[float(c.get(kind, 0)) for kind in kinds] for c, _ in later]), axis=0)
    heap = np.diff(np.array([float(held.heap_bytes) for _, held in later]))
    freedom = len(heap) - len(kinds)
    if not kinds or freedom < 3 or np.linalg.matrix_rank(counts) < len(kinds):
        return {}
    fit, *_ = np.linalg.lstsq(counts, heap, rcond=None)
    spread = float(np.sum((counts @ fit - heap) ** 2)) / freedom
    errors = np.sqrt(np.maximum(np.diag(spread * np.linalg.inv(counts.T @ counts)), 1e-9))
    return {kind: (float(fit[i]), float(errors[i])) for i, kind in enumerate(kinds)}


def long_run(iut, sequence: dict, parts: Parts, rng, steps: int,
             known: Known | None = None) -> list[tuple[int, Broken]]:
    """`steps` cycle steps drawn (the last KEPT_STEPS kept in `sequence`): every rule broken on the way
    (each also said on the worker's output, the run going on past it), then
    a resource that grew with a rule's operations or did not come back, each as (step, Broken)."""
    known = known if known is not None else Known()
    spec, found, restarts = sequence["spec"], [], 0
    kept = deque(maxlen=KEPT_STEPS)  # the run's last steps, for its finding (keeping all would grow with the run)
    session = Session(iut, spec, sequence["seed"])
    baseline, counts, samples, drawn = None, {}, [], deque(maxlen=8)
    warm = int(steps * WARM_UP)
    try:
        for index in range(steps):
            if index >= warm and (index - warm) % PHASE_STEPS == 0:
                _settle(session, index)
                held = Held.now()
                baseline = baseline or held
                samples.append((dict(counts), held))
                phase = (index - warm) // PHASE_STEPS
                session.spec = {**session.spec, "favour": CYCLE_RULES[phase % len(CYCLE_RULES)]}
            step = known.draw(lambda only: draw_step(rng, session, parts, only=only or CYCLE_RULES), spec["mode"],
                              list(drawn), CYCLE_RULES, lambda rule: rule)
            if step is None:
                continue
            kept.append(step)
            drawn.append(signature(step))
            try:
                rules.RULES[step["rule"]](session, index, step)  # no pulls in CYCLE_RULES
                rules.check_host(session)
                rules.check_exports(session)
            except (Broken, Stop) as e:
                if isinstance(e, Broken):
                    _broke(found, known, index, e, {"spec": spec, "steps": list(kept)[-1:]})
                restarts += 1
                session.close()
                if restarts > MOST_RESTARTS:
                    return found
                session = Session(iut, {**spec, "favour": session.spec.get("favour", "")}, sequence["seed"] + index)
                continue
            counts[step["rule"]] = counts.get(step["rule"], 0) + 1
        _settle(session, steps)
        held = Held.now()
        samples.append((dict(counts), held))
    except Broken as e:  # settling broke a rule: the measures after it are not the library's alone
        return found + [(index, Broken(e.verdict, e.detail))]
    finally:
        session.close()
        sequence["steps"] = list(kept)
    past = steps - warm
    grown = held.grown_from(baseline) if baseline else []
    if grown:
        found.append((steps, Broken(ERROR, f"after {past} steps past the warm-up, with every transfer awaited and "
                                           f"every chunk unlocked, not back to the baseline: {'; '.join(grown)}")))
    growing = leaks(samples)
    if growing:
        found.append((steps, Broken(ERROR, f"over {past} steps in {len(samples) - 1} phases, each favouring one "
                                           f"rule, with every transfer awaited and every chunk unlocked between "
                                           f"them, what the process holds grows with its operations: "
                                           f"{'; '.join(growing)}")))
    return found


def _broke(found: list, known: Known, index: int, broken: Broken, tail: dict) -> None:
    """A rule broken in a long run: said on the output once per place it arises,
    and its step (`tail`'s last: a long run is not shrunk) not drawn again."""
    key = key_of(broken.verdict, broken.detail, tail, None)
    pattern = Pattern.of(tail)
    if known.add(key, pattern):
        found.append((index, Broken(broken.verdict, broken.detail)))  # not its traceback: its frames hold managers
        say_found(broken.verdict, f"long run, step {index}: {broken.detail}", tail, key, pattern)


def _settle(session: Session, index: int) -> None:
    """Every transfer awaited and every chunk unlocked; then the whole pool saved into and unlocked again."""
    for pending in sorted(session.judgments):
        rules.wait(session, index, {"of": pending})
    for step, save in list(session.model.saves.items()):
        if not save.unlocked and save.chunks:
            rules.unlock(session, index, {"of": step})
    free = session.model.free_chunks
    rules.fill(session, index, {"seed": index, "extra": 0})
    taken = [k for k, s in session.model.saves.items() if not s.unlocked and len(s.chunks) == free]
    for step in taken:
        rules.unlock(session, index, {"of": step})
    # The model forgets the saves unlocked by now (it grows with none of them; what it judges of a second
    # unlock is drawn of later saves), so what the process holds grows with the library alone.
    for step in [k for k, s in session.model.saves.items() if s.unlocked and not s.failed]:
        del session.model.saves[step]
