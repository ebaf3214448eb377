"""The rules a contract sequence is made of, each one call (or a few, as a
serving stack makes them together) of the Library protocol or a model step
of the Arrays: how it is drawn from the model's state, whether it still
applies on replay (its precondition), and what it does to the IUT and the
model (probes.suite.contract), judged as it goes. A step is plain data
(JSON); one that names an earlier step (`of`) names the save it made."""

from __future__ import annotations

import threading

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.iut.host_data import random_host
from probes.iut.protocol import ExportingLibrary, NotInPlace
from probes.suite.block_model import BlockModel
from probes.suite.contract import ContractModel, Judgment, Must, device_side, host_side, is_empty, requested
from probes.suite.export_model import ExportModel
from probes.suite.manager_process import PeerError
from probes.suite.store_model import StoreModel
from probes.suite.refusals import first_line
from probes.suite.verdicts import CORRUPT, ERROR

class Stop(Exception):
    """The backend cannot make a model step the sequence asked for: the
    sequence ends there, judged up to it."""


class Broken(Exception):
    """A rule the manager broke: the verdict and what happened."""

    def __init__(self, verdict: str, detail: str):
        super().__init__(detail)
        self.verdict, self.detail = verdict, detail


class Session:
    """One IUT's manager over a sequence's caches, and the model beside it."""

    def __init__(self, iut: Adapter, spec: dict, seed: int):
        self.iut, self.spec, self.seed = iut, spec, seed
        layers = spec["layers"]
        # The last layer of a "mixed" sequence has another shape: blocks of another size.
        self.keys = [kvref.ShapeKey.parse(spec["mixed"] if spec.get("mixed") and layer == layers - 1 and layers > 1
                                          else spec["shape"]) for layer in range(layers)]
        self.key = self.keys[0]
        self.layouts = [iut.layout(key) for key in self.keys]
        pairs = [None] * layers
        for key in dict.fromkeys(self.keys):
            where = [i for i, k in enumerate(self.keys) if k == key]
            for i, pair in zip(where, iut.make_caches(key, [seed + i for i in where], spec["mode"], finite=True)):
                pairs[i] = pair
        self.caches = [c for c, _ in pairs]
        if spec["mode"] != "deferred":
            for cache in self.caches:  # landed first: the landing race has probes of its own
                iut.fetch(cache)
        # Every layer's block, as the layouts lay them out: what one block of a transfer moves.
        self.row_bytes = sum(self.block_bytes(key) for key in self.keys)
        library = iut.library
        self.exports = ExportModel(library.EXPORTS, library.exports) if isinstance(library, ExportingLibrary) \
            else None  # before the manager: its pool is the model's
        self.manager = self.build()
        self.sizes = list(self.manager.layer_bytes_per_block)
        blocks = BlockModel([self.physical(host, layer) for layer, (_, host) in enumerate(pairs)],
                            host_blocks=spec["host_blocks"], zeroed_pool=False)
        self.store = iut.kv_store(spec["store"]) if spec.get("store") else None
        self.model = ContractModel(blocks, StoreModel(spec["store"]) if self.store is not None else None)
        self.pending: dict[int, object] = {}  # step -> the IUT's Pending of a transfer not awaited
        self.pulls = None  # the pull managers (probes.suite.contract_pulls), made at the first pull rule
        self.hosts = None  # the host managers (probes.suite.contract_hosts), made at the first host rule
        self.closers: list = []  # what closing the session closes besides
        self.burst = ("", 0)  # drawing: the rule a burst repeats, and how many more (contract_draws)
        self.plans: dict[str, dict] = {}  # uuid -> the fields of the plan active under it (plan)
        # step -> how its transfer must end, what it was, what a failure leaves unknown, the device blocks it touches
        self.judgments: dict[int, tuple[Judgment, str, object, set[int]]] = {}

    def build(self):
        """A manager over the caches as they are now. Layers of two block
        sizes may be refused (the sequence then ends there); any other
        refusal is a finding, as these layouts are addressable."""
        try:
            manager = self.iut.manager(self.caches, self.spec["host_blocks"])
        except Exception as e:  # judged here
            if len(set(self.keys)) > 1 and self.iut.refuses(e):
                raise Stop(f"layers of two block sizes refused: {first_line(e)}") from e
            raise Broken(ERROR, f"construction refused or failed: {first_line(e)}") from e
        said = {"num_layers": manager.num_layers, "num_shards": manager.num_shards, "host_blocks": manager.host_blocks,
                "layer_bytes_per_block": len(manager.layer_bytes_per_block)}
        layers = len(self.caches)
        if said != {"num_layers": layers, "num_shards": 1, "host_blocks": self.spec["host_blocks"],
                    "layer_bytes_per_block": layers}:
            raise Broken(ERROR, f"the manager reports {said} for {layers} layers on one device and a pool of "
                                f"{self.spec['host_blocks']} blocks")
        pool = sum(manager.layer_bytes_per_block) * self.spec["host_blocks"]
        if manager.host_bytes is not None and manager.host_bytes < pool:
            raise Broken(ERROR, f"the manager reports a pool of {manager.host_bytes} bytes, less than the "
                                f"{pool} its {self.spec['host_blocks']} blocks of every layer take")
        if self.exports is not None:
            self.exports.pool("offload", self.row_bytes * self.spec["host_blocks"])
        return manager

    def block_bytes(self, key: kvref.ShapeKey) -> int:
        """The bytes of one block of a layer of `key`, as this IUT lays it out."""
        return self.iut.layout(key).physical_size_bytes // key.dims[0]

    def physical(self, logical: np.ndarray, layer: int) -> list[bytes]:
        return _blocks(kvref.pack(logical, self.layouts[layer]), self.sizes[layer])

    def own_caches(self, key: kvref.ShapeKey, seed: int, layers: int = 2) -> tuple[list, list[list[bytes]]]:
        """Caches of `key` for a manager beside the session's, and their blocks per layer."""
        pairs = self.iut.make_caches(key, [seed + i for i in range(layers)], "put", finite=True)
        return [c for c, _ in pairs], [self.blocks_of(key, host) for _, host in pairs]

    def blocks_of(self, key: kvref.ShapeKey, logical: np.ndarray) -> list[bytes]:
        """The bytes of each block of a cache of `key` that holds `logical`, as this IUT lays it out."""
        return _rows(kvref.pack(logical, self.iut.layout(key)), key.dims[0])

    def wrong_blocks(self, key: kvref.ShapeKey, cache, expected: list[bytes]) -> list[int]:
        """The blocks of a cache of `key` (as its next reader sees them) that differ from `expected`."""
        return self.wrong_in(key, self.iut.fetch(cache), expected)

    def wrong_in(self, key: kvref.ShapeKey, logical: np.ndarray, expected: list[bytes]) -> list[int]:
        """The blocks of a cache of `key` holding `logical` that differ from `expected`, as this IUT lays them out."""
        return [b for b, (have, want) in enumerate(zip(self.blocks_of(key, logical), expected)) if have != want]

    def close(self) -> None:
        for pending in list(self.pending.values()):
            try:
                pending.wait()
            except Exception:  # a transfer judged already; only its end matters here
                pass
        self.pending.clear()
        for close in self.closers:
            close()
        self.closers.clear()


