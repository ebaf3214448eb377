"""A manager's listener: the gRPC servers its peers call, one per
sub-manager on consecutive ports, each serving its share of the parts of a
block, for every service the manager offers over the network (pulls,
kvref.pulls; host-to-host transfers, kvref.host_transfers).

Trust: a listener serves whoever reaches its address. What any client can
make it hold is bounded (peer_server, also the worker's server): a message
no larger than its services carry (each service's receive_bytes),
SERVER_THREADS calls at once (more are refused at once with
RESOURCE_EXHAUSTED), MOST_CONNECTIONS connections, idle ones closed and
silent peers dropped by keepalive. Each service bounds how long it serves one call.
Listen only on an address the peers you trust reach (the reference's tests
and probes: loopback)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kvref.endpoints import port_of, with_port
from kvref.faults import Faults

# Calls one server serves at once. A pull that waits for its registration holds one for up to its timeout_s, and
# a pull of parallelism 4 asks 4: at 4, one such pull kept every other pull out until its deadline.
SERVER_THREADS = 16
WORKERS_START_SECONDS = 30.0  # for a server's threads to start, on a machine that is slow to give them
CLOSE_SECONDS = 5.0  # the longest stopping one server waits
# Connections one server keeps at once: a stranger's idle ones cannot take every descriptor
# of the process (1,024 by default); a peer opens a few.
MOST_CONNECTIONS = 64
SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.max_send_message_length", -1),
                  ("grpc.max_connection_idle_ms", 30_000), ("grpc.keepalive_time_ms", 10_000),
                  ("grpc.keepalive_timeout_ms", 5_000), ("grpc.max_allowed_incoming_connections", MOST_CONNECTIONS)]
REPLY_FRAMING_BYTES = 64 * 1024  # of a peer's message, besides the block bytes it carries
MOST_MESSAGE_BYTES = 2**31 - 1  # what gRPC can carry in one message at all


def grpc_module():
    """gRPC, imported by the first manager that listens or calls a peer: a
    manager that only offloads (and every probe worker forked from a warm
    parent, which carries what it imported to its exit) never loads it."""
    import grpc

    return grpc


def peer_channel(address: str, most_reply_bytes: int):
    """The one way kvref opens a channel to a peer: never through a proxy, to
    the address given only, and taking no message larger than what the call
    can legitimately be answered with (`most_reply_bytes` of block bytes, and
    their framing): a peer's oversized answer fails the call before it is held.
    Its connections are its own (a local subchannel pool): gRPC otherwise
    shares one per address across channels, with its backoff, so a channel
    left open to a peer that went away (a stream stuck past its cancel) makes
    a new listener on the same port look refused to every later channel."""
    limit = min(MOST_MESSAGE_BYTES, most_reply_bytes + REPLY_FRAMING_BYTES)
    return grpc_module().insecure_channel(address, options=[
        ("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1),
        ("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)])


def peer_server(threads: int, receive_bytes: int, reuse_port: bool = False):
    """The one way kvref serves peers: `threads` calls at once (more are
    refused at once, RESOURCE_EXHAUSTED), no message larger than
    `receive_bytes`, at most MOST_CONNECTIONS connections, idle ones closed
    and silent peers dropped by keepalive; `reuse_port`: the port shared (a
    fault model's)."""
    options = [*SERVER_OPTIONS, ("grpc.max_receive_message_length", receive_bytes)]
    if reuse_port:
        options = [(k, 1 if k == "grpc.so_reuseport" else v) for k, v in options]
    return grpc_module().server(_started_workers(threads), options=options, maximum_concurrent_rpcs=threads)


def _started_workers(threads: int) -> ThreadPoolExecutor:
    """An executor whose `threads` threads all run from the start. grpc's
    server thread submits each call to it: a submit that had to start a
    thread and could not (a pids limit, a full address space) would end that
    server thread, and the server with it, for good. Here a thread that
    cannot start fails the construction, saying so."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="kvref-listen")
    all_started = threading.Barrier(threads + 1, timeout=WORKERS_START_SECONDS)
    try:
        for _ in range(threads):  # each finds no idle thread, so starts one
            pool.submit(all_started.wait)
    except RuntimeError as e:
        all_started.abort()
        pool.shutdown(wait=False)
        raise RuntimeError(f"a listener could not start its {threads} threads ({e}); nothing listens") from None
    all_started.wait()
    return pool


def layers_mismatch(header, layer_block_bytes, layer_parts, who: str) -> str:
    """'' when a peer's header (its layers' bytes per block and parts) is
    this manager's; else the difference, naming the peer `who`."""
    theirs = (list(header.layer_block_bytes), list(header.layer_shards))
    ours = (list(layer_block_bytes), list(layer_parts))
    if theirs == ours:
        return ""
    return (f"{who} has layers of {theirs[0]} bytes per block in {theirs[1]} parts; this manager's are "
            f"{ours[0]} in {ours[1]}")


class Service(Protocol):
    receive_bytes: int  # the largest message a client sends it

    def handlers(self, parts: tuple[int, ...]):
        """Its gRPC handlers for a listener serving `parts` of a block."""


class Listener:
    def __init__(self, where: str, sub_managers: int, parts: int, faults: Faults = Faults()):
        """`where` 'host:port' (port 0: any free one) and `sub_managers`, as
        ManagerSettings checked them: servers on consecutive ports from it,
        splitting a block's `parts` among them."""
        self.where, self._faults = where, faults
        if not 1 <= sub_managers <= parts:
            raise ValueError(f"sub_managers must be in [1, {parts}] (the parts of a block), got {sub_managers}")
        self.groups = [tuple(range(parts))[i::sub_managers] for i in range(sub_managers)]
        self._servers: list[tuple[object, str, tuple[int, ...]]] = []

    def start(self, services: list[Service]) -> None:
        base = port_of(self.where)
        receive = max(s.receive_bytes for s in services)
        try:
            for i, group in enumerate(self.groups):
                server = peer_server(SERVER_THREADS, receive, self._faults.shared_listen_port)
                server.add_generic_rpc_handlers([s.handlers(group) for s in services])
                asked = with_port(self.where, base + i if base and not self._faults.named_port_ignored else 0)
                try:
                    port = server.add_insecure_port(asked)
                except RuntimeError as e:
                    if not self._faults.busy_port_falls_back:
                        raise OSError(f"cannot listen at {asked}: {e}") from None
                    port = 0
                if not port and self._faults.busy_port_falls_back:
                    port = server.add_insecure_port(with_port(self.where, 0))
                if not port:
                    raise OSError(f"cannot listen at {asked} (in use, or not this machine's address)")
                server.start()
                self._servers.append((server, with_port(self.where, port), group))
        except BaseException:
            self.stop()
            raise

    def endpoints(self) -> list[dict]:
        """Each server's address and the parts of a block it serves."""
        return [{"endpoint": where, "shards": list(parts)} for _, where, parts in self._servers]

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    def stop(self) -> None:
        """Stop every server, ending the calls it serves."""
        for server, _, _ in self._servers:
            server.stop(grace=0).wait(CLOSE_SECONDS)
        self._servers = []
