"""A manager's listener under a hostile peer: each input is a few calls to
its methods (pulls, their settlement, host-to-host reads and writes) with
junk bytes, messages that break a rule, well-formed ones, streams that
stall or are abandoned; then an honest pull and an honest h2h_read, each
checked byte for byte. A correct listener answers every call with a status
within its deadline (never UNKNOWN: an exception it did not mean), takes
nothing it refused, accepts what is well formed, and goes on serving
honest peers exactly, its chunks back where they were."""

from __future__ import annotations

import threading
import time

import numpy as np

import kvref
from kvref.polling import wait_for
from probes.fuzz.mismatch import Mismatch
from probes.iut.host_data import random_host

KEY = kvref.ShapeKey("f32", (32, 8, 128))  # 4 KiB blocks
HOST_BLOCKS = 16
LISTENER_TIMEOUT_S = 1.0  # the producer's timeout_s: how long it serves one call at most
CALL_SECONDS = 5.0  # a hostile call's own deadline; an answer must come before it
SETTLE_SECONDS = 10.0  # an honest pull's bound
METHODS = ("/kvref.BlockPull/Pull", "/kvref.BlockPull/Settled", "/kvref.HostTransfer/Read",
           "/kvref.HostTransfer/Write")
FORMS = ("junk", "broken", "valid", "stalled")
HOLDING_BYTES = (kvref.ChunkState.CACHED, kvref.ChunkState.SAVED)  # the chunks a peer may read
FORM_WEIGHTS = (0.35, 0.4, 0.2, 0.05)  # a stall holds a call for the listener's timeout_s: few of them


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _ints(rng, n_max: int) -> list[int]:
    """Block ids: mostly in range, sometimes negative, huge or repeated."""
    n = int(rng.integers(0, n_max))
    values = [int(x) for x in rng.integers(0, HOST_BLOCKS, n)]
    if values and rng.random() < 0.5:
        values[int(rng.integers(n))] = _pick(rng, (-1, HOST_BLOCKS, 2**31, 2**63 - 1, -(2**63), 10**6))
    return values


