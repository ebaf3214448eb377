"""A worker's own endpoint and its registration with the serving fleet's
controller, as tpu-sync's wrapper makes them from `raiden_worker_port`,
`raiden_controller_address`, `worker_id` and `node_id`.

- The worker listens only once a controller is named: without one nothing
  would ever call it, and a listening port nobody drives is only a door.
- One worker per process, as the production worker is: every manager after
  the first registers the same worker endpoint, and one that names another
  port is refused (the production library silently gives it the first's).
  A forked child does not inherit the worker: its server's threads stayed in
  the parent, so the child makes its own.
- The registration is one call, `tpu_sync.proto.RaidenControllerService/
  RegisterWorker` (proto/controller.proto), bounded by `REGISTER_DEADLINE_S`.
  A controller that cannot be reached, or refuses, is logged and the manager
  serves on: offloads and pulls need no controller, so a controller that is
  down must not take a serving host down with it.
- The reference serves no controller commands (buffer creation, transfer
  programs): its worker answers every call UNIMPLEMENTED."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import grpc

from kvref.endpoints import address, port_of
from kvref.faults import Faults
from kvref.listener import peer_channel, peer_server
from kvref.values import integer

REGISTER_DEADLINE_S = 5.0  # one registration call; past it the controller counts as unreachable
DEFAULT_WORKER_ID = "worker_0"  # the production wrapper's when none is given
MAX_WORKER_ID = 256  # characters: an id goes into the controller's tables and logs
SERVICE = "tpu_sync.proto.RaidenControllerService"
LOG = logging.getLogger(__name__)
WORKER_RECEIVE_BYTES = 64 * 1024  # the worker serves no call yet: nothing a stranger sends is held beyond this


@dataclass(frozen=True)
class Registration:
    """What a worker tells its controller: who it is, where its managers
    serve pulls (each endpoint with the parts of a block it holds), and the
    bytes of one block of each layer."""

    worker_id: str
    node_id: int
    transfer_endpoints: tuple[tuple[str, tuple[int, ...]], ...]
    block_bytes: tuple[int, ...]
    shards: int


def check_worker_id(value) -> str:
    if value is None:
        return DEFAULT_WORKER_ID
    if not isinstance(value, str) or not value or len(value) > MAX_WORKER_ID or not value.isprintable():
        raise ValueError(f"worker_id must be printable text of 1 to {MAX_WORKER_ID} characters, got {value!r}")
    return value


def check_controller(value) -> str | None:
    return None if value is None else address(value, "raiden_controller_address")


class _Worker:
    """The process's worker server: bound, started, and serving nothing."""

    def __init__(self, host: str, port: int):
        self.pid = os.getpid()
        self.server = peer_server(1, WORKER_RECEIVE_BYTES)  # serves nothing yet: the controller's calls to come
        try:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:  # grpc raises this when the port cannot be bound (older ones return 0)
            self.port, problem = 0, str(e)
        else:
            problem = "the port is taken"
        if not self.port:
            raise ValueError(f"raiden_worker_port={port}: cannot listen on {host}:{port} ({problem})")
        self.server.start()
        self.endpoint = f"{host}:{self.port}"


_worker: _Worker | None = None
_lock = threading.Lock()


def worker_endpoint(host: str, port, faults: Faults = Faults()) -> str:
    """The process's worker endpoint on `host`, listening from the first
    call; `port` 0: any free port. ValueError when the worker listens on
    another port than a nonzero `port`, or cannot listen there."""
    global _worker
    port = integer(port, "raiden_worker_port", 0, 65535)
    with _lock:
        if _worker is None or _worker.pid != os.getpid():
            _worker = _Worker(host, 0 if faults.worker_port_ignored else port)
        elif port and port != _worker.port and not faults.worker_port_shared:
            raise ValueError(f"raiden_worker_port={port}: this process's worker already listens on "
                             f"{_worker.endpoint} (one worker per process); pass 0 or {_worker.port}")
        return _worker.endpoint


def register(controller: str, worker: str, registration: Registration, wait_for_controller_s: float = 0.0) -> str:
    """Send `registration` for the worker at `worker` to `controller`; ""
    once the controller accepted it, else why not (also logged).
    `wait_for_controller_s`: the fault model that waits for an unreachable
    controller to come up, as long as that."""
    from kvref.proto import controller_pb2

    request = controller_pb2.RegisterWorkerRequest(
        worker_id=registration.worker_id, raiden_worker_endpoint=worker, node_id=registration.node_id,
        block_array_bytes=registration.block_bytes, num_kv_shards=registration.shards,
        raiden_transfer_endpoints=[controller_pb2.RaidenTransferEndpointProto(endpoint=e, shards=s)
                                   for e, s in registration.transfer_endpoints])
    with peer_channel(controller, 0) as channel:  # no proxy a serving process's environment names
        call = channel.unary_unary(f"/{SERVICE}/RegisterWorker",
                                   request_serializer=controller_pb2.RegisterWorkerRequest.SerializeToString,
                                   response_deserializer=controller_pb2.RegisterWorkerResponse.FromString)
        try:
            reply = call(request, timeout=max(REGISTER_DEADLINE_S, wait_for_controller_s),
                         wait_for_ready=wait_for_controller_s > 0)
        except grpc.RpcError as e:
            problem = f"{e.code().name}: {e.details()}"
        else:
            problem = "" if reply.success else f"refused: {reply.error_message or 'no reason given'}"
    if problem:
        LOG.warning("worker %s (%s) could not register with the controller at %s: %s", registration.worker_id,
                    worker, controller, problem)
    return problem


def worker_port(endpoint: str | None) -> int:
    """The port of a worker endpoint, 0 for none (the production wrapper's "no worker")."""
    return 0 if endpoint is None else port_of(endpoint)
