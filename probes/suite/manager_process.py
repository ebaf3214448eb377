"""A pull manager in a process of its own, so that a contract sequence can
kill it (SIGKILL: no clean exit, as a host's process dies) or close it, and
start another in its place: a producer whose consumers survive it, or a
consumer whose producer does. The child builds the IUT's caches and pull
manager as the worker builds them, in the worker's environment and network
namespace, and answers the PullManager calls a sequence makes (and the
bytes of its caches' blocks, read as the worker reads its own) over its
stdin and stdout, one JSON line each way. Every answer is awaited for a
bounded time; a child that does not answer is ManagerGone."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import kvref
from probes.suite.leftovers import Holdings

MODULE = "probes.suite.manager_process"
START_S = 120.0  # the child's imports, its device runtime and its manager's start (a loaded machine)
ANSWER_S = 30.0  # one call's answer
EXIT_S = 10.0  # a closed child's exit, before it is killed
ROOT = str(Path(__file__).resolve().parents[2])  # where `probes` is imported from, for the child


class ManagerGone(RuntimeError):
    """The manager's process ended, or did not answer within its bound."""


class PeerError(Exception):
    """What a call raised in the manager's process: its type, message, and
    whether the IUT's library calls it a clean refusal there."""

    def __init__(self, kind: str, message: str, refused: bool):
        super().__init__(f"{kind}: {message}")
        self.refused = refused


