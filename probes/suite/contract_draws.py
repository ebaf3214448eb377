"""How a contract sequence is drawn: its caches and pool from a seed, then
each step from the model's state as it stands (rules whose preconditions
hold, weighted), so that a sequence goes where calls interact: saves and
loads left in flight across model steps, chunks unlocked twice, a pool
filled to its last chunk, copies the device stalls or fails part-way, the
store evicting around pinned entries. Only the parts the IUT has are
drawn (`Parts`)."""

from __future__ import annotations

from dataclasses import dataclass

import kvref
from probes.iut.adapter import Adapter
from probes.iut.protocol import HostTransferLibrary, PullLibrary
from probes.suite.contract import Must
from probes.suite.contract_hosts import draw_host_step
from probes.suite.contract_pulls import draw_pull_step
from probes.suite.contract_restarts import draw_restart
from probes.suite.contract_rules import Session
from probes.suite.ownership import row_byte_ranges

# Small caches, so a sequence's every step can be checked byte for byte.
SHAPES = ("bf16[32,8,128]", "f32[16,4,256]", "bf16[64,2,128]", "bf16[16,16,128]", "bf16[32,4,128]",
          "f32[16,8,128]")
STEP_HOW = ("serving", "dispatch", "donate_in_place", "donate_moved")
# Shapes whose rows interleave on every TPU generation's layout: a manager over them is refused.
INTERLEAVED = ("bf16[64,256]", "s8[64,512]", "bf16[16,1024]")
# The managers beside the offload one get anywhere only by runs of their own
# steps (register, pull, register again, pull again): one drawn starts a
# burst of up to MOST_BURST more.
BURSTS, MOST_BURST = ("pulls", "hosts"), 4
HASHES = 12  # the store's hashes are drawn from this many, so inserts meet stored and pinned ones
INT64_EDGE = (-1, 2**63 - 1, -(2**63))


@dataclass(frozen=True)
class Parts:
    """Which parts of the API and the device this IUT has."""

    store: bool
    plans: bool
    donation: bool
    fail_copies: bool
    hold: bool
    deferred: bool
    interleaved: tuple[str, ...]  # shapes whose rows are not byte ranges on this device
    pulls: bool  # managers that pull from one another (probes.iut.protocol.PullLibrary)
    hosts: bool  # managers that move host blocks to one another (probes.iut.protocol.HostTransferLibrary)
    serves: bool  # serving steps that write some blocks in place (Arrays.update_blocks), run beside pulls

    @classmethod
    def of(cls, iut: Adapter) -> "Parts":
        return cls(store=hasattr(iut.library, "kv_store"), plans=iut.iut.applies("plan_binding"),
                   donation=hasattr(iut.arrays, "donating_step"), fail_copies=hasattr(iut.arrays, "fail_copies"),
                   hold=iut.backend == "sim", deferred=iut.iut.applies("deferred_construction"),
                   interleaved=tuple(shapes_of(iut, INTERLEAVED, contiguous=False)),
                   pulls=isinstance(iut.library, PullLibrary),
                   hosts=isinstance(iut.library, HostTransferLibrary), serves=hasattr(iut.arrays, "update_blocks"))


def addressable_shapes(iut: Adapter) -> list[str]:
    """The sequence shapes whose rows are byte ranges on this IUT's device."""
    return shapes_of(iut, SHAPES, contiguous=True)


def shapes_of(iut: Adapter, shapes, contiguous: bool) -> list[str]:
    return [text for text in shapes
            if row_byte_ranges(str(iut.layout(kvref.ShapeKey.parse(text)))).contiguous == contiguous]


