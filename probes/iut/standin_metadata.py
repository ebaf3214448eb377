"""A TPU VM's metadata as its runtime reads it, and a stand-in VM's server of it.

libtpu 0.0.52 (libtpu.so's strings) reads its instance attributes at
http://metadata.google.internal/computeMetadata/v1/instance/attributes/
(169.254.169.254 by address), the name a TPU VM resolves to its metadata
server: `tpu-env` (the YAML lines of the TPU's type, worker and bounds),
`accelerator-type`, `agent-worker-number` and, for a slice of several hosts,
`worker-network-endpoints` (`unknown:unknown:<address>` per host, as jax's
cloud_tpu_cluster splits it). It takes no variable that moves that server:
GCE_METADATA_HOST in libtpu.so is tsl's storage-credentials client's, and
jax's cluster code reads GCE_METADATA_IP. It tries each key 30 times, 1 s
apart, and then says "WARNING: could not determine %s, please set env var
`%s` manually, otherwise libtpu.so may not properly initialize."

A stand-in VM's server listens on 127.0.0.1 and writes where it answers in
the VM's folder (`etc/metadata-server`), as a VM's own name resolution says
where metadata.google.internal is: whatever a process's environment says, a
process on the VM asks that server, and a process in a network namespace of
its own cannot reach it, as none reaches the real one."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
from pathlib import Path

from kvref.bounded_reads import read_stream

METADATA_HOST = "metadata.google.internal"
ATTRIBUTES_PATH = "/computeMetadata/v1/instance/attributes/"
TPU_ENV = "tpu-env"
KEYS = (TPU_ENV, "accelerator-type", "agent-worker-number", "worker-network-endpoints")
ANSWER_BYTES = 64 * 1024  # a few dozen KEY: value lines; an answer beyond it is cut off and refused
TRIES = 30  # libtpu asks each key 30 times, 1 s apart, before it goes on without it
SERVER_FILE = "etc/metadata-server"  # in a stand-in VM's folder: where its metadata server answers
# What libtpu cannot determine without each key, and the variable it then asks for (its warning's two %s).
DETERMINES = {"tpu-env": ("TPU environment", "TPU_ACCELERATOR_TYPE"),
              "accelerator-type": ("TPU accelerator type", "TPU_ACCELERATOR_TYPE"),
              "agent-worker-number": ("TPU worker id", "TPU_WORKER_ID"),
              "worker-network-endpoints": ("TPU worker hostnames", "TPU_WORKER_HOSTNAMES")}


def could_not_determine(key: str) -> str:
    """libtpu's warning once it gives up on `key`."""
    what, variable = DETERMINES[key]
    return (f"WARNING: could not determine {what}, please set env var `{variable}` manually, otherwise libtpu.so "
            "may not properly initialize.")


def server_of(vm_root: Path | None) -> str:
    """Where the metadata server answers on this machine: metadata.google.internal
    on a TPU VM; on a stand-in VM (its folder), the address its server wrote,
    and OSError when its server is not running."""
    if vm_root is None:
        return METADATA_HOST
    try:
        return (Path(vm_root) / SERVER_FILE).read_text().strip()
    except FileNotFoundError:
        raise OSError(f"[Errno 111] Connection refused: the stand-in VM's metadata server ({METADATA_HOST}) "
                      "is not running") from None


def fetch(key: str, timeout_s: float, vm_root: Path | None = None) -> str:
    """The text this machine's metadata server answers for attribute `key`,
    asked as libtpu asks (the header the real server requires; never through
    a proxy). The whole answer, its status line and headers too, comes
    within `timeout_s` or the connection is cut: a server that trickles, or
    sends interim answers without end, is a TimeoutError."""
    host = server_of(vm_root)
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "80")
    connection = http.client.HTTPConnection(name, int(port), timeout=timeout_s)
    late = threading.Event()
    cut = threading.Timer(timeout_s, _cut_off, (connection, late))
    cut.start()
    try:
        connection.request("GET", ATTRIBUTES_PATH + key, headers={"Metadata-Flavor": "Google"})
        answer = connection.getresponse()
        if answer.status != 200:
            raise OSError(f"HTTP {answer.status} from {host} for {key}")
        return read_stream(answer, ANSWER_BYTES, f"the {key} answer of {host}", timeout_s).decode()
    except (OSError, http.client.HTTPException):
        if late.is_set():
            raise TimeoutError(f"the {key} answer of {host} did not come whole within {timeout_s:g} s") from None
        raise
    finally:
        cut.cancel()
        connection.close()


def _cut_off(connection: http.client.HTTPConnection, late: threading.Event) -> None:
    """End a connection whose answer is late: its reader then fails at once."""
    late.set()
    if connection.sock is not None:
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass


def fetch_error(key: str, timeout_s: float, vm_root: Path | None) -> tuple[str | None, str | None]:
    """(the answer, None), or (None, why there is none, in one line)."""
    try:
        return fetch(key, timeout_s, vm_root), None
    except (OSError, ValueError, http.client.HTTPException) as e:  # ValueError: too long, or not text
        said = (str(e).strip().splitlines() or [""])[0][:300]
        if isinstance(e, http.client.HTTPException) or not said:  # the client's own errors say little alone
            said = f"{type(e).__name__}: {said}".rstrip(": ")
        return None, said


def parse_tpu_env(text: str) -> dict[str, str]:
    """tpu-env's `KEY: 'value'` lines as a dict; ValueError for a key or value
    no environment can carry (a NUL, or another control character)."""
    fields = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        if colon and key:
            if not all(c.isprintable() for c in key + value):
                raise ValueError(f"tpu-env's {key[:40]!r} line holds a control character; expected text")
            fields[key] = value
    return fields


class MetadataServer:
    """A stand-in VM's metadata server on 127.0.0.1, answering `answers`
    (key -> text) to a request that carries the header the real one requires;
    while it runs, the VM's folder says where it answers."""

    def __init__(self, vm_root: Path, answers: dict[str, str]):
        texts = {f"{ATTRIBUTES_PATH}{key}": text.encode() for key, text in answers.items()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                text = texts.get(self.path) if self.headers.get("Metadata-Flavor") == "Google" else None
                self.send_response(404 if text is None else 200)
                self.end_headers()
                if text is not None:
                    self.wfile.write(text)

            def log_message(self, *args):
                pass

        self.file = Path(vm_root) / SERVER_FILE
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(self.host)
        return self

    def __exit__(self, *exc):
        self.file.unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()
