"""kvref's public API under random input, one category per surface. Each
category makes an input from a seed (JSON-able, so a crash can be pinned to
it), says what a correct kvref does with it, and raises Mismatch when kvref
does otherwise. `run` answers "accepted" or "refused"."""

from __future__ import annotations

import numpy as np
from google.protobuf import unknown_fields

import kvref
from probes.suite.block_model import BlockModel
from probes.fuzz.caller_values import FLAGS, NotABlockList, materialize, model_values, random_flag, random_form
from probes.fuzz.layout_model import expected_bytes
from probes.fuzz.mismatch import Mismatch
from probes.iut.host_data import random_host
from probes.suite.ownership import row_byte_ranges

DTYPES = ("pred", "s4", "u4", "s8", "u8", "s16", "bf16", "f16", "f32", "f64", "f8e4m3fn")
DIMS = (0, 1, 2, 3, 5, 7, 8, 16, 128, 512)
HUGE = (2**31, 2**40, 2**61 - 1, 2**62, 2**63 - 1, 2**63, 2**64 + 3)
TILES = (1, 2, 4, 8, 32, 128, 1024)
DEEP_RANKS = (16, 32, 33, 64, 65, 300, 2000)
NUMPY_MAX_DIMS = 64  # an array of more dims cannot exist, so kvref must refuse making one
REFUSALS = (ValueError, TypeError, IndexError, kvref.AllocationError)


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def random_layout_text(rng, max_rank: int = 4, huge: float = 0.15) -> str:
    """An XLA shape text: mostly valid, sometimes huge or broken."""
    rank = int(rng.integers(0, max_rank + 1))
    dims = [_pick(rng, HUGE) if rng.random() < huge else _pick(rng, DIMS) for _ in range(rank)]
    if rng.random() < 0.02:  # very deep, past NumPy's 32 and 64 dims: no traversal may recurse per dim
        rank = _pick(rng, DEEP_RANKS)
        dims = [_pick(rng, (1, 1, 1, 2, 3, 0) if rng.random() < 0.9 else DIMS) for _ in range(rank)]
    order = list(rng.permutation(rank))
    if rank and rng.random() < 0.05:
        order[0] = order[-1]  # not a permutation
    tiles = []
    many = rng.random() < 0.02  # past the limit on tiles, where recursion would overflow the stack
    for _ in range(int(rng.integers(9, 200)) if many else int(rng.integers(0, 3))):
        size = int(rng.integers(1, 4))
        tiles.append([_pick(rng, HUGE) if rng.random() < huge / 2 else
                      (0 if rng.random() < 0.03 else _pick(rng, TILES)) for _ in range(size)])
    dtype = _pick(rng, DTYPES)
    bits = "E(4)" if dtype in ("s4", "u4") and rng.random() < 0.5 else ("E(8)" if rng.random() < 0.02 else "")
    tile_text = "".join("(" + ",".join(map(str, t)) + ")" for t in tiles)
    extra = ("T" + tile_text if tiles else "") + bits
    text = f"{dtype}[{','.join(map(str, dims))}]{{{','.join(map(str, order))}{':' + extra if extra else ''}}}"
    if rng.random() < 0.15:
        text = _mutate(rng, text)
    return text


def _mutate(rng, text: str) -> str:
    i = int(rng.integers(len(text)))
    kind = int(rng.integers(5))
    if kind == 0 and any(c.isdigit() for c in text):
        i = _pick(rng, [k for k, c in enumerate(text) if c.isdigit()])
        return text[:i] + "\uff13" + text[i + 1:]  # a non-ASCII digit
    insert = ("_", "+", " ", "-", "(")[kind]
    return text[:i] + insert + text[i:]