def draw_spec(rng, shapes: list[str], parts: Parts) -> dict:
    key = kvref.ShapeKey.parse(shapes[int(rng.integers(len(shapes)))])
    rows = key.dims[0]
    spec = {"shape": str(key), "layers": int(rng.integers(1, 3)), "host_blocks": int(rng.integers(4, 2 * rows)),
            "mode": "deferred" if parts.deferred and rng.random() < 0.15 else "put",
            "store": int(rng.integers(2, 9)) if parts.store else 0}
    others = [s for s in shapes if s != str(key) and kvref.ShapeKey.parse(s).dims[0] == rows]
    if others and spec["mode"] == "put" and rng.random() < 0.3:
        spec.update(layers=2, mixed=others[int(rng.integers(len(others)))])  # a layer of another block size
    # Swarm testing: each sequence leaves some rules out and favours one, so
    # that across sequences every rule meets long runs of every other.
    optional = [r for r in DRAWS if r not in ("wait", "rebuild") and (r != "pulls" or parts.pulls)
                and (r != "hosts" or parts.hosts)]
    spec["without"] = sorted(r for r in optional if rng.random() < 0.25)
    spec["favour"] = str(rng.choice(optional)) if rng.random() < 0.5 else ""
    if parts.serves and parts.pulls:
        spec["serves"] = True  # the pull managers' caches take serving steps (contract_pulls.serve)
    return spec


def draw_step(rng, session: Session, parts: Parts, only: tuple[str, ...] = ()) -> dict:
    """The next step, from the rules whose preconditions hold (with `only`, of those rules)."""
    model = session.model
    weights = {"transfer": 5.0, "save": 4.0, "wait": 3.0 if session.judgments else 0.0,
               "load": 3.0 if _loadable(session) else 0.0, "unlock": 3.0 if model.saves else 0.5,
               "fill": 0.6, "model_step": 1.5, "rebuild": 25.0 if model.storage_moved else 0.2, "hold": 0.8 if parts.hold else 0.0,
               "fail_copies": 0.25 if parts.fail_copies and len(model.failing_blocks()) < 2 else 0.0,
               "check": 1.5, "concurrent": 0.8, "store_call": 4.0 if parts.store else 0.0,
               "plan": 1.0 if parts.plans else 0.0, "build_refused": 0.2 if parts.interleaved else 0.0,
               "pulls": 3.0 if parts.pulls else 0.0, "hosts": 2.0 if parts.hosts else 0.0}
    for rule in session.spec.get("without", ()):
        weights[rule] = 0.0
    for rule in weights if only else ():
        weights[rule] *= rule in only
    if session.spec.get("favour"):
        weights[session.spec["favour"]] *= 5
    rule, left = session.burst
    if left and weights.get(rule, 0) > 0:
        session.burst = (rule, left - 1)
    else:
        names = [n for n, w in weights.items() if w > 0]
        p = [weights[n] for n in names]
        rule = names[int(rng.choice(len(names), p=[w / sum(p) for w in p]))]
        session.burst = (rule, int(rng.integers(0, MOST_BURST + 1)) if rule in BURSTS else 0)
    return {"rule": rule, **DRAWS[rule](rng, session, parts)}


def _loadable(session: Session) -> list[int]:
    return [k for k, s in session.model.saves.items() if not s.unlocked and s.chunks]


def _transfer(rng, session: Session, parts: Parts) -> dict:
    model = session.model
    d2h = bool(rng.random() < 0.5)
    request = _valid(rng, model.rows, model.host_blocks, d2h) if rng.random() < 0.7 else \
        _invalid(rng, model.rows, model.host_blocks, d2h)
    valid = model.judge_transfer(d2h, request["src"], request["dst"], request["sizes"]).must != Must.REFUSE
    return {**request, "wait": bool(not valid or rng.random() < 0.65)}