def _blocks(packed: np.ndarray, size: int) -> list[bytes]:
    return [packed[i:i + size].tobytes() for i in range(0, packed.size, size)]


def _rows(packed: np.ndarray, rows: int) -> list[bytes]:
    return _blocks(packed, packed.size // rows)


# --- judging a call ------------------------------------------------------

REFUSED = object()  # what `judged` answers for a call refused as the judgment allowed


def judged(session: Session, judgment: Judgment, what: str, call):
    """Run `call()` as the judgment says it must go: its result, or REFUSED
    when it was refused (and a refusal was allowed)."""
    try:
        result = call()
    except Broken:
        raise
    except Exception as e:  # judged against the model
        if judgment.must == Must.FAIL:
            return REFUSED
        if judgment.must == Must.DO:
            raise Broken(ERROR, f"{what}: a valid call was refused or failed: {first_line(e)}") from e
        if not (session.iut.refuses(e) or isinstance(e, PeerError) and e.refused):  # said in the producer's process
            raise Broken(ERROR, f"{what}: refused with a failure, not a clean refusal: {first_line(e)}") from e
        return REFUSED
    if judgment.must == Must.REFUSE:
        raise Broken(ERROR, f"{what}: accepted; it must be refused ({judgment.why})")
    return result


def settle(session: Session, step: int, judgment: Judgment, what: str) -> bool:
    """Await step's transfer: whether it landed."""
    return landed(session.pending.pop(step), judgment, what)


def landed(pending, judgment: Judgment, what: str) -> bool:
    """Await a transfer: whether it landed. One that must fail must say so."""
    try:
        pending.wait()
    except Exception as e:  # judged against the model
        if judgment.must not in (Must.FAIL, Must.MAY_FAIL):
            raise Broken(ERROR, f"{what}: its transfer failed: {first_line(e)}") from e
        return False
    if judgment.must == Must.FAIL:
        raise Broken(ERROR, f"{what}: reported done, though it must fail ({judgment.why})")
    return True


def exported(session: Session, tell) -> None:
    """Tell the model of the exports (where the IUT has them) what a call did."""
    if session.exports is not None:
        tell(session.exports)


def check_exports(session: Session) -> None:
    """Every metric the IUT exports against the model (probes.suite.export_model)."""
    problem = None if session.exports is None else session.exports.judge()
    if problem is not None:
        raise Broken(ERROR, f"exports: {problem}")


# --- the rules -----------------------------------------------------------

def transfer(session: Session, index: int, step: dict) -> None:
    """d2h or h2d (valid or not), awaited or left in flight."""
    model, d2h = session.model, step["d2h"]
    judgment = model.judge_transfer(d2h, step["src"], step["dst"], step["sizes"])
    if not d2h and judgment.must in (Must.DO, Must.EITHER) \
            and host_side(d2h, step["src"], step["dst"], step["sizes"]) & _doubtful_host(session):
        judgment = Judgment(Must.MAY_FAIL, "it reads host blocks a copy in flight may fail to write")
    doubtful = _doubtful_device(session) if d2h else set()
    reads_doubtful = device_side(d2h, step["src"], step["dst"], step["sizes"]) & doubtful
    if judgment.must in (Must.DO, Must.EITHER) and reads_doubtful:
        judgment = Judgment(Must.MAY_FAIL, "it reads device blocks a load in flight may fail to write")
    what = f"{'d2h' if d2h else 'h2d'} {step['src']} -> {step['dst']} sizes {step['sizes']}"
    pending = judged(session, judgment, what,
                     lambda: session.iut.start(session.manager, d2h, step["src"], step["dst"], step["sizes"]))
    if pending is REFUSED:
        if judgment.must == Must.FAIL:
            model.forget(d2h, step["dst"], step["sizes"])
        return
    exported(session, lambda e: e.maybe(d2h, session.row_bytes * model.rows) if is_empty(
        step["src"], step["dst"], step["sizes"]) else e.begun(index, d2h, session.row_bytes * requested(
            step["src"], step["sizes"])))
    session.pending[index] = pending
    landed = True
    if step["wait"] or judgment.must == Must.FAIL:
        landed = settle(session, index, judgment, what)
        exported(session, lambda e: e.ended(index, landed))
    model.transfer(index, d2h, step["src"], step["dst"], step["sizes"], awaited=index not in session.pending,
                   failed=not landed)
    if landed and doubtful:
        model.forget_copies(step["src"], step["dst"], step["sizes"], doubtful)
    if index in session.pending:
        session.judgments[index] = (judgment, what, lambda: model.forget(d2h, step["dst"], step["sizes"]),
                                    device_side(d2h, step["src"], step["dst"], step["sizes"]))


def save(session: Session, index: int, step: dict) -> None:
    """d2h_auto_allocate: chunks the manager picks and locks."""
    model = session.model
    judgment = model.judge_save(step["blocks"], step["sizes"])
    doubtful = _doubtful_device(session)
    if judgment.must in (Must.DO, Must.EITHER) and device_side(True, step["blocks"], [], step["sizes"]) & doubtful:
        judgment = Judgment(Must.MAY_FAIL, "it reads device blocks a load in flight may fail to write")
    what = f"save {step['blocks']} sizes {step['sizes']}"
    answer = judged(session, judgment, what, lambda: session.iut.save(session.manager, step["blocks"], step["sizes"]))
    if answer is REFUSED:
        return
    chunks, pending = answer
    chunks = check_handed_out(what, chunks, sum(step["sizes"]) if step["sizes"] is not None else len(step["blocks"]),
                              model)
    exported(session, lambda e: e.begun(index, True, session.row_bytes * len(chunks)))
    session.pending[index] = pending
    model.saved(index, step["blocks"], step["sizes"], chunks, pending, awaited=False, doubtful=doubtful)
    session.judgments[index] = (judgment, what, lambda: model.save_failed(index),
                                device_side(True, step["blocks"], [], step["sizes"]))
    if step["wait"] or judgment.must == Must.FAIL:
        wait(session, index, {"of": index})


def check_handed_out(what: str, chunks, expected: int, model: ContractModel) -> list[int]:
    """The chunks a call locked for `expected` blocks: one each, in the pool, none locked already."""
    chunks = [int(c) for c in chunks]
    if len(chunks) != expected or len(set(chunks)) != len(chunks):
        raise Broken(ERROR, f"{what}: {len(chunks)} chunks {chunks[:8]} for {expected} blocks, each its own")
    taken = [c for c in chunks if not 0 <= c < model.host_blocks or c in model.locked]
    if taken:
        raise Broken(ERROR, f"{what}: chunk {taken[0]} handed out, which is out of range or still locked "
                            f"(locked: {sorted(model.locked)[:16]})")
    return chunks


def wait(session: Session, index: int, step: dict) -> None:
    """Await a transfer or save left in flight."""
    of = step["of"]
    judgment, what, forget, _ = session.judgments.pop(of)
    landed = settle(session, of, judgment, what)
    exported(session, lambda e: e.ended(of, landed))
    session.model.settled(of)
    if not landed:
        forget()


def load(session: Session, index: int, step: dict) -> None:
    """h2d from some chunks of an earlier save into device blocks."""
    chunks = session.model.saves[step["of"]].chunks
    transfer(session, index, {"d2h": False, "src": [chunks[i] for i in step["pick"]], "dst": step["dst"],
                              "sizes": None, "wait": step["wait"]})


def unlock(session: Session, index: int, step: dict) -> None:
    """unlock_blocks of an earlier save's chunks, or of ids not locked."""
    chunks = list(session.model.saves[step["of"]].chunks) if "of" in step else list(step["ids"])
    judgment = session.model.judge_unlock(chunks)
    if "of" in step and step["of"] in session.pending and judgment.must != Must.REFUSE:
        return  # ordering an unlock against a save in flight is the save's wait's to judge
    if judged(session, judgment, f"unlock {chunks}", lambda: session.iut.unlock(session.manager, chunks)) is REFUSED:
        return
    if judgment.must != Must.REFUSE:
        session.model.unlocked(chunks)


def fill(session: Session, index: int, step: dict) -> None:
    """Save as many blocks as chunks are free (all must be handed out), and
    one more (refused, nothing taken)."""
    free = session.model.free_chunks
    rng = np.random.default_rng(step["seed"])
    blocks = [int(b) for b in rng.integers(0, session.model.rows, free + step["extra"])]
    save(session, index, {"blocks": blocks, "sizes": None, "wait": True})


def model_step(session: Session, index: int, step: dict) -> None:
    """A model step leaves new contents in one layer: in place, dispatched
    and still running, or donating the cache (its storage aliased or not)."""
    layer, how = step["layer"], step["how"]
    new = random_host(session.keys[layer], step["seed"], finite=True)
    cache = session.caches[layer]
    moved = how in ("serving", "dispatch") and session.iut.backend != "sim" or how == "donate_moved"
    try:
        if how == "serving":
            cache = session.iut.serving_step(cache, new)
        elif how == "dispatch":
            cache = session.iut.dispatch_step(cache, new)
        else:
            cache = session.iut.donating_step(cache, new, how == "donate_in_place")
    except (NotInPlace, NotImplementedError) as e:
        raise Stop(f"this backend cannot make the step {how}: {first_line(e)}") from e
    except Exception as e:  # the step itself, not the manager
        raise Broken(ERROR, f"model step {how} on layer {layer} failed: {first_line(e)}") from e
    session.caches[layer] = cache
    session.model.stepped(layer, session.physical(new, layer), moved)


def rebuild(session: Session, index: int, step: dict) -> None:
    """Every transfer awaited, the manager dropped and a new one built over
    the caches as they are (as a serving stack does after a step took the
    caches it was built over); the new pool's contents are not known."""
    for pending in sorted(session.judgments):
        wait(session, index, {"of": pending})
    session.manager = None
    session.manager = session.build()
    session.model.rebuilt()
    session.plans.clear()  # a manager's plans are its own


def build_refused(session: Session, index: int, step: dict) -> None:
    """A second manager over caches whose rows are not byte ranges on this
    device (as packing row numbers through the layout says): refused."""
    key = kvref.ShapeKey.parse(step["shape"])
    caches = [c for c, _ in session.iut.make_caches(key, [step["seed"]], "put", finite=True)]
    judgment = Judgment(Must.REFUSE, f"the rows of {key} are not byte ranges in {session.iut.layout(key)}")
    made = judged(session, judgment, f"a manager over {key}", lambda: session.iut.manager(caches, 4))
    assert made is REFUSED  # judged raises for anything else


def hold(session: Session, index: int, step: dict) -> None:
    """The device holds the next copy of a layer in flight (a stall)."""
    session.iut.hold_copies(session.caches[step["layer"]], step["seconds"], until_step=step["until_step"])


def fail_copies(session: Session, index: int, step: dict) -> None:
    """The device fails every later copy that touches one block of one layer."""
    block, size = step["block"], session.sizes[step["layer"]]
    session.iut.arrays.fail_copies(session.caches[step["layer"]], block * size, (block + 1) * size)
    session.model.failing.setdefault(step["layer"], set()).add(block)
    for k, (judgment, what, forget, touches) in session.judgments.items():
        if block in touches and judgment.must in (Must.DO, Must.EITHER):  # accepted, so it was to land
            session.judgments[k] = (Judgment(Must.MAY_FAIL, f"block {block} began to fail while it was in flight"),
                                    what, forget, touches)
    # And, until none is left, the copies in flight that read what those may fail to write: loads
    # reading their host blocks, saves and d2h issued after a load reading its device blocks (the
    # manager orders each after the other, and fails it when the one it reads fails).
    model, changed = session.model, True
    while changed:
        changed = False
        host, loads = _doubtful_host(session), _doubtful_loads(session)
        for k, (judgment, what, forget, touches) in session.judgments.items():
            if judgment.must not in (Must.DO, Must.EITHER):
                continue
            if model.reading.get(k, set()) & host:
                why = "it reads host blocks a copy in flight may fail to write"
            elif k in model.in_flight and any(h < k and touches & w for h, w in loads.items()):
                why = "it reads device blocks a load in flight before it may fail to write"
            else:
                continue
            session.judgments[k] = (Judgment(Must.MAY_FAIL, why), what, forget, touches)
            changed = True


def _doubtful_host(session: Session) -> set[int]:
    """The host blocks copies in flight that may fail still write."""
    return set().union(*(session.model.in_flight.get(k, set()) for k, (judgment, *_) in session.judgments.items()
                         if judgment.must == Must.MAY_FAIL))


def _doubtful_loads(session: Session) -> dict[int, set[int]]:
    """The loads (h2d) in flight that may fail, and the device blocks each still writes."""
    return {k: touches for k, (judgment, _, _, touches) in session.judgments.items()
            if judgment.must == Must.MAY_FAIL and k in session.model.reading}


def _doubtful_device(session: Session) -> set[int]:
    """The device blocks loads in flight that may fail still write: a later
    d2h of one lands or fails, and what it copies is not known."""
    return set().union(*_doubtful_loads(session).values())


def check(session: Session, index: int, step: dict) -> None:
    """Every device block as the next step reads it, and every host block,
    against the model (but those a transfer in flight may yet fail to write)."""
    check_host(session, everything=True)
    doubtful = set().union(*(touches for judgment, _, _, touches in session.judgments.values()
                             if judgment.must == Must.MAY_FAIL))
    for layer, cache in enumerate(session.caches):
        device = session.physical(session.iut.read_by_step(cache), layer)
        wrong = [b for b, (got, want) in enumerate(zip(device, session.model.blocks.device[layer]))
                 if want is not None and got != want and b not in doubtful]
        if wrong:
            raise Broken(CORRUPT, f"layer {layer}: device blocks {wrong[:8]} differ from the model")


def check_host(session: Session, everything: bool = False) -> None:
    """The host blocks written since they were last compared (with
    `everything`, every one the model knows), but those a transfer still
    writes."""
    model, skip = session.model, session.model.unsettled_host()
    blocks = range(model.host_blocks) if everything else sorted(model.touched)
    for layer in range(len(session.caches)):
        wrong = [b for b in blocks if b not in skip and model.blocks.host[layer][b] is not None
                 and session.manager.read_block_bytes(layer, b) != model.blocks.host[layer][b]]
        if wrong:
            raise Broken(CORRUPT, f"layer {layer}: host blocks {wrong[:8]} differ from the model")
    model.touched &= skip


def concurrent(session: Session, index: int, step: dict) -> None:
    """Two valid transfers on two threads at once, touching disjoint blocks."""
    errors = []

    def run(request):
        try:
            session.iut.transfer(session.manager, request["d2h"], request["src"], request["dst"], None)
        except Exception as e:  # collected: both are valid
            errors.append(first_line(e))

    for request in step["both"]:
        if session.model.judge_transfer(request["d2h"], request["src"], request["dst"], None).must != Must.DO:
            return  # no longer what the rule is for (a replay without an earlier step)
        reads = (device_side(True, request["src"], request["dst"], None) & _doubtful_device(session) if request["d2h"]
                 else host_side(False, request["src"], request["dst"], None) & _doubtful_host(session))
        if reads:
            return  # it reads what a copy in flight may fail to write: not two valid transfers
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in step["both"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if any(t.is_alive() for t in threads):
        raise Broken(ERROR, "two valid transfers on two threads did not end within 60 s")
    if errors:
        raise Broken(ERROR, f"a valid transfer on one of two threads failed: {errors[0]}")
    for r in step["both"]:
        session.model.transfer(index, r["d2h"], r["src"], r["dst"], None, awaited=True)
        exported(session, lambda e: e.moved(r["d2h"], session.row_bytes * len(r["src"])))


def store_call(session: Session, index: int, step: dict) -> None:
    """One call of the store of saved blocks, against the store's model."""
    store, model, call = session.store, session.model.store, step["call"]
    hashes = [h.to_bytes(8, "little") for h in step["hashes"]]
    if call == "lookup":
        got, want = [(h, int(c)) for h, c in store.lookup(hashes)], model.lookup(hashes)
        if got != want:
            raise Broken(ERROR, f"store lookup {step['hashes']}: {_named(got)}, the model {_named(want)}")
    elif call == "pin":
        if len(model.lookup(hashes)) != len(hashes):
            return  # pins only what is stored (a replay without the insert)
        try:
            store.pin(hashes)
        except KeyError as e:  # a view's word that the store does not hold one of them
            raise Broken(ERROR, f"store pin {step['hashes']}: {e.args[0] if e.args else e}; the model stores each "
                                f"(capacity {model.capacity}, pinned {sorted(_named(model.pins))})") from e
        model.pin(hashes)
    elif call == "release":
        store.release(hashes)
        model.release(hashes)
    elif call == "insert_bad":  # ids of another length than the hashes
        try:
            store.insert(hashes, step["chunks"])
        except Exception:  # the refusal under test; the next lookup sees nothing changed
            return
        raise Broken(ERROR, f"store insert of {len(hashes)} hashes with {len(step['chunks'])} ids: accepted")
    else:
        taken, evicted = store.insert(hashes, step["chunks"])
        want_taken, want_evicted = model.insert(hashes, step["chunks"])
        if bool(taken) != want_taken:
            raise Broken(ERROR, f"store insert {step['hashes']}: taken={taken}, the model says {want_taken} "
                                f"(capacity {model.capacity}, pinned {sorted(_named(model.pins))})")
        if evicted is not None and sorted(evicted) != sorted(want_evicted):
            raise Broken(ERROR, f"store insert {step['hashes']}: evicted {_named(evicted)}, the model "
                                f"{_named(want_evicted)}")


def plan(session: Session, index: int, step: dict) -> None:
    """A transfer plan registered (as bytes, as the serving stack passes it)
    and read back. Under a uuid already active, the registration may be
    refused (the plan before it stays) or replace it; it may not be taken
    and leave the plan before it in place."""
    uuid = step["uuid"]
    request = session.iut.plan_request(uuid, step["src"], step["dst"])
    want, before = session.iut.library.plan_fields(request, True), session.plans.get(uuid)
    payload = request.SerializeToString()
    try:
        session.manager.register_active_plan(uuid, payload, True)
    except Exception as e:  # the binding must take the bytes it is given; only a uuid already active is refused
        if before is None or not session.iut.refuses(e):
            raise Broken(ERROR, f"plan {uuid} registered as bytes: {first_line(e)}") from e
        want = before
    read = _plan_read(session, uuid, want, "refused again" if want is before else "registered")
    if read != want:
        raise Broken(ERROR, f"plan {uuid} read back as {read}, " + (
            f"registered as {want}" if want is not before else f"the registration before it ({want}) "
            f"after registering it again as {session.iut.library.plan_fields(request, True)} was refused"))
    session.plans[uuid] = want


def _plan_read(session: Session, uuid: str, want: dict, how: str) -> dict:
    try:
        got = session.manager.active_plan(uuid)
    except Exception as e:
        raise Broken(ERROR, f"plan {uuid} {how}, then not read back: {first_line(e)}") from e
    return {k: (list(got[k]) if isinstance(got, dict) else list(getattr(got, k)))
            if isinstance(want[k], list) else (got[k] if isinstance(got, dict) else getattr(got, k))
            for k in want}


def _named(hashes) -> list:
    return [int.from_bytes(h[0] if isinstance(h, tuple) else h, "little") for h in hashes]


RULES = {rule.__name__: rule for rule in (transfer, save, wait, load, unlock, fill, model_step, rebuild,
                                          build_refused, hold, fail_copies, check, concurrent, store_call, plan)}

# What each call of probes.iut.protocol's Library and ManagerView is exercised by.
CALLS = {"manager": "rebuild", "num_layers": "Session", "num_shards": "Session", "host_blocks": "Session",
         "layer_bytes_per_block": "Session", "host_bytes": "Session", "transfer": "concurrent", "start": "transfer", "save": "save",
         "unlock": "unlock", "refuses": "judged", "kv_store": "store_call", "lookup": "store_call",
         "pin": "store_call", "release": "store_call", "insert": "store_call", "plan_request": "plan",
         "plan_fields": "plan", "read_block_bytes": "check_host", "register_active_plan": "plan",
         "active_plan": "plan"}
NOT_CALLS = {"version": "the build's name", "skip_reason": "whether it runs here",
             "distribution": "the build's name", "supports_faults": "kvref's fault models",
             "OPTION_SETS": "each way a manager is built: one session each"}
