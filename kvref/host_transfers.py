"""Host-to-host transfers between managers, as tpu-sync's h2h_read and
h2h_write move saved blocks from one host's pool into another's without a
device: service kvref.HostTransfer on the manager's listener
(kvref.listener), messages in kvref/proto/pull.proto.

What holds (kvprobe's host_to_host probe checks each):
- h2h_read(peer, block_ids): the peer's host blocks land in host chunks
  this manager takes and locks, as d2h_auto_allocate's are: chunk i holds
  block_ids[i], in every layer and part. It returns (the chunk ids, a
  future) at once; the chunks are SAVING until the future is done, then
  SAVED, or FAILED when it failed (unlock them either way).
- h2h_write(peer, block_ids): this manager's host blocks land in chunks the
  peer takes and locks until it unlocks them; it returns (the peer's chunk
  ids, in the order of block_ids, and a done future) once every byte is
  written there: only then are the ids known.
- refused at the call, naming what was wrong, nothing taken: an empty list,
  a block named twice or out of range, a local block that holds no bytes or
  is being written, a peer that is not 'host:port'; a pool without enough
  free chunks is kvref.HostPoolExhausted.
- a transfer that fails part-way leaves nothing that looks written: the
  reader's chunks FAILED, the chunks the writer's peer took freed.
- a block a peer reads must hold bytes no copy is writing (CACHED or
  SAVED), and stays so (no copy writes it, no allocation takes it) until
  the read ends.

Trust: a manager serves these only when built with serve_host=True; then
any client that reaches its listener can read every host block that holds
bytes and fill its free chunks (locked until the manager unlocks them), as
tpu-sync's listener lets it. No call is served longer than timeout_s."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Callable

import numpy as np

from kvref.endpoints import address
from kvref.errors import HostPoolExhausted, PeerTransferFailed
from kvref.faults import Faults
from kvref.futures import TransferFuture
from kvref.listener import grpc_module as _grpc, layers_mismatch, peer_channel
from kvref.offsets import block_list, id_problem
from kvref.proto.pull_pb2 import (BlockBytes, HostReadRequest, HostWriteHeader, HostWritePart, HostWritten,
                                  PullHeader, PullReply)

SERVICE = "kvref.HostTransfer"
CLOSE_SECONDS = 5.0  # the longest close() waits for a read's thread


class _Completion:
    """What a TransferFuture waits on, completed by the thread that moves the bytes."""

    def __init__(self):
        self._future = concurrent.futures.Future()

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout_s: float) -> bool:
        concurrent.futures.wait([self._future], None if timeout_s < 0 else timeout_s)
        return self._future.done()

    def rethrow(self) -> None:
        self._future.result()

    def finish(self, error: BaseException | None = None) -> None:
        if error is None:
            self._future.set_result(None)
        else:
            self._future.set_exception(error)


class HostTransfers:
    """One manager's side of host-to-host transfers, as reader, writer and listener."""

    def __init__(self, mover: Callable, layer_block_bytes: tuple[int, ...], layer_parts: tuple[int, ...],
                 host_blocks: int, timeout_s: float, faults: Faults):
        """`mover()`: the manager's BlockMover now (held weakly by the caller)."""
        self._mover, self._faults = mover, faults
        self.layer_block_bytes, self.layer_parts = layer_block_bytes, layer_parts
        self.host_blocks, self.timeout_s = host_blocks, timeout_s
        self._lock = threading.Lock()
        self._reads: dict[threading.Thread, list] = {}  # each read's thread -> its calls
        self._closed = False

    # -- the listener ------------------------------------------------------

    @property
    def receive_bytes(self) -> int:
        """The largest message a client sends: a read of every host block (a
        varint of at most 10 bytes each), or one block of a write, with room
        for the framing."""
        return max(11 * self.host_blocks, max(self.layer_block_bytes)) + 256

    def handlers(self, parts: tuple[int, ...]):
        """Every part of a host block, at any listener: a host block is one manager's whole."""
        grpc = _grpc()
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Read": grpc.unary_stream_rpc_method_handler(
                self._serve_read, request_deserializer=HostReadRequest.FromString,
                response_serializer=PullReply.SerializeToString),
            "Write": grpc.stream_unary_rpc_method_handler(
                self._serve_write, request_deserializer=HostWritePart.FromString,
                response_serializer=HostWritten.SerializeToString)})

    def _serve_read(self, request: HostReadRequest, context):
        grpc = _grpc()
        ids = list(request.block_ids)
        problem = id_problem(ids, "the read's block_ids", self.host_blocks, "host blocks")
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        mover = self._mover()
        try:
            mover.hold_for_peer(np.asarray(ids, np.int64))
        except ValueError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        try:
            yield PullReply(header=self._header())
            deadline = time.monotonic() + min(context.time_remaining() or self.timeout_s, self.timeout_s)
            for layer, part, position in self._keys(len(ids)):
                if time.monotonic() > deadline:
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"not sent within timeout_s={self.timeout_s}s")
                yield PullReply(block=BlockBytes(layer=layer, shard=part, position=position,
                                                 data=mover.read_host_block(layer, part, ids[position])))
        finally:
            mover.release_from_peer(np.asarray(ids, np.int64))

    def _serve_write(self, parts, context):
        grpc = _grpc()
        timer = threading.Timer(self.timeout_s, context.cancel)  # whatever deadline the writer asked for
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError as e:  # a pids limit, a full address space: refused before anything is claimed
            context.abort(grpc.StatusCode.UNAVAILABLE, f"this peer could not start the thread that times "
                          f"a write ({e}); nothing was written")
        mover, ids, written = self._mover(), None, False
        try:
            first = next(parts, None)
            if first is None or first.WhichOneof("part") != "header":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a host write starts with its header")
            header = first.header
            mismatch = layers_mismatch(header, self.layer_block_bytes, self.layer_parts, "the writer")
            if mismatch:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
            if not 1 <= header.blocks <= self.host_blocks:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a host write of {header.blocks} blocks; this "
                              f"manager takes 1 to {self.host_blocks} (its host blocks)")
            try:
                ids = mover.claim(header.blocks, "h2h_write")
            except HostPoolExhausted as e:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            expected = set(self._keys(header.blocks))
            for part in parts:
                key = (part.block.layer, part.block.shard, part.block.position)
                if part.WhichOneof("part") != "block" or key not in expected or \
                        len(part.block.data) != self.layer_block_bytes[key[0]]:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the writer sent {len(part.block.data)} "
                                  f"bytes for layer {key[0]} part {key[1]} position {key[2]}, which is not a block "
                                  "the write declared and had not sent yet")
                expected.discard(key)
                self._land(mover, ids, key, part.block.data)
            if expected:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the write ended with {len(expected)} block "
                              "parts unsent")
            mover.settle_claim(np.asarray(ids, np.int64), True)
            written = True
            if self._faults.host_write_unclaimed:
                mover.unlock(np.asarray(ids, np.int64))
            return HostWritten(block_ids=ids)
        finally:
            timer.cancel()
            if ids is not None and not written:  # nothing that looks written is left
                mover.settle_claim(np.asarray(ids, np.int64), False)
                mover.unlock(np.asarray(ids, np.int64))

    # -- the reader --------------------------------------------------------

    def read(self, peer, block_ids) -> tuple[list[int], TransferFuture]:
        """The peer's host blocks `block_ids` into host chunks taken here:
        (the chunk ids, in order; the future)."""
        peer = address(peer, "peer")
        ids = self._remote_ids(block_ids)
        with self._lock:
            if self._closed:
                raise ValueError("this manager was closed")
        mover = self._mover()
        chunks = mover.claim(len(ids), "h2h_read")
        completion = _Completion()
        thread = threading.Thread(target=self._fetch, args=(peer, ids, mover, chunks, completion),
                                  name="kvref-h2h-read", daemon=True)
        with self._lock:
            self._reads[thread] = []
        try:
            thread.start()
        except RuntimeError as e:  # no thread to be had now (a pids limit, no address space): undo the claim
            with self._lock:
                del self._reads[thread]
            claimed = np.asarray(chunks, np.int64)
            mover.settle_claim(claimed, False)
            mover.unlock(claimed)
            raise RuntimeError(f"h2h_read could not start its thread ({e}); nothing was claimed or started") from e
        return list(chunks), TransferFuture(completion, self.timeout_s)

    def _fetch(self, peer: str, ids: list[int], mover, chunks: list[int], completion: _Completion) -> None:
        grpc, error = _grpc(), None
        try:
            with peer_channel(peer, max(self.layer_block_bytes)) as channel:  # one block a message
                call = channel.unary_stream(f"/{SERVICE}/Read", request_serializer=HostReadRequest.SerializeToString,
                                            response_deserializer=PullReply.FromString)(
                    HostReadRequest(block_ids=ids), timeout=self.timeout_s)
                with self._lock:
                    self._reads[threading.current_thread()].append(call)
                    if self._closed:
                        call.cancel()
                replies = iter(call)
                header = next(replies).header
                mismatch = layers_mismatch(header, self.layer_block_bytes, self.layer_parts, f"the peer at {peer}")
                if mismatch:
                    raise ValueError(mismatch)
                expected = set(self._keys(len(ids)))
                for reply in replies:
                    key = (reply.block.layer, reply.block.shard, reply.block.position)
                    if key not in expected or len(reply.block.data) != self.layer_block_bytes[key[0]]:
                        raise ValueError(f"the peer sent {len(reply.block.data)} bytes for layer {key[0]} part "
                                         f"{key[1]} position {key[2]}, which is not a block the read asked for "
                                         "and had not had yet")
                    expected.discard(key)
                    self._land(mover, chunks, key, reply.block.data)
                if expected:
                    raise ValueError(f"the peer's answer ended with {len(expected)} block parts unsent")
        except grpc.RpcError as e:
            error = PeerTransferFailed(f"h2h_read from {peer}: {e.code().name}: {e.details()}")
        except Exception as e:  # the read's own failure, carried by its future
            error = PeerTransferFailed(f"h2h_read from {peer}: {type(e).__name__}: {e}")
        finally:
            mover.settle_claim(np.asarray(chunks, np.int64), error is None)
            with self._lock:
                self._reads.pop(threading.current_thread(), None)
            completion.finish(error)

    # -- the writer --------------------------------------------------------

    def write(self, peer, block_ids) -> tuple[list[int], TransferFuture]:
        """This manager's host blocks `block_ids` into chunks the peer takes:
        (the peer's chunk ids, in order; a done future), once written."""
        grpc = _grpc()
        peer = address(peer, "peer")
        ids = block_list(block_ids, "src_block_ids").tolist()
        problem = id_problem(ids, "src_block_ids", self.host_blocks, "host blocks")
        if problem:
            raise ValueError(problem)
        mover = self._mover()
        mover.hold_for_peer(np.asarray(ids, np.int64))  # refuses blocks without bytes, naming them

        def parts():
            yield HostWritePart(header=HostWriteHeader(blocks=len(ids), layer_block_bytes=self.layer_block_bytes,
                                                       layer_shards=self.layer_parts))
            for layer, part, position in self._keys(len(ids)):
                yield HostWritePart(block=BlockBytes(layer=layer, shard=part, position=position,
                                                     data=mover.read_host_block(layer, part, ids[position])))
        try:
            with peer_channel(peer, 8 * len(ids)) as channel:  # the block ids it took
                written = channel.stream_unary(f"/{SERVICE}/Write",
                                               request_serializer=HostWritePart.SerializeToString,
                                               response_deserializer=HostWritten.FromString)(
                    parts(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise HostPoolExhausted(f"h2h_write to {peer}: {e.details()}") from None
            raise PeerTransferFailed(f"h2h_write to {peer}: {e.code().name}: {e.details()}") from None
        finally:
            mover.release_from_peer(np.asarray(ids, np.int64))
        if len(written.block_ids) != len(ids):
            raise PeerTransferFailed(f"h2h_write to {peer}: the peer answered {len(written.block_ids)} block ids "
                                     f"for {len(ids)} blocks")
        done = _Completion()
        done.finish()
        return list(written.block_ids), TransferFuture(done, self.timeout_s)

    # -- both --------------------------------------------------------------

    def close(self) -> None:
        """Fail the reads in flight and wait for their threads."""
        with self._lock:
            self._closed = True
            reads = dict(self._reads)
            for call in (c for calls in reads.values() for c in calls):
                call.cancel()
        for thread in reads:
            if thread is not threading.current_thread():
                thread.join(CLOSE_SECONDS)

    def _land(self, mover, chunks: list[int], key: tuple[int, int, int], data: bytes) -> None:
        """One part of one block into the chunk taken for its position."""
        layer, part, position = key
        targets = sorted(chunks) if self._faults.host_pairs_sorted else chunks
        mover.write_host_block(layer, part, targets[position], np.frombuffer(data, np.uint8))

    def _keys(self, blocks: int):
        """(layer, part, position) of every part of `blocks` blocks, in the order they are sent."""
        for layer, parts in enumerate(self.layer_parts):
            for part in range(parts):
                for position in range(blocks):
                    yield layer, part, position

    def _header(self) -> PullHeader:
        return PullHeader(layer_block_bytes=self.layer_block_bytes, layer_shards=self.layer_parts)

    def _remote_ids(self, values) -> list[int]:
        ids = block_list(values, "src_block_ids").tolist()
        problem = id_problem(ids, "src_block_ids", None, "host blocks")
        if problem:
            raise ValueError(problem)
        if len(ids) > self.host_blocks:
            raise HostPoolExhausted(f"h2h_read of {len(ids)} blocks: this manager has {self.host_blocks} host "
                                    "blocks in all; no chunk was taken")
        return ids
