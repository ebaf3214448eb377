"""Long runs of the contract: thousands of save, load, unlock, store and
rebuild steps in one sequence, every step held to the model as in any
sequence, and then what the process holds brought back to where it stood
after a warm-up: free chunks (every one can be saved into again), address
space, file descriptors, threads, shared-memory mappings. A slow leak
shows only here: a pool per rebuilt manager, a chunk per thousand cycles,
a thread per save."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

from probes.suite import contract_rules as rules
from probes.suite.contract_draws import Parts, draw_step
from probes.suite.contract_rules import Broken, Session, Stop
from probes.suite.host_budget import address_space_bytes
from probes.suite.verdicts import ERROR

# The rules a serving engine repeats for hours; model steps and faults stay in the short sequences.
CYCLE_RULES = ("transfer", "save", "wait", "load", "unlock", "fill", "rebuild", "store_call", "check")
WARM_UP = 0.1  # of the steps, before the baseline is taken
# What may differ from the baseline without being a leak: an allocator's arena, a lazily started thread.
SLACK = {"address space": 96 << 20, "file descriptors": 2, "threads": 2, "shared-memory mappings": 0}
# Pools of 16 MiB: a leak of one per rebuilt manager passes the slack within tens of rebuilds.
LONG_SPEC = {"shape": "bf16[128,8,1024]", "layers": 2, "host_blocks": 512, "mode": "put"}


@dataclass(frozen=True)
class Held:
    """What this process holds now."""

    address_space: int
    file_descriptors: int
    threads: int
    shm_mappings: int

    @classmethod
    def now(cls) -> "Held":
        gc.collect()
        with open("/proc/self/maps") as maps:
            shm = sum(1 for line in maps if "/dev/shm/" in line)
        return cls(address_space_bytes(), len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task")), shm)

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


def long_run(iut, sequence: dict, parts: Parts, rng, steps: int) -> tuple[int, Broken] | None:
    """`steps` cycle steps drawn into `sequence`; the first broken rule, or a
    resource that did not come back, as (step, Broken)."""
    session = Session(iut, sequence["spec"], sequence["seed"])
    baseline, index = None, 0
    try:
        for index in range(steps):
            if index == int(steps * WARM_UP):
                _settle(session, index)
                baseline = Held.now()
            step = draw_step(rng, session, parts, only=CYCLE_RULES)
            sequence["steps"].append(step)
            rules.RULES[step["rule"]](session, index, step)  # no pulls in CYCLE_RULES
            rules.check_host(session)
        _settle(session, steps)
        held = Held.now()
    except Stop:
        return None
    except Broken as e:
        return index, e
    finally:
        session.close()
    grown = held.grown_from(baseline)
    if grown:
        return steps, Broken(ERROR, f"after {steps - int(steps * WARM_UP)} steps past the warm-up, with every "
                                    f"transfer awaited and every chunk unlocked, not back to the baseline: "
                                    f"{'; '.join(grown)}")
    return None


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