class ShapeText:
    """Parse, size and print back any text; the size from the unbounded model."""

    name = "shape_text"

    def generate(self, rng) -> dict:
        return {"text": random_layout_text(rng)}

    def run(self, case: dict) -> str:
        text, expected = case["text"], expected_bytes(case["text"])
        try:
            shape = kvref.Shape.parse(text)
        except kvref.LayoutError as e:
            if expected is not None:
                raise Mismatch(f"{text!r} refused ({e}); the model sizes it {expected} bytes") from None
            return "refused"
        if expected is None:
            raise Mismatch(f"{text!r} accepted as {shape}; the model refuses it")
        if shape.physical_size_bytes != expected:
            raise Mismatch(f"{text!r}: {shape.physical_size_bytes} bytes, the model says {expected}")
        if kvref.Shape.parse(str(shape)) != shape:
            raise Mismatch(f"{shape} does not parse back to itself")
        return "accepted"


class Analysis:
    """Major-slice analysis of any valid layout: no crash, and on layouts small
    enough to check, the same answer as packing row numbers."""

    name = "analysis"

    def generate(self, rng) -> dict:
        return {"text": random_layout_text(rng, huge=0.1)}

    def run(self, case: dict) -> str:
        try:
            shape = kvref.Shape.parse(case["text"])
        except kvref.LayoutError:
            return "refused"
        try:
            info = kvref.major_slice(shape)
        except kvref.AllocationError:
            return "refused"
        if shape.physical_elements <= 50_000 and 0 < shape.rank <= NUMPY_MAX_DIMS and shape.logical_elements:
            independent = row_byte_ranges(str(shape))
            if (info.addressable, info.slice_bytes) != tuple(independent.__dict__.values()):
                raise Mismatch(f"{shape}: major_slice says {info.addressable}/{info.slice_bytes}, "
                               f"packing says {independent}")
        return "accepted"


class PackUnpack:
    """Round trips through pack and unpack, and buffers of the wrong size."""

    name = "pack_unpack"

    def generate(self, rng) -> dict:
        return {"text": random_layout_text(rng, max_rank=3, huge=0.02), "seed": int(rng.integers(2**31)),
                "wrong_size": bool(rng.random() < 0.2)}

    def run(self, case: dict) -> str:
        try:
            shape = kvref.Shape.parse(case["text"])
        except kvref.LayoutError:
            return "refused"
        if max((shape.physical_elements, shape.logical_elements, *shape.dims)) > 200_000 \
                or not _numpy_holds(shape):
            try:  # too big to fill: a buffer of the wrong size must still be refused cleanly
                back = kvref.unpack(b"", shape)
            except REFUSALS:
                if shape.physical_size_bytes == 0 and _numpy_holds(shape):
                    raise Mismatch(f"unpack of 0 bytes into the empty {shape} was refused") from None
                return "refused"
            if shape.physical_size_bytes:
                raise Mismatch(f"unpack of 0 bytes into {shape} was accepted")
            if back.size:
                raise Mismatch(f"unpack of the empty {shape} gave {back.size} elements")
            return "accepted"
        host = random_host(shape.key, case["seed"])
        physical = kvref.pack(host, shape)
        if case["wrong_size"]:
            try:
                kvref.unpack(physical[:-1] if physical.size else np.zeros(1, np.uint8), shape)
            except ValueError:
                return "refused"
            raise Mismatch(f"unpack of a wrong-size buffer into {shape} was accepted")
        back = kvref.unpack(physical, shape)
        if back.tobytes() != host.tobytes() and shape.element_bits >= 8:
            raise Mismatch(f"{shape}: unpack(pack(x)) != x")
        return "accepted"


def _numpy_holds(shape) -> bool:
    """Whether NumPy can make an array of the shape's dims: at most 64 of
    them, and the product of the non-zero ones, in bytes, within its size type."""
    size = shape.element.numpy.itemsize
    for d in shape.dims:
        size *= d or 1
    return shape.rank <= NUMPY_MAX_DIMS and size < 2**63


ADDRESSABLE = ("bf16[16,2,128]{2,1,0:T(2,128)(2,1)}", "f32[8,4,128]{2,1,0:T(4,128)}",
               "s8[32,256]{1,0}", "bf16[12,8,128]{2,1,0:T(8,128)(2,1)}")