def _valid(rng, rows: int, host_blocks: int, d2h: bool) -> dict:
    src_limit, dst_limit = (rows, host_blocks) if d2h else (host_blocks, rows)
    n = int(rng.integers(0 if rng.random() < 0.05 else 1, min(4, dst_limit) + 1))
    if n and rng.random() < 0.3:  # runs of blocks
        size = int(rng.integers(1, 3))
        starts = sorted(int(s) for s in rng.choice(max(1, dst_limit // size), min(n, dst_limit // size),
                                                   replace=False))
        dst = [s * size for s in starts]
        src = [int(rng.integers(0, src_limit - size + 1)) for _ in dst]
        return {"d2h": d2h, "src": src, "dst": dst, "sizes": [size] * len(dst)}
    return {"d2h": d2h, "src": [int(x) for x in rng.integers(0, src_limit, n)],
            "dst": [int(x) for x in rng.choice(dst_limit, n, replace=False)], "sizes": None}


def _invalid(rng, rows: int, host_blocks: int, d2h: bool) -> dict:
    src_limit, dst_limit = (rows, host_blocks) if d2h else (host_blocks, rows)
    request = _valid(rng, rows, host_blocks, d2h)
    while not request["src"]:
        request = _valid(rng, rows, host_blocks, d2h)
    kind = int(rng.integers(5))
    src, dst = request["src"], request["dst"]
    if kind == 0:
        dst[-1] = dst_limit if rng.random() < 0.5 else int(rng.choice(INT64_EDGE))
    elif kind == 1:
        src[0] = src_limit if rng.random() < 0.5 else int(rng.choice(INT64_EDGE))
    elif kind == 2:
        request["src"], request["dst"] = src + [src[0]], dst + [dst[0]]  # a destination twice
        if request["sizes"]:
            request["sizes"] = request["sizes"] + [request["sizes"][0]]
    elif kind == 3:
        request["sizes"] = [0] + [1] * (len(src) - 1)
    else:
        request["dst"] = dst[:-1] if len(dst) > 1 else dst + [0]
    return request


def _save(rng, session: Session, parts: Parts) -> dict:
    model = session.model
    free = model.free_chunks
    if rng.random() < 0.15 or free == 0:
        bad = int(rng.choice([-1, model.rows, 2**63 - 1]))
        kind = rng.random()
        blocks = [int(b) for b in rng.integers(0, model.rows, free + 1)] if kind < 0.4 else [bad] if kind < 0.7 \
            else _among([int(b) for b in rng.choice(model.rows, min(3, model.rows), replace=False)], bad, rng)
        return {"blocks": blocks, "sizes": None, "wait": True}
    n = int(rng.integers(1, min(4, free) + 1))
    blocks = [int(b) for b in rng.choice(model.rows, n, replace=False)]
    if rng.random() < 0.2 and n == 1 and free >= 2 and blocks[0] + 2 <= model.rows:
        return {"blocks": blocks, "sizes": [2], "wait": bool(rng.random() < 0.5)}
    return {"blocks": blocks, "sizes": None, "wait": bool(rng.random() < 0.5)}


def _wait(rng, session: Session, parts: Parts) -> dict:
    steps = sorted(session.judgments)
    return {"of": steps[int(rng.integers(len(steps)))]}


def _load(rng, session: Session, parts: Parts) -> dict:
    saves = _loadable(session)
    of = saves[int(rng.integers(len(saves)))]
    chunks = session.model.saves[of].chunks
    n = int(rng.integers(1, min(len(chunks), session.model.rows) + 1))
    return {"of": of, "pick": [int(i) for i in rng.choice(len(chunks), n, replace=False)],
            "dst": [int(b) for b in rng.choice(session.model.rows, n, replace=False)],
            "wait": bool(rng.random() < 0.5)}


def _unlock(rng, session: Session, parts: Parts) -> dict:
    model = session.model
    live = [k for k, s in model.saves.items() if not s.unlocked]
    if model.saves and (live or rng.random() < 0.3) and rng.random() < 0.85:
        pool = live if live and rng.random() < 0.85 else sorted(model.saves)
        return {"of": pool[int(rng.integers(len(pool)))]}
    free = [c for c in range(model.host_blocks) if c not in model.locked]
    bad = [model.host_blocks, -1] + free[:1] + ([next(iter(model.locked))] * 2 if model.locked else [])
    pick = bad[int(rng.integers(len(bad)))]
    if model.locked and not isinstance(pick, list) and rng.random() < 0.5:  # locked ones, and one not, anywhere
        return {"ids": _among(sorted(model.locked)[:3], pick, rng)}
    return {"ids": pick if isinstance(pick, list) else [pick]}


def _among(good: list[int], bad: int, rng) -> list[int]:
    """`good` with `bad` put in at a drawn place: a call refused part-way through its list."""
    at = int(rng.integers(len(good) + 1))
    return good[:at] + [bad] + good[at:]


def _fill(rng, session: Session, parts: Parts) -> dict:
    return {"seed": int(rng.integers(2**31)), "extra": int(rng.random() < 0.3)}


def _model_step(rng, session: Session, parts: Parts) -> dict:
    hows = STEP_HOW if parts.donation else STEP_HOW[:2]
    return {"layer": int(rng.integers(len(session.caches))), "how": str(rng.choice(hows)),
            "seed": int(rng.integers(2**31))}


def _rebuild(rng, session: Session, parts: Parts) -> dict:
    return {}


def _hold(rng, session: Session, parts: Parts) -> dict:
    return {"layer": int(rng.integers(len(session.caches))), "seconds": 0.3, "until_step": bool(rng.random() < 0.5)}


def _fail_copies(rng, session: Session, parts: Parts) -> dict:
    return {"layer": int(rng.integers(len(session.caches))), "block": int(rng.integers(session.model.rows))}


def _check(rng, session: Session, parts: Parts) -> dict:
    return {}


def _concurrent(rng, session: Session, parts: Parts) -> dict:
    """Two valid transfers whose blocks, on either side, do not meet."""
    model = session.model
    rows, hosts = [int(b) for b in rng.permutation(model.rows)], [int(b) for b in rng.permutation(model.host_blocks)]
    n = max(1, min(2, len(rows) // 2, len(hosts) // 2))
    both = []
    for k, d2h in enumerate((bool(rng.random() < 0.5), bool(rng.random() < 0.5))):
        device, host = rows[k * n:(k + 1) * n], hosts[k * n:(k + 1) * n]
        src, dst = (device, host) if d2h else (host, device)
        both.append({"d2h": d2h, "src": src, "dst": dst})
    return {"both": both}


def _store_call(rng, session: Session, parts: Parts) -> dict:
    """Mostly about what the store holds: pins of stored hashes, releases
    of pinned ones, inserts that meet stored and pinned entries."""
    store = session.model.store
    stored = [int.from_bytes(h, "little") for h in store.entries]
    pinned = [int.from_bytes(h, "little") for h in store.pins]
    call = str(rng.choice(("lookup", "pin", "release", "insert", "insert_bad"), p=(0.2, 0.2, 0.2, 0.35, 0.05)))
    n = int(rng.integers(1, 4))
    pool = {"pin": stored, "release": pinned if pinned and rng.random() < 0.8 else list(range(HASHES))}.get(
        call, list(range(HASHES)))
    if call in ("lookup", "insert") and stored and rng.random() < 0.6:  # stored hashes and others, mixed
        missing = [h for h in range(HASHES) if h not in stored]
        hashes = [int(h) for h in rng.choice(stored, min(len(stored), max(1, n - 1)), replace=False)]
        hashes += [int(h) for h in rng.choice(missing, min(len(missing), n - len(hashes) or 1), replace=False)]
        hashes = [int(h) for h in rng.permutation(hashes)]
    else:
        hashes = [int(h) for h in rng.choice(pool, min(n, len(pool)), replace=False)] if pool else []
    step = {"call": call, "hashes": hashes}
    if call.startswith("insert"):
        extra = 0 if call == "insert" else (1 if rng.random() < 0.5 else -1)
        step["chunks"] = [int(c) for c in rng.integers(0, 64, max(0, len(hashes) + extra))]
    return step


def _build_refused(rng, session: Session, parts: Parts) -> dict:
    return {"shape": str(rng.choice(parts.interleaved)), "seed": int(rng.integers(2**31))}


def _plan(rng, session: Session, parts: Parts) -> dict:
    """A new uuid, or now and then one already active (registered again with other blocks)."""
    active = sorted(session.plans)
    uuid = active[int(rng.integers(len(active)))] if active and rng.random() < 0.5 else \
        f"plan-{int(rng.integers(2**31))}"
    return {"uuid": uuid, "src": int(rng.integers(session.model.rows)), "dst": int(rng.integers(session.model.rows))}


DRAWS = {"transfer": _transfer, "save": _save, "wait": _wait, "load": _load, "unlock": _unlock, "fill": _fill,
         "model_step": _model_step, "rebuild": _rebuild, "hold": _hold, "fail_copies": _fail_copies, "check": _check,
         "concurrent": _concurrent, "store_call": _store_call, "plan": _plan,
         "build_refused": _build_refused,
         "pulls": lambda rng, session, parts: draw_restart(session) or draw_pull_step(rng, session),
         "hosts": lambda rng, session, parts: draw_host_step(rng, session)}
