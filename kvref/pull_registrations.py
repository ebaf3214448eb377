"""The producer's side of pulls between managers (kvref.pulls): the requests
it registered (register_read) and the listener's service kvref.BlockPull
that serves their blocks to consumers and hears that a pull landed.

What holds: a registration names blocks of this manager, under a uuid and a
request id neither of which is registered already; it is served to any pull
that names its uuid and only blocks it registered, part by part from the
sub-manager that serves each part; it settles (done sending, so its blocks
may be freed) when every part's pull landed or timeout_s passed."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from kvref import metrics
from kvref.faults import Faults
from kvref.listener import grpc_module as _grpc
from kvref.offsets import block_list, id_problem
from kvref.proto.pull_pb2 import BlockBytes, PullHeader, PullReply, PullRequest, PullSettled, PullSettledReply
from kvref.staging import Staging
from kvref.values import REQUEST_ID_BYTES, request_id, request_uuid

SERVICE = "kvref.BlockPull"


@dataclass
class Registration:
    req_id: str
    uuid: int
    block_ids: tuple[int, ...]
    deadline: float
    landed_parts: set = field(default_factory=set)
    # Each part's blocks some Pull stream sent whole: a consumer's word that a part landed counts
    # only for a part every block of which was sent (a stranger's Settled moves nothing).
    sent: dict = field(default_factory=dict)
    streams: list = field(default_factory=list)  # when each Pull stream began to send (time.monotonic())

    def sent_whole(self, part: int) -> bool:
        return self.sent.get(part, set()) >= set(self.block_ids)


class Registrations:
    """One manager's registered requests, and the service that serves them."""

    def __init__(self, staging: Staging, layer_block_bytes: tuple[int, ...], device_blocks: int,
                 timeout_s: float, listening: bool, faults: Faults):
        """`listening`: the manager serves pulls (else nothing may be registered)."""
        self._staging, self._faults = staging, faults
        self.layer_block_bytes, self.layer_parts = layer_block_bytes, staging.layer_parts
        self.device_blocks, self.timeout_s, self._listening = device_blocks, timeout_s, listening
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)  # told of each new registration
        self._registrations: dict[int, Registration] = {}
        self._served_before: dict[int, tuple[int, ...]] = {}  # settled_uuid_served_stale's memory
        self._done_sending: list[str] = []
        self._serving_pid = os.getpid()  # the process whose listener serves the registrations

    def register_read(self, req_id, uuid, block_ids) -> bool:
        """Announce `block_ids` as request `req_id`'s, to be pulled under
        `uuid`; False (nothing registered) for an empty list."""
        req_id, uuid = request_id(req_id), request_uuid(uuid)
        blocks = tuple(block_list(block_ids, "block_ids").tolist())
        problem = id_problem(blocks, "block_ids", self.device_blocks, "device blocks", once=False) if blocks else ""
        if problem:
            raise ValueError(problem)
        if not self._listening:
            raise ValueError("this manager does not listen (it was built without listen=), so no consumer "
                             "could pull what it registers")
        if os.getpid() != self._serving_pid:
            raise RuntimeError(f"this manager serves pulls from process {self._serving_pid}, which this process "
                               "was forked from: a fork has none of its listener's threads, so no consumer could "
                               "pull what it registers here; build the manager in this process")
        if not blocks:
            return False
        with self._lock:
            self._expire()
            if uuid in self._registrations:
                raise ValueError(f"uuid {uuid} is still registered by request "
                                 f"{self._registrations[uuid].req_id!r}; it may be reused once that settles")
            held = [r for r in self._registrations.values() if r.req_id == req_id]
            if held:
                raise ValueError(f"request {req_id!r} is still registered (uuid {held[0].uuid}); a request "
                                 "id may be reused once its transfer settles")
            if self._faults.registrations_keyed_by_blocks:
                for other in [u for u, r in self._registrations.items() if r.block_ids == blocks]:
                    del self._registrations[other]
            if self._faults.settled_uuid_served_stale:
                blocks = self._served_before.setdefault(uuid, blocks)
            self._registrations[uuid] = Registration(req_id, uuid, blocks, time.monotonic() + self.timeout_s)
            self._registered.notify_all()
        return True

    @property
    def outstanding(self) -> bool:
        """Whether a registration may still be pulled."""
        with self._lock:
            self._expire()
            return bool(self._registrations)

    @property
    def receive_bytes(self) -> int:
        """The largest message a consumer sends: a request id, a uuid, one id
        per block of the cache (a varint of at most 10 bytes) and the parts of a
        block, with room for the framing."""
        return REQUEST_ID_BYTES + 11 * self.device_blocks + 11 * max(self.layer_parts) + 256

    def handlers(self, parts: tuple[int, ...]):
        """The producer's side, as a listener serving `parts` of a block offers it."""
        grpc = _grpc()
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Pull": grpc.unary_stream_rpc_method_handler(
                lambda request, context: self._serve(request, context, parts),
                request_deserializer=PullRequest.FromString, response_serializer=PullReply.SerializeToString),
            "Settled": grpc.unary_unary_rpc_method_handler(
                lambda request, context: self._settled_remotely(request, parts),
                request_deserializer=PullSettled.FromString,
                response_serializer=PullSettledReply.SerializeToString)})

    def _serve(self, request: PullRequest, context, served: tuple[int, ...]):
        grpc = _grpc()
        # A serving engine's producer registers a request in its next step, and its consumer may
        # pull before that: a pull waits for its registration a while, as the production library's does.
        # It waits up to timeout_s, the bound of everything a pull does (and no longer than the consumer waits).
        waits = 0.0 if self._faults.unregistered_pull_fails_at_once else self.timeout_s
        until = time.monotonic() + waits
        with self._registered:
            self._expire()
            registration = self._registrations.get(request.uuid)
            while registration is None and context.is_active() and time.monotonic() < until:
                self._registered.wait(min(until - time.monotonic(), 0.1))
                registration = self._registrations.get(request.uuid)
        if registration is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no request is registered under uuid {request.uuid} "
                          f"(never registered, nor within {waits:g} s of the "
                          "pull; or settled or expired)")
        unknown = sorted(set(request.block_ids) - set(registration.block_ids))
        if unknown or not request.block_ids:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"blocks {unknown[:8]} are not registered under uuid {request.uuid} (request "
                          f"{registration.req_id!r} registered {len(registration.block_ids)} blocks)"
                          if unknown else "the pull names no block")
        wanted = list(request.shards) or list(served)
        own_parts = self._faults.sub_manager_serves_own_parts
        if not set(wanted) <= set(served) and not own_parts:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parts {sorted(set(wanted) - set(served))} of a block are not served at this "
                          f"endpoint (it serves {list(served)}); pull each from the endpoint "
                          "get_local_endpoints names for it")
        yield PullReply(header=PullHeader(layer_block_bytes=self.layer_block_bytes,
                                          layer_shards=self.layer_parts))
        # No stream is served for longer than timeout_s, whatever deadline the client asked for.
        deadline = time.monotonic() + min(context.time_remaining() or self.timeout_s, self.timeout_s)
        # own_parts: its own parts go out labelled as the ones asked for
        labels = dict(zip(served, wanted)) if own_parts else {part: part for part in wanted}
        with self._lock:
            registration.streams.append(time.monotonic())
        for (layer, part, position), data in self._staging.read(list(request.block_ids), list(labels), deadline):
            yield PullReply(block=BlockBytes(layer=layer, shard=labels[part], position=position, data=data))
            metrics.LEDGER.count(metrics.SENT_BYTES, len(data))  # taken by gRPC: it went out
        with self._lock:  # the stream ran to its end: these parts of these blocks were sent
            for part in labels.values():
                registration.sent.setdefault(part, set()).update(request.block_ids)

    def _settled_remotely(self, request: PullSettled, parts: tuple[int, ...]) -> PullSettledReply:
        """The consumer's word that its pull (of `parts`) landed, or failed."""
        with self._lock:
            registration = self._registrations.get(request.uuid)
            if registration is not None and request.landed:
                registration.landed_parts |= {part for part in parts if registration.sent_whole(part)}
                if registration.landed_parts >= set(range(self.layer_parts[0])):
                    self._observe_sent(registration)
                    self._settle(registration)
        return PullSettledReply()

    def _observe_sent(self, registration: Registration) -> None:
        """A landed pull's crossing time, from its first stream, once per layer."""
        for began in registration.streams if self._faults.p2p_time_per_stream else registration.streams[:1]:
            metrics.LEDGER.pull_sent(began, len(self.layer_parts))

    def _settle(self, registration: Registration) -> None:
        if self._faults.settled_registration_served and registration.deadline > time.monotonic():
            registration.landed_parts = set()  # kept, still served, until it expires
        else:
            del self._registrations[registration.uuid]
        self._done_sending.append(registration.req_id)

    def _expire(self) -> None:
        """Registrations no pull landed for within timeout_s: done sending."""
        if self._faults.registrations_never_expire:
            return
        now = time.monotonic()
        for registration in [r for r in self._registrations.values() if r.deadline <= now]:
            self._settle(registration)

    def done_sending(self) -> list[str]:
        """The requests settled since the last call, each once (under its fault model, every one so far)."""
        with self._lock:
            self._expire()
            settled = list(self._done_sending)
            if not self._faults.duplicate_reports:
                self._done_sending.clear()
        return settled