def _block_number(rng, limit: int):
    """A block number argument: mostly valid, sometimes anything but."""
    r = rng.random()
    if r < 0.85:
        return int(rng.integers(0, max(1, limit)))
    return _pick(rng, (-1, limit, limit + 3, 2**63 - 1, -(2**63), 2**64, True, 1.0, "1", None))


def random_request(rng, rows: int, host_blocks: int, d2h: bool, valid: bool = False) -> dict:
    """A d2h or h2d request: with `valid`, one a correct manager must carry
    out; otherwise anything, mostly near the edges."""
    src_limit, dst_limit = (rows, host_blocks) if d2h else (host_blocks, rows)
    if valid:
        n = int(rng.integers(1, min(4, dst_limit) + 1))
        return {"d2h": d2h, "src": [int(x) for x in rng.integers(0, src_limit, n)],
                "dst": [int(x) for x in rng.choice(dst_limit, n, replace=False)], "sizes": None}
    n = int(rng.integers(0, 5))
    src = [_block_number(rng, src_limit) for _ in range(n)]
    dst = [_block_number(rng, dst_limit) for _ in range(n)]
    sizes = None
    if rng.random() < 0.3:
        sizes = [int(rng.integers(0, 3)) if rng.random() < 0.9 else _pick(rng, (-1, True, 2**63))
                 for _ in range(n + (rng.random() < 0.05))]
    if rng.random() < 0.05 and src:
        dst = dst[:-1]
    return {"d2h": d2h, "src": src, "dst": dst, "sizes": sizes}


LISTS = ("src", "dst", "sizes")


def in_caller_forms(rng, request: dict, block_lists: bool = False) -> dict:
    """The request with each of its lists passed in a random form
    (caller_values); with `block_lists`, forms that are block lists."""
    return {**request, "forms": {k: random_form(rng, request[k], block_lists)
                                 for k in LISTS if request[k] is not None}}


def passed(call: dict, model: BlockModel) -> tuple[list, list, str | None]:
    """The objects the call passes, the plain values the model applies, and
    the model's reason to refuse (None: a correct kvref carries it out)."""
    forms = call.get("forms", {})
    objects = [None if call[k] is None else materialize(call[k], forms.get(k, {"form": "list"})) for k in LISTS]
    plain = [None if call[k] is None else model_values(call[k], forms.get(k, {"form": "list"})) for k in LISTS]
    problem = next((f"{k} is {v}" for k, v in zip(LISTS, plain) if isinstance(v, NotABlockList)), None)
    return objects, plain, problem or model.problem(call["d2h"], *plain)


class ManagerCalls:
    """A sequence of d2h, h2d, block reads and writes on a manager over
    simulated caches, each checked against BlockModel: valid requests move
    exactly the blocks they name, invalid ones are refused and change nothing."""

    name = "manager_calls"

    def generate(self, rng) -> dict:
        text = _pick(rng, ADDRESSABLE)
        rows = kvref.Shape.parse(text).dims[0]
        host_blocks = int(rng.integers(1, 2 * rows))
        valid = bool(rng.random() < 0.5)  # half the sequences are wholly valid
        calls = []
        for _ in range(8):
            valid_call = valid or rng.random() < 0.5
            calls.append(in_caller_forms(rng, random_request(rng, rows, host_blocks, bool(rng.random() < 0.5),
                                                             valid_call), block_lists=valid_call))
        return {"layout": text, "layers": int(rng.integers(1, 3)), "host_blocks": host_blocks,
                "seed": int(rng.integers(2**31)), "calls": calls}

    def run(self, case: dict) -> str:
        shape = kvref.Shape.parse(case["layout"])
        device = kvref.SimDevice()
        hosts = [random_host(shape.key, case["seed"] + i) for i in range(case["layers"])]
        caches = [device.put(h, shape=shape) for h in hosts]
        manager = kvref.KVCacheManager(caches, case["host_blocks"])
        block = manager.bytes_per_block
        model = BlockModel([_blocks(c.physical_bytes(), block) for c in caches],
                           host_blocks=case["host_blocks"])
        outcome = "accepted"
        for call in case["calls"]:
            objects, plain, problem = passed(call, model)
            try:
                (manager.d2h if call["d2h"] else manager.h2d)(*objects).result(timeout=60)
            except REFUSALS as e:
                if problem is None:
                    raise Mismatch(f"{call} refused ({type(e).__name__}: {e}) but is valid") from None
                outcome = "refused"
            else:
                if problem is not None:
                    raise Mismatch(f"{call} accepted; the model refuses it: {problem}")
                model.apply(call["d2h"], *plain)
            _compare(model, manager, caches, block)
        return outcome


