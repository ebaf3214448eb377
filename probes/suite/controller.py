"""A stand-in for a serving fleet's controller: a process of its own
serving tpu-sync's RegisterWorker on loopback (kvref/proto/controller.proto),
which says each registration it receives on its stdout as one JSON line and
accepts it. It runs apart from the manager under test because a controller
in the same process deadlocks the production wrapper: its constructor holds
the GIL while it waits for the controller's answer."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent import futures

START_S = 30.0  # for the stand-in to import grpc and say its port, on a loaded machine
LIFETIME_S = 300.0  # a stand-in whose parent never closes it exits by itself
PORT_LINE = "PORT"


class StandinController:
    """`with StandinController() as controller:` a live controller at
    `controller.address`; `controller.registrations(n, within_s)` the first
    n registrations it received, each a dict of RegisterWorkerRequest's
    fields (protobuf's JSON names), fewer if fewer came within the time."""

    def __enter__(self) -> "StandinController":
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self._process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env)
        self._received: list[dict] = []
        self._unread = b""
        line = self._line(time.monotonic() + START_S)
        if not line or not line.startswith(PORT_LINE):
            self.__exit__(None, None, None)
            raise RuntimeError(f"the stand-in controller did not start within {START_S:.0f} s (it said {line!r})")
        self.address = f"127.0.0.1:{int(line.split()[1])}"
        return self

    def registrations(self, count: int, within_s: float) -> list[dict]:
        deadline = time.monotonic() + within_s
        while len(self._received) < count:
            line = self._line(deadline)
            if line is None:
                break
            self._received.append(json.loads(line))
        return self._received[:count]

    def _line(self, deadline: float) -> str | None:
        """The stand-in's next line, or None at the deadline or its end. Read
        unbuffered: a buffered reader could hold a line select() never sees."""
        fd = self._process.stdout.fileno()
        while b"\n" not in self._unread:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            more = os.read(fd, 1 << 16)
            if not more:
                return None
            self._unread += more
        line, _, self._unread = self._unread.partition(b"\n")
        return line.decode()

    def __exit__(self, *exc) -> None:
        self._process.stdin.close()  # the stand-in's signal to end
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


def _serve() -> None:
    import grpc
    from google.protobuf import json_format

    from kvref.proto import controller_pb2
    from kvref.worker_registration import SERVICE

    lock = threading.Lock()

    def register(request, context):
        with lock:
            print(json.dumps(json_format.MessageToDict(request, preserving_proto_field_name=True)), flush=True)
        return controller_pb2.RegisterWorkerResponse(success=True)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "RegisterWorker": grpc.unary_unary_rpc_method_handler(
            register, request_deserializer=controller_pb2.RegisterWorkerRequest.FromString,
            response_serializer=controller_pb2.RegisterWorkerResponse.SerializeToString)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"{PORT_LINE} {port}", flush=True)
    select.select([sys.stdin], [], [], LIFETIME_S)  # until the parent closes stdin (or dies)
    server.stop(0)


if __name__ == "__main__":
    _serve()