class HostilePeer:
    name = "listener"

    def __init__(self):
        self._sides = None

    def generate(self, rng) -> dict:
        calls = [{"method": _pick(rng, METHODS), "form": str(rng.choice(FORMS, p=FORM_WEIGHTS)),
                  "seed": int(rng.integers(2**31))}
                 for _ in range(int(rng.integers(1, 4)))]
        honest = sorted(rng.choice(KEY.dims[0], 3, replace=False).tolist())
        return {"calls": calls, "honest": honest, "uuid": int(rng.integers(1, 2**50))}

    def run(self, case: dict) -> str:
        producer, consumer = self._start()
        before = producer.chunks_available
        statuses = []
        for i, call in enumerate(case["calls"]):
            statuses.append(self._call(producer, call, case["uuid"] + i))
            self._back_to(producer, before)  # the call's stream has ended on the listener's side too
        self._honest(producer, consumer, case)
        return "accepted" if all(s == "OK" for s in statuses) else "refused"

    def _start(self):
        """One producer (listening, serving host transfers) and one consumer
        per worker, kept across inputs: every input leaves them as it found them."""
        if self._sides is None:
            device = kvref.SimDevice("v6e")
            caches = [[device.put(random_host(KEY, seed + layer)) for layer in range(2)] for seed in (1, 100)]
            producer = kvref.KVCacheManager(caches[0], HOST_BLOCKS, listen="127.0.0.1:0", serve_host=True,
                                            timeout_s=LISTENER_TIMEOUT_S)
            consumer = kvref.KVCacheManager(caches[1], HOST_BLOCKS, timeout_s=SETTLE_SECONDS)
            producer.d2h([0], [0], [HOST_BLOCKS]).result()  # host block b holds device block b
            # The consumer's chunks handed out out of order, as in a pool used for a while.
            chunks, saving = consumer.d2h_auto_allocate(list(range(HOST_BLOCKS)))
            saving.result()
            consumer.unlock_blocks(np.random.default_rng(0).permutation(chunks).tolist())
            self._sides = (producer, consumer, caches)
        return self._sides[:2]

    def _call(self, producer, call: dict, uuid: int) -> str:
        """One hostile call; its status code's name."""
        import grpc

        rng = np.random.default_rng(call["seed"])
        method, form = call["method"], call["form"]
        endpoint = producer.get_local_endpoints()[0]["endpoint"]
        if form == "valid" and method.endswith("/Pull"):
            producer.register_read(f"hostile-{uuid}", uuid, [0, 1])
        request = self._request(method, form, rng, producer, uuid)
        with grpc.insecure_channel(endpoint) as channel:
            started = time.monotonic()
            try:
                written = self._send(channel, method, form, request)
            except grpc.RpcError as e:
                code, details = e.code(), e.details() or ""
            else:
                code, details = grpc.StatusCode.OK, ""
                if written:
                    producer.unlock_blocks(written)  # a write the owner keeps, then gives back
        elapsed = time.monotonic() - started
        if code == grpc.StatusCode.UNKNOWN or code == grpc.StatusCode.INTERNAL and "deserializ" not in details:
            raise Mismatch(f"{method} ({form}) ended {code.name}: the listener failed on it: {details[:300]}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and form != "stalled" or elapsed > CALL_SECONDS + 2:
            raise Mismatch(f"{method} ({form}) got no answer for {elapsed:.1f}s ({code.name})")
        expected = self._valid(method, form, request, uuid, producer)
        if expected is not None and (code == grpc.StatusCode.OK) != expected:
            raise Mismatch(f"{method} ({form}) ended {code.name}, but it is {'well' if expected else 'not well'} "
                           f"formed: {details[:300]}")
        return code.name

    @staticmethod
    def _valid(method: str, form: str, request, uuid: int, producer) -> bool | None:
        """Whether a correct listener serves the call (None: either answer is
        right, as for a stalled one, or junk that may parse as anything)."""
        from kvref.proto.pull_pb2 import HostReadRequest, PullRequest

        if form == "stalled" or method.endswith("/Settled"):  # Settled answers every message alike
            return None
        if method.endswith("/Write"):
            return True if form == "valid" else None if form == "junk" else False
        try:
            parsed = (PullRequest if method.endswith("/Pull") else HostReadRequest).FromString(request)
        except Exception:  # protobuf's DecodeError: gRPC refuses it before the listener sees it
            return False
        ids = list(parsed.block_ids)
        if method.endswith("/Pull"):
            return parsed.uuid == uuid and form == "valid"
        return (bool(ids) and len(set(ids)) == len(ids) and all(0 <= i < HOST_BLOCKS for i in ids)
                and all(producer.chunk_state(i) in HOLDING_BYTES for i in ids))

    def _request(self, method: str, form: str, rng, producer, uuid: int):
        """The bytes of a unary request, or a write's messages."""
        from kvref.proto.pull_pb2 import (BlockBytes, HostReadRequest, HostWriteHeader, HostWritePart, PullRequest,
                                          PullSettled)

        if method.endswith("/Write"):
            sizes, parts = list(producer.layer_bytes_per_block), [1] * producer.num_layers
            return list(self._write_parts(form, rng, sizes, parts, HostWriteHeader, HostWritePart, BlockBytes))
        from kvref.proto.pull_pb2 import (BlockBytes, HostReadRequest, HostWriteHeader, HostWritePart, PullRequest,
                                          PullSettled)

        if form == "junk":
            request = rng.bytes(int(_pick(rng, (0, 1, 7, 100, 2000, 5_000_000))))
        elif method.endswith("/Pull"):
            request = PullRequest(uuid=uuid if form == "valid" else int(rng.integers(0, 2**63)),
                                  req_id="x" * int(_pick(rng, (0, 5, 5000))) if form == "broken" else "r",
                                  block_ids=[0, 1] if form == "valid" else _ints(rng, 40),
                                  shards=[] if form == "valid" else rng.integers(-2, 6, int(rng.integers(0, 4))).tolist()
                                  ).SerializeToString()
        elif method.endswith("/Settled"):
            request = PullSettled(uuid=int(rng.integers(0, 2**63)), landed=bool(rng.random() < 0.5),
                                  reason="y" * int(rng.integers(0, 100))).SerializeToString()
        else:
            ids = [2, 3] if form == "valid" else _ints(rng, 40)
            request = HostReadRequest(block_ids=ids).SerializeToString()
        return request

    @staticmethod
    def _send(channel, method: str, form: str, request) -> list[int]:
        """Make the call; the chunks a write took, for the caller to give back."""
        from kvref.proto.pull_pb2 import HostWritten

        plain = lambda b: b  # noqa: E731 (bytes as they are)
        if method.endswith("/Write"):
            stalls = form == "stalled"

            def messages():
                yield from request
                if stalls:  # sends nothing more: the listener cuts it off at its timeout_s
                    threading.Event().wait(LISTENER_TIMEOUT_S + 1)
            call = channel.stream_unary(method, request_serializer=plain, response_deserializer=plain)
            return list(HostWritten.FromString(call(messages(), timeout=CALL_SECONDS)).block_ids)
        if method.endswith("/Settled"):
            channel.unary_unary(method, request_serializer=plain, response_deserializer=plain)(
                request, timeout=CALL_SECONDS)
            return []
        stream = channel.unary_stream(method, request_serializer=plain, response_deserializer=plain)(
            request, timeout=CALL_SECONDS)
        if form == "stalled":  # read nothing, then walk away
            time.sleep(0.05)
            stream.cancel()
        for _ in stream:
            pass
        return []

    @staticmethod
    def _write_parts(form, rng, sizes, parts, HostWriteHeader, HostWritePart, BlockBytes):
        """A write's messages: well formed (one block), breaking a rule, junk, or one that stalls."""
        header = HostWriteHeader(blocks=1, layer_block_bytes=sizes, layer_shards=parts)
        if form == "valid" or form == "stalled":
            yield HostWritePart(header=header).SerializeToString()
            if form == "stalled":
                return
            for layer in range(len(sizes)):
                yield HostWritePart(block=BlockBytes(layer=layer, shard=0, position=0,
                                                     data=rng.bytes(sizes[layer]))).SerializeToString()
            return
        if form == "junk":
            for _ in range(int(rng.integers(0, 3))):
                yield rng.bytes(int(_pick(rng, (0, 3, 200, 5_000_000))))
            return
        blocks = int(_pick(rng, (-1, 0, 1, 2, HOST_BLOCKS + 1, 2**40)))
        wrong = [s + int(_pick(rng, (0, 0, 1, -1))) for s in sizes]
        if rng.random() < 0.8:
            yield HostWritePart(header=HostWriteHeader(blocks=blocks, layer_block_bytes=wrong,
                                                       layer_shards=parts)).SerializeToString()
        for _ in range(int(rng.integers(0, 2 * len(sizes) + 2))):
            layer = int(rng.integers(-1, len(sizes) + 1))
            size = sizes[layer] if 0 <= layer < len(sizes) and rng.random() < 0.7 else int(rng.integers(0, 9000))
            yield HostWritePart(block=BlockBytes(layer=layer, shard=int(rng.integers(-1, 2)),
                                                 position=int(rng.integers(-1, 3)),
                                                 data=bytes(size))).SerializeToString()
        if blocks == 1 and wrong == sizes:  # well formed after all, or short of a layer: cut it
            yield b"\xff\xff"

    def _honest(self, producer, consumer, case: dict) -> None:
        """An honest pull and an honest h2h_read after the attack, each exact."""
        uuid, blocks = case["uuid"] + 100, case["honest"]
        req = f"honest-{uuid}"
        producer.register_read(req, uuid, blocks)
        consumer.start_read(req, uuid, producer.get_local_endpoints()[0]["endpoint"], blocks, blocks)
        stats = [([], [], [])]
        wait_for(lambda: stats.append(consumer.poll_stats()) or stats[-1][1] or stats[-1][2], SETTLE_SECONDS, 0.005)
        _, done, failed = stats[-1]
        if done != [req]:
            reason = consumer.failure_reason(req) if failed else "never settled"
            raise Mismatch(f"after the attack, an honest pull ended {failed or done or 'unsettled'}: {reason}")
        caches = self._sides[2]
        for layer in range(2):
            theirs = caches[0][layer].physical_bytes()
            block = producer.bytes_per_block
            for b in blocks:
                if not np.array_equal(caches[1][layer].physical_bytes()[b * block:(b + 1) * block],
                                      theirs[b * block:(b + 1) * block]):
                    raise Mismatch(f"after the attack, an honest pull landed layer {layer} block {b} wrong")
        producer.d2h([4, 9], [4, 9]).result()  # blocks a refused write may have left FREE hold bytes again
        ids, future = consumer.h2h_read(producer.get_local_endpoints()[0]["endpoint"], [4, 9])
        try:
            future.result()
            if any(consumer.read_block_bytes(layer, i) != producer.read_block_bytes(layer, b)
                   for layer in range(2) for i, b in zip(ids, [4, 9])):
                raise Mismatch("after the attack, an honest h2h_read landed wrong bytes")
        except kvref.PeerTransferFailed as e:
            raise Mismatch(f"after the attack, an honest h2h_read failed: {e}") from None
        finally:
            consumer.unlock_blocks(ids)

    @staticmethod
    def _back_to(producer, chunks: int) -> None:
        """Every chunk a hostile write took is given back (its stream's thread may still be ending)."""
        if not wait_for(lambda: producer.chunks_available == chunks, LISTENER_TIMEOUT_S + CALL_SECONDS):
            raise Mismatch(f"after the attack the producer has {producer.chunks_available} chunks free, not "
                           f"{chunks}: a refused or abandoned write kept some")