def _blocks(physical: np.ndarray, block: int) -> list[bytes]:
    return [physical[i:i + block].tobytes() for i in range(0, physical.size, block)]


def _compare(model: BlockModel, manager, caches, block: int) -> None:
    for layer, cache in enumerate(caches):
        if _blocks(cache.physical_bytes(), block) != model.device[layer]:
            raise Mismatch(f"layer {layer}: device blocks differ from the model")
        for index, expected in enumerate(model.host[layer]):
            if manager.read_block_bytes(layer, index) != expected:
                raise Mismatch(f"layer {layer}: host block {index} differs from the model")


class RawTransfers:
    """transfer_d2h / transfer_h2d between one simulated cache and a host
    array of any kind: plain, contiguous, writable arrays of whole blocks are
    the valid ones."""

    name = "raw_transfers"
    HOSTS = ("blocks_u8", "blocks_f32", "partial", "empty", "object", "strided", "readonly", "list")

    def generate(self, rng) -> dict:
        host = _pick(rng, self.HOSTS)
        blocks = int(rng.integers(1, 12))
        return {"layout": _pick(rng, ADDRESSABLE), "host": host, "blocks": blocks,
                "seed": int(rng.integers(2**31)),
                "call": in_caller_forms(rng, random_request(rng, 16, blocks, bool(rng.random() < 0.5)))}

    def run(self, case: dict) -> str:
        shape = kvref.Shape.parse(case["layout"])
        cache = kvref.SimDevice().put(random_host(shape.key, case["seed"]), shape=shape)
        cache.await_buffer()  # the model starts from the landed bytes
        block = kvref.major_slice(shape).slice_bytes
        host, valid_host = self._host(case["host"], case["blocks"], block)
        call = case["call"]
        model = BlockModel([_blocks(cache.physical_bytes(), block)], host_blocks=case["blocks"])
        objects, plain, problem = passed(call, model)
        problem = problem if valid_host else f"host array {case['host']}"
        move = kvref.transfer_d2h if call["d2h"] else kvref.transfer_h2d
        try:
            move(cache, host, *objects)
        except REFUSALS as e:
            if problem is None:
                raise Mismatch(f"{call} with a {case['host']} host refused ({e}) but is valid") from None
            return "refused"
        if problem is not None:
            raise Mismatch(f"{call} with a {case['host']} host accepted; the model refuses it: {problem}")
        model.apply(call["d2h"], *plain)
        if _blocks(cache.physical_bytes(), block) != model.device[0] or \
                _blocks(host.reshape(-1).view(np.uint8), block) != model.host[0]:
            raise Mismatch(f"{call}: bytes differ from the model")
        return "accepted"

    @staticmethod
    def _host(kind: str, blocks: int, block: int):
        """(host array, whether a correct transfer takes it)."""
        if kind == "blocks_f32" and block % 4 == 0:
            return np.zeros(blocks * block // 4, np.float32), True
        if kind == "partial":
            return np.zeros(blocks * block + 1, np.uint8), False
        if kind == "empty":
            return np.zeros(0, np.uint8), False
        if kind == "object":
            return np.zeros(blocks * block // 8 + 1, dtype=object), False
        if kind == "strided":
            return np.zeros(2 * blocks * block, np.uint8)[::2], False
        if kind == "readonly":
            host = np.zeros(blocks * block, np.uint8)
            host.flags.writeable = False
            return host, False
        if kind == "list":
            return [0] * (blocks * block), False
        return np.zeros(blocks * block, np.uint8), True


class PlanBytes:
    """Plans as bytes: valid requests, requests breaking one rule, junk."""

    name = "plan_bytes"

    def generate(self, rng) -> dict:
        kind = _pick(rng, ("valid", "uuid", "layer", "block", "lengths", "junk", "truncated"))
        n = int(rng.integers(0, 4))
        request = {"uuid": "p", "layer_ids": [int(rng.integers(0, 2)) for _ in range(n)],
                   "src_block_ids": [int(rng.integers(0, 16)) for _ in range(n)],
                   "dst_block_ids": [int(rng.integers(0, 64)) for _ in range(n)]}
        if kind == "uuid":
            request["uuid"] = "q"
        elif kind == "layer" and n:
            request["layer_ids"][0] = _pick(rng, (2, -1, 2**31 - 1))
        elif kind == "block" and n:
            request["src_block_ids"][0] = _pick(rng, (16, -1, 2**62))
        elif kind == "lengths":
            request["dst_block_ids"].append(0)
        junk = rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8).tobytes().hex()
        return {"kind": kind, "request": request, "junk": junk, "is_sender": random_flag(rng, 0.85)}

    def run(self, case: dict) -> str:
        device = kvref.SimDevice()
        caches = [device.zeros((16, 2, 128), "bf16", shape=kvref.Shape.parse(ADDRESSABLE[0]))
                  for _ in range(2)]
        manager = kvref.KVCacheManager(caches, 4)
        message = kvref.StartTransferRequest(**case["request"])
        data = message.SerializeToString()
        if case["kind"] == "junk":
            data = bytes.fromhex(case["junk"])
        elif case["kind"] == "truncated" and data:
            data = data[:-1]
        make_flag, is_flag = FLAGS[case["is_sender"]]
        valid = _plan_is_valid(data) and is_flag
        try:
            manager.register_active_plan("p", data, is_sender=make_flag())
        except (ValueError, TypeError) as e:
            if valid:
                raise Mismatch(f"a valid plan {case['request']} was refused: {e}") from None
            try:
                manager.active_plan("p")
            except ValueError:
                return "refused"
            raise Mismatch("a refused plan is registered") from None
        if not valid:
            raise Mismatch(f"plan {case['kind']} {data.hex()} with is_sender={case['is_sender']} was accepted")
        got = manager.active_plan("p")
        parsed = kvref.StartTransferRequest.FromString(data)
        if got.src_block_ids != list(parsed.src_block_ids) or got.layer_ids != list(parsed.layer_ids):
            raise Mismatch(f"plan reads back as {got}; registered {parsed}")
        return "accepted"


def _plan_is_valid(data: bytes) -> bool:
    """Python protobuf parses it, and it names this manager: uuid "p" (or
    none), layers 0-1, source blocks of our 16, equal lengths."""
    try:
        plan = kvref.StartTransferRequest.FromString(data)
    except Exception:  # protobuf's DecodeError and friends: not a plan
        return False
    if unknown_fields.UnknownFieldSet(plan):  # fields the message does not define
        return False
    return (plan.uuid in ("", "p") and all(0 <= x < 2 for x in plan.layer_ids)
            and len(plan.src_block_ids) == len(plan.dst_block_ids)
            and all(0 <= x < 16 for x in plan.src_block_ids) and all(x >= 0 for x in plan.dst_block_ids))


CATEGORIES = {c.name: c for c in (ShapeText(), Analysis(), PackUnpack(), ManagerCalls(),
                                   RawTransfers(), PlanBytes())}
