"""Pulls between managers, as disaggregated serving moves a request's KV
blocks from its prefill host to its decode host: the producer registers the
request's blocks under a uuid (register_read), the consumer pulls them into
blocks of its own (start_read), and both poll for what settled (poll_stats).
The transport is gRPC (service kvref.BlockPull, messages in
kvref/proto/pull.proto); a manager listens only at the address it was given,
and one given none opens no listening socket. This module is the consumer's
side; kvref.pull_registrations the producer's.

What holds (kvprobe's pull probes check each):
- a pull moves exactly the named blocks of every layer and part of a block,
  remote block i into local block i;
- a request that cannot be carried out is refused at the call that receives
  it, naming it: register_read (a block out of range, a uuid or request id
  still in use) or start_read (lists of different lengths, an empty
  endpoint, a local block out of range or named twice or still being
  written, a uuid or request id still in use); a remote block the producer
  has not registered under the uuid is refused by the producer and the pull
  reported failed;
- every accepted pull settles, done or failed, exactly once and within
  timeout_s; a failed one keeps its reason (failure_reason) and leaves the
  consumer's blocks as they were: nothing is written before every byte has
  arrived;
- a registration settles when the consumer reports its pull landed, or when
  timeout_s passes without that (it is then reported done sending: its
  blocks may be freed); a uuid or request id may be used again once settled;
- close() (also when the manager is dropped) fails the pulls in flight on
  both sides, and stops the listener and every thread it started.

Trust (kvref.listener bounds what any client can make a listener hold):
no stream is served longer than timeout_s whatever deadline it asks for,
and a request is no larger than receive_bytes. A pull names its uuid, so
whoever knows a registered uuid can read its blocks: listen only on an
address the peers you trust reach."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

from kvref import metrics
from kvref.endpoints import Route, routes
from kvref.faults import Faults
from kvref.listener import Listener, grpc_module as _grpc, layers_mismatch, peer_channel
from kvref.offsets import block_list, id_problem
from kvref.pull_records import PullRecord, PullRecords
from kvref.proto.pull_pb2 import PullReply, PullRequest, PullSettled, PullSettledReply
from kvref.pull_registrations import SERVICE, Registrations
from kvref.settings import check_parallelism
from kvref.staging import Staging
from kvref.values import request_id, request_uuid

SETTLE_NOTICE_SECONDS = 2.0  # the longest telling the producer a pull settled may take
CLOSE_SECONDS = 5.0  # the longest close() waits for a pull's thread
# Past its deadline a pull cancels the streams still open, and fails a grace
# later whether they ended or not: gRPC has been seen to end neither at its
# deadline nor at a cancel a stream whose producer went away mid-pull. So the
# streams run on daemon threads, which such a stream cannot keep from exiting.
CANCEL_GRACE_S = 0.5
MAX_PULLS = 1024  # pulls in flight at once on one consumer, each a thread
MAX_REASONS = 4096  # failure reasons kept, the oldest dropped first
# A producer whose listener has every call slot taken refuses a stream at once
# (RESOURCE_EXHAUSTED, kvref.listener): the stream asks again after these
# waits, doubling, until the pull's deadline. A connector starts pulls for
# many requests at once, each with several streams.
BUSY_FIRST_WAIT_S, BUSY_LONGEST_WAIT_S = 0.01, 0.2
CONFIRM_WRITES = 3  # writes of a landed pull whose blocks read back otherwise, before it fails


@dataclass
class Pull:
    req_id: str
    uuid: int
    routes: list[Route]
    remote: list[int]
    local: list[int]
    deadline: float
    settled: bool = False
    calls: list = field(default_factory=list)
    thread: threading.Thread | None = None
    refusal: str = ""  # late_refusal: the refusal it should have had
    streams: int = 1  # the pull's parallelism: streams per route, each a contiguous run of its blocks
    record: PullRecord | None = None  # what telemetry keeps of it
    cancelled: bool = False  # its streams were ended by its own deadline or a failed stream
    landed: tuple | None = None  # (local blocks, the bytes written): see _confirm
    began: float = field(default_factory=time.monotonic)  # start_read's time, for the pull's time metric


class PullService:
    """One manager's side of pulls: as producer its registrations
    (kvref.pull_registrations, which its listener serves), as consumer the
    pulls it starts."""

    def __init__(self, staging: Staging, layer_block_bytes: tuple[int, ...], device_blocks: int,
                 timeout_s: float, listener: Listener | None, faults: Faults, confirm_landed: bool = True):
        """`listener`: where the producer's side is served (None: this
        manager does not listen, so it only pulls). `confirm_landed`: read
        each landed pull back before reporting it (see _confirm); needed
        only where a step can write the cache's raw storage behind a pull."""
        self._staging, self._faults, self._confirm_landed = staging, faults, confirm_landed
        self.layer_block_bytes, self.layer_parts = layer_block_bytes, staging.layer_parts
        self.device_blocks, self.timeout_s = device_blocks, timeout_s
        self.registrations = Registrations(staging, layer_block_bytes, device_blocks, timeout_s,
                                           listener is not None, faults)
        self._lock = threading.Lock()
        self._first_routes: list[Route] | None = None  # pull_route_reused's memory
        self.records = PullRecords(faults)
        self._pulls: dict[str, Pull] = {}
        self._done_recving: list[str] = []
        self._landed: dict[str, tuple] = {}  # landed pulls not yet reported: what _confirm needs
        self._failed_recving: list[str] = []
        self.failures: dict[str, str] = {}
        self._closed = False
        self._listener = listener

    def register_read(self, req_id, uuid, block_ids) -> bool:
        return self.registrations.register_read(req_id, uuid, block_ids)

    @property
    def busy(self) -> bool:
        """Pulls in flight or landed and not yet reported, or registrations a
        consumer may still pull: what needs the caches addressed."""
        with self._lock:
            pulling = bool(self._pulls or self._landed)
        return pulling or self.registrations.outstanding

    def start_read(self, req_id, uuid, remote_endpoint, remote_block_ids, local_block_ids,
                   parallelism=1) -> None:
        """Pull the producer's `remote_block_ids` (registered under `uuid`)
        into `local_block_ids`, pairwise, in the background; poll_stats
        reports it done or failed."""
        pull = Pull(req_id, uuid, [], [], [], time.monotonic() + self.timeout_s)
        try:
            pull.req_id, pull.uuid = request_id(req_id), request_uuid(uuid)
            pull.routes = self._routes(remote_endpoint)
            if self._faults.pull_route_reused:
                self._first_routes = pull.routes = self._first_routes or pull.routes
            pull.remote, pull.local = self._pairs(remote_block_ids, local_block_ids)
            pull.streams = min(check_parallelism(parallelism) or 1, len(pull.remote))
            with self._lock:
                self._check_free(pull)
        except (ValueError, TypeError) as e:
            if not self._faults.late_refusal or not isinstance(pull.req_id, str) or pull.req_id in self._pulls:
                raise
            pull.refusal = str(e)
        with self._lock:
            if self._closed:
                raise ValueError("this manager was closed")
            self._pulls[pull.req_id] = pull
        pull.record = PullRecord(pull.uuid, pull.req_id, len(pull.remote), self._pull_bytes(len(pull.remote)),
                                 time.monotonic())
        pull.thread = threading.Thread(target=self._run, args=(pull,), name=f"kvref-pull-{pull.req_id}",
                                       daemon=True)
        try:
            pull.thread.start()
        except RuntimeError as e:  # no thread to be had now (a pids limit, no address space): as if never asked
            with self._lock:
                del self._pulls[pull.req_id]
            raise RuntimeError(f"start_read could not start the pull's thread ({e}); nothing was started") from e
        self.records.add(pull.record)

    def _pull_bytes(self, blocks: int) -> int:
        """What a pull of `blocks` blocks moves: every layer's every part."""
        if self._faults.metrics_uniform_layers:
            return blocks * len(self.layer_parts) * self.layer_parts[0] * self.layer_block_bytes[0]
        return blocks * sum(b * p for b, p in zip(self.layer_block_bytes, self.layer_parts))

    def _routes(self, remote_endpoint) -> list[Route]:
        found = routes(remote_endpoint)
        parts = set(self.layer_parts)
        if len(found) == 1 and found[0].shards is None:
            # One endpoint: every local sub-manager pulls its own parts from it.
            return [Route(found[0].address, group) for group in self._local_groups()]
        if len(parts) != 1:
            raise ValueError(f"layers have {sorted(parts)} parts per block; a pull by parts needs one count")
        named = sorted(p for r in found for p in r.shards)
        if named != list(range(self.layer_parts[0])):
            raise ValueError(f"remote_endpoint's descriptors name parts {named}, but a block here has parts "
                             f"0..{self.layer_parts[0] - 1}: each must come from exactly one endpoint")
        return found

    def _local_groups(self) -> list[tuple[int, ...] | None]:
        """The parts each local sub-manager pulls ([None]: one, pulling every part)."""
        groups = self._listener.groups if self._listener is not None else []
        return list(groups) if len(groups) > 1 else [None]

    def _pairs(self, remote_block_ids, local_block_ids) -> tuple[list[int], list[int]]:
        remote = block_list(remote_block_ids, "remote_block_ids").tolist()
        local = block_list(local_block_ids, "local_block_ids").tolist()
        if len(remote) != len(local):
            raise ValueError(f"remote_block_ids has {len(remote)} blocks but local_block_ids has {len(local)}; "
                             "they pair one to one")
        if not local:
            raise ValueError("the pull names no block (remote_block_ids and local_block_ids are empty)")
        problem = (id_problem(local, "local_block_ids", self.device_blocks, "device blocks")
                   or id_problem(sorted(set(remote)), "remote_block_ids", None, "device blocks"))
        if problem:
            raise ValueError(problem)
        return remote, local

    def _check_free(self, pull: Pull) -> None:
        if len(self._pulls) >= MAX_PULLS:
            raise ValueError(f"{len(self._pulls)} pulls are in flight, the most one manager takes; poll_stats "
                             "until some settle")
        for other in self._pulls.values():
            if other.uuid == pull.uuid:
                raise ValueError(f"uuid {pull.uuid} is still being pulled by request {other.req_id!r}")
            if other.req_id == pull.req_id:
                raise ValueError(f"request {pull.req_id!r} is still being pulled; a request id may be reused "
                                 "once its pull settles")
            busy = sorted(set(other.local) & set(pull.local))
            if busy:
                raise ValueError(f"local blocks {busy[:8]} are still being written by request {other.req_id!r}")

    def _run(self, pull: Pull) -> None:
        grpc = _grpc()
        if pull.refusal:  # late_refusal: accepted, then failed when the deadline passes
            time.sleep(max(0.0, pull.deadline - time.monotonic()))
            return self._settle(pull, False, pull.refusal)
        try:
            received = {}
            for route in pull.routes:
                received.update(self._gather(pull, route))
            pull.record.stamp("last_byte")
            local = sorted(pull.local) if self._faults.pull_pairs_sorted else pull.local
            if self._faults.pull_written_one_block_off:
                local = [(block + 1) % self.device_blocks for block in local]
            pull.record.stamp("writing")
            self._staging.write(local, received, None, pull.deadline)
            if self._confirm_landed:
                pull.landed = (local, received)
            pull.record.stamp("written")
        except grpc.RpcError as e:
            if self._faults.lost_pull_unsettled and e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            if self._faults.lost_peer_seen_at_timeout and e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                time.sleep(max(0.0, pull.deadline - time.monotonic()))
            reason = f"{e.code().name}: {e.details()}"
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() >= pull.deadline:
                reason = f"no complete answer within timeout_s={self.timeout_s}s ({reason})"
            return self._settle(pull, False, reason)
        except Exception as e:  # the pull's own failure, reported as its reason
            return self._settle(pull, False, f"{type(e).__name__}: {e}")
        self._tell_producer(pull)
        self._settle(pull, True)

    def _gather(self, pull: Pull, route: Route) -> dict:
        """Every part this route serves, over the pull's streams at once; the
        first stream to fail, or the deadline, ends the others."""
        spans = self._spans(len(pull.remote), pull.streams)
        ended: queue.SimpleQueue = queue.SimpleQueue()

        def stream(span):
            try:
                ended.put((self._fetch(pull, route, span), None))
            except BaseException as e:  # carried to the pull's thread, which fails the pull with it
                ended.put((None, e))

        for n, span in enumerate(spans):
            try:
                threading.Thread(target=stream, args=(span,), name=f"kvref-pull-{pull.req_id}-{n}",
                                 daemon=True).start()
            except RuntimeError:  # the pull fails with it; the streams started end now
                self._cancel(pull)
                raise
        received, end = {}, pull.deadline + CANCEL_GRACE_S
        for _ in spans:
            while True:
                try:
                    part, error = ended.get(timeout=max(0.0, end - time.monotonic()))
                    break
                except queue.Empty:
                    if pull.cancelled:
                        raise TimeoutError(f"no complete answer within timeout_s={self.timeout_s}s, and a stream "
                                           "cancelled then did not end") from None
                    self._cancel(pull)
                    end = time.monotonic() + CANCEL_GRACE_S
            if error is not None:
                self._cancel(pull)
                raise error
            received.update(part)
        return received

    def _cancel(self, pull: Pull) -> None:
        with self._lock:
            pull.cancelled = True
            for call in pull.calls:
                call.cancel()

    def _spans(self, blocks: int, streams: int) -> list[tuple[int, int]]:
        """`streams` contiguous runs that cover positions 0..blocks-1, the
        first ones a block longer where they do not divide."""
        size, longer = divmod(blocks, streams)
        if self._faults.parallel_pull_drops_remainder:
            longer = 0
        starts = [i * size + min(i, longer) for i in range(streams + 1)]
        return list(zip(starts, starts[1:]))

    def _fetch(self, pull: Pull, route: Route, span: tuple[int, int]) -> dict:
        """Every part of the blocks at positions `span` this route serves, in
        one stream, checked for place and size; asked again while the
        producer is too busy to take the stream (BUSY_FIRST_WAIT_S)."""
        grpc = _grpc()
        wait = BUSY_FIRST_WAIT_S
        while True:
            try:
                return self._fetch_once(pull, route, span)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or self._closed \
                        or time.monotonic() + wait >= pull.deadline:
                    raise
            _wait_for_busy_producer(wait)
            wait = min(2 * wait, BUSY_LONGEST_WAIT_S)

    def _fetch_once(self, pull: Pull, route: Route, span: tuple[int, int]) -> dict:
        first, end = span
        # A run of the producer's never holds more blocks than the pull asked for.
        with peer_channel(route.address, (end - first) * max(self.layer_block_bytes)) as channel:
            call = channel.unary_stream(f"/{SERVICE}/Pull", request_serializer=PullRequest.SerializeToString,
                                        response_deserializer=PullReply.FromString)(
                PullRequest(uuid=pull.uuid, req_id=pull.req_id, block_ids=pull.remote[first:end],
                            shards=route.shards or ()),
                timeout=max(0.001, pull.deadline - time.monotonic()))
            with self._lock:
                pull.calls.append(call)
                if self._closed or pull.cancelled:
                    call.cancel()
            replies = iter(call)
            header = next(replies).header
            pull.record.stamp("connected")
            mismatch = layers_mismatch(header, self.layer_block_bytes, self.layer_parts,
                                       f"the producer at {route.address}")
            if mismatch:
                raise ValueError(mismatch)
            parts = route.shards or range(self.layer_parts[0])
            expected = {(layer, part, i) for layer in range(len(self.layer_parts)) for part in parts
                        for i in range(first, end)}
            received = {}
            if self._faults.pull_bytes_per_stream:  # each stream counts the whole pull's bytes
                metrics.LEDGER.count(metrics.RECEIVED_BYTES, self._pull_bytes(len(pull.remote)))
            for reply in replies:
                run = reply.block
                if not self._faults.pull_bytes_per_stream:
                    metrics.LEDGER.count(metrics.RECEIVED_BYTES, len(run.data))
                size = self.layer_block_bytes[run.layer] if 0 <= run.layer < len(self.layer_parts) else 0
                count = len(run.data) // size if size and len(run.data) % size == 0 else 0
                keys = [(run.layer, run.shard, first + run.position + j) for j in range(count)]
                if not keys or any(key not in expected or key in received for key in keys):
                    raise ValueError(f"the producer sent {len(run.data)} bytes for layer {run.layer} part "
                                     f"{run.shard} from position {run.position}, which is not a run of whole "
                                     "blocks the pull asked for and did not have yet")
                data = memoryview(run.data)
                for j, key in enumerate(keys):
                    received[key] = data[j * size:(j + 1) * size]
                if self._faults.partial_pull_written:  # each run lands as it arrives
                    self._staging.write([pull.local[key[2]] for key in keys],
                                        {(run.layer, run.shard, j): received[key] for j, key in enumerate(keys)},
                                        [run.shard], pull.deadline, layers=[run.layer])
            if len(received) != len(expected):
                raise ValueError(f"the producer's answer ended after {len(received)} of {len(expected)} block "
                                 "parts")
            return received

    def _tell_producer(self, pull: Pull) -> None:
        """That the pull landed; best effort: a producer that does not hear it
        settles at its deadline."""
        grpc = _grpc()
        for route in pull.routes:
            try:
                with peer_channel(route.address, 0) as channel:
                    channel.unary_unary(f"/{SERVICE}/Settled", request_serializer=PullSettled.SerializeToString,
                                        response_deserializer=PullSettledReply.FromString)(
                        PullSettled(uuid=pull.uuid, landed=True), timeout=SETTLE_NOTICE_SECONDS)
            except grpc.RpcError:
                pass

    def _settle(self, pull: Pull, done: bool, reason: str = "") -> None:
        with self._lock:
            if pull.settled:
                return
            pull.settled = True
            if pull.record is not None:
                pull.record.stamp("settled")
            if self._pulls.get(pull.req_id) is pull:
                del self._pulls[pull.req_id]
            if not done or self._faults.landed_pull_counts_failure:
                metrics.LEDGER.count(metrics.FAILURES, 1)
            if not done:
                self._note_failure(pull.req_id, reason)
            else:
                metrics.LEDGER.pull_landed(pull.began)
                if pull.landed is not None:
                    self._landed[pull.req_id] = pull.landed
            if not self._faults.pull_never_reports:
                (self._done_recving if done else self._failed_recving).append(pull.req_id)

    def _note_failure(self, req_id: str, reason: str) -> None:
        self.failures.pop(req_id, None)
        self.failures[req_id] = reason
        if len(self.failures) > MAX_REASONS:
            del self.failures[next(iter(self.failures))]

    # -- both --------------------------------------------------------------

    def poll_stats(self) -> tuple[list[str], list[str], list[str]]:
        """(done_sending, done_recving, failed_recving) since the last poll,
        each request once."""
        sent = self.registrations.done_sending()
        with self._lock:
            done, failed = list(self._done_recving), list(self._failed_recving)
            landed = {req_id: self._landed.pop(req_id) for req_id in done if req_id in self._landed}
            if not self._faults.duplicate_reports:
                for reported in (self._done_recving, self._failed_recving):
                    reported.clear()
        for req_id, landing in landed.items():
            problem = self._confirm(*landing)
            if problem:
                done.remove(req_id)
                failed.append(req_id)
                with self._lock:
                    self._note_failure(req_id, problem)
        return sent, done, failed

    def _confirm(self, local: list[int], received: dict) -> str:
        """A landed pull's blocks read back, and written again where they
        differ from what the pull wrote; the problem, or "".

        A JAX CPU step copies the whole cache through itself, and XLA may
        keep its temporaries in the cache's memory meanwhile; run inline on
        the serving thread, its donated input reads as deleted only once it
        has run. So a pull written during a step can be undone, and the
        pull's own check after writing can come before the step ends.
        poll_stats runs on the serving thread between its steps, once the
        manager has re-addressed the caches: what it reads has settled, and
        the blocks are the pull's until reported."""
        deadline = time.monotonic() + self.timeout_s
        try:
            for _ in range(CONFIRM_WRITES):
                if self._holds(local, received, deadline):
                    return ""
                self._staging.write(local, received, None, deadline)
        except Exception as e:  # noqa: BLE001 (said as the pull's failure)
            return f"the pull landed, and reading its blocks back or writing them again failed: {e}"
        return (f"the pull landed, and its blocks held other bytes after each of {CONFIRM_WRITES} writes "
                "(something else writes them)")

    def _holds(self, local: list[int], received: dict, deadline: float) -> bool:
        """Whether device blocks `local` hold what the pull received, every layer and part."""
        for (layer, part, start), run in self._staging.read(local, None, deadline):
            size = self.layer_block_bytes[layer]
            if any(run[j * size:(j + 1) * size] != received[layer, part, start + j]
                   for j in range(len(run) // size)):
                return False
        return True

    def close(self) -> None:
        """Fail every pull in flight and wait for the pulls' threads (the
        listener is stopped by its owner)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._landed.clear()
            pulls = list(self._pulls.values())
            for call in itertools.chain.from_iterable(p.calls for p in pulls):
                call.cancel()
        for pull in pulls:
            self._settle(pull, False, "the manager was closed while the pull was in flight")
            if pull.thread is not None and pull.thread is not threading.current_thread():
                pull.thread.join(CLOSE_SECONDS)


def _wait_for_busy_producer(seconds: float) -> None:
    time.sleep(seconds)