class ManagerProcess:
    """The manager's process, seen as the PullManager calls a sequence makes."""

    def __init__(self, iut, key: kvref.ShapeKey, seeds: list[int], port: int, timeout_s: float, max_blocks: int):
        self.key = key
        self._holdings: Holdings | None = None  # what it held as it went (_note_holdings)
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
        self._child = subprocess.Popen([sys.executable, "-m", MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=self._stderr, env=env, cwd=ROOT)
        setup = {"iut": iut.name, "generation": iut.generation, "faults": list(iut.faults.names),
                 "options": iut.options, "key": str(key), "seeds": seeds, "port": port, "timeout_s": timeout_s,
                 "max_blocks": max_blocks}
        try:
            self.endpoints = self._call(setup, START_S)["endpoints"]
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._child.pid

    def register_read(self, req_id: str, uuid: int, block_ids) -> bool:
        return self._call({"op": "register", "req": req_id, "uuid": uuid, "blocks": list(block_ids)})["said"]

    def start_read(self, req_id: str, uuid: int, remote_endpoint, remote_block_ids, local_block_ids,
                   parallelism: int = 1) -> None:
        self._call({"op": "start_read", "req": req_id, "uuid": uuid, "endpoint": remote_endpoint,
                    "remote": list(remote_block_ids), "local": list(local_block_ids), "parallelism": parallelism})

    def poll_stats(self) -> tuple[list[str], list[str], list[str]]:
        said = self._call({"op": "poll"})
        return said["sending"], said["done"], said["failed"]

    def failure(self, req_id: str) -> str:
        """Why a pull failed, as the library says it (probes.iut.protocol.PullLibrary.pull_failure)."""
        return self._call({"op": "failure", "req": req_id})["why"]

    def fetch(self, layer: int) -> np.ndarray:
        """One layer's cache as its next reader sees it (probes.iut.protocol.Arrays.fetch)."""
        held = bytes.fromhex(self._call({"op": "fetch", "layer": layer})["bytes"])
        return np.frombuffer(held, kvref.element_type(self.key.dtype).numpy).reshape(self.key.dims)

    def get_local_endpoints(self) -> list[dict]:
        return self.endpoints

    def close(self) -> None:
        """A clean exit: the manager closed as its library closes one, then the process ends."""
        self._note_holdings()
        if self._child.poll() is None:
            try:
                self._call({"op": "close"})
                self._child.wait(EXIT_S)
            except (ManagerGone, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL: nothing of the library runs again in that process."""
        self._note_holdings()
        if self._child.poll() is None:
            self._child.send_signal(signal.SIGKILL)
        self._child.wait()
        for pipe in (self._child.stdin, self._child.stdout):
            pipe.close()
        self._stderr.close()

    def holdings(self) -> Holdings:
        """What the process holds now (probes.suite.leftovers)."""
        return Holdings.of(self._child.pid)

    def left_behind(self, besides: Holdings | None = None) -> list[str]:
        """What the process held as it went (probes.suite.leftovers) that is
        still there now it is gone, and not among `besides` (what the process
        that took its place holds)."""
        if self._holdings is None or self._child.poll() is None:
            return []
        return self._holdings.left(besides)

    def _note_holdings(self) -> None:
        """What the process holds, while it still lives (once: a second going finds it gone)."""
        if self._child.poll() is None and self._holdings is None:
            self._holdings = Holdings.of(self._child.pid)

    def _call(self, message: dict, seconds: float = ANSWER_S) -> dict:
        try:
            self._child.stdin.write((json.dumps(message) + "\n").encode())
            self._child.stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            raise ManagerGone(f"the manager's process is gone ({self._said()})") from e
        line = self._line(time.monotonic() + seconds)
        answer = json.loads(line)
        if "error" in answer:
            raise PeerError(answer["kind"], answer["error"], answer["refused"])
        return answer

    def _line(self, deadline: float) -> bytes:
        out, line = self._child.stdout, b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise ManagerGone(f"the manager's process did not answer in time ({self._said()})")
            chunk = os.read(out.fileno(), 1 << 16)
            if not chunk:
                try:
                    code = self._child.wait(EXIT_S)
                except subprocess.TimeoutExpired:
                    code = "none yet"
                raise ManagerGone(f"the manager's process ended (exit {code}; {self._said()})")
            line += chunk
        return line

    def _said(self) -> str:
        """The last line the child wrote to its stderr."""
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        except ValueError:  # closed
            return "its stderr is closed"
        return lines[-1][:300] if lines else "it wrote nothing to its stderr"


def serve() -> None:
    """The child: build the manager the setup line names, then answer each
    call until `close` or the end of stdin. Its answers go to the stdout it
    was given; whatever the library prints goes to its stderr."""
    from probes.iut.registry import adapter_for

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def _answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    setup = json.loads(sys.stdin.readline())
    iut = adapter_for(setup["iut"], setup["generation"], kvref.Faults.parse(setup["faults"], environ={}),
                      setup["options"])
    key = kvref.ShapeKey.parse(setup["key"])
    caches = [c for c, _ in iut.make_caches(key, setup["seeds"], "put", finite=True)]
    lib = iut.library
    if setup["port"]:
        manager = lib.port_manager(caches, setup["port"], setup["timeout_s"], setup["max_blocks"])
    else:
        manager = lib.pull_manager(caches, "slots", True, setup["timeout_s"], setup["max_blocks"])
    _answer({"endpoints": manager.get_local_endpoints()})
    calls = {
        "register": lambda call: {"said": manager.register_read(call["req"], call["uuid"], call["blocks"])},
        "start_read": lambda call: {"said": manager.start_read(call["req"], call["uuid"], call["endpoint"],
                                                               call["remote"], call["local"], call["parallelism"])},
        "poll": lambda call: dict(zip(("sending", "done", "failed"), map(list, manager.poll_stats()))),
        "failure": lambda call: {"why": lib.pull_failure(manager, call["req"])},
        "fetch": lambda call: {"bytes": iut.fetch(caches[call["layer"]]).tobytes().hex()},
    }
    for line in sys.stdin:
        call = json.loads(line)
        if call["op"] == "close":
            lib.close_manager(manager)
            _answer({"closed": True})
            return
        try:
            _answer(calls[call["op"]](call))
        except Exception as e:  # the caller judges it, as it would in its own process
            _answer({"error": str(e), "kind": type(e).__name__, "refused": bool(iut.refuses(e))})


if __name__ == "__main__":
    serve()
