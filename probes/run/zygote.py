"""A warm parent for workers: `python -m probes.run.zygote SOCKET IUT [MODULE...]`
imports what workers need once (the worker, the probes, kvref and its layout
table, the IUT's declaration, resolved from its name as a worker resolves it,
and the named modules), then forks one child per case. Each child is a
worker as `python -m probes.run.worker` would be, minus the start-up:

- it runs in its own session (the runner kills its whole group);
- its stdout and stderr are pipes the runner made and passed over the socket;
- it runs the worker's code, watchdog first, and exits as the interpreter
  exits (`leave`), so a crash or hang while releasing is still seen: its
  non-daemon threads joined, its atexit handlers, a collection, then C's
  exit (static destructors, C atexit handlers). What it skips is tearing
  down the modules the zygote imported, the same for every case and most of
  a case's overhead (it writes to every object, copying the zygote's heap);
  a case that imported modules of its own gets the full shutdown;
- the zygote reaps it and sends the runner its exit status.

The zygote stays single-threaded (it forks) and opens no device: device-owning
IUTs never use one (probes.run.runner). When the runner's end of its stdin
closes it takes no new cases and exits once its children have, so it cannot
outlive the run; it removes its socket's folder as it goes.

Protocol, over a SOCK_SEQPACKET Unix socket, one connection per case: the
runner sends {"case": text, "env": {...}, "token": ...} with three fds
(stdout, stderr and the verdict channel, probes.run.channel); the zygote answers {"pid": N} and, when the child has exited, {"returncode": R}
(negative for a signal, as subprocess gives it)."""

from __future__ import annotations

import gc
import atexit
import ctypes
import importlib
import json
import os
import selectors
import shutil
import socket
import sys
import threading

MESSAGE_BYTES = 1 << 20
READY = "KVPROBE-ZYGOTE ready"


def serve(path: str) -> tuple[dict, list[int]]:
    """Fork a child per request until stdin closes, then exit when the last
    child has. Returns only in a child: its request and the three fds it got."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    print(READY, flush=True)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while listener.fileno() >= 0 or children:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):  # the runner is done or gone:
                    selector.unregister(sys.stdin)  # no new cases; report those running
                    selector.unregister(listener)
                    listener.close()
            elif key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
                if not message or len(fds) != 3:
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    conn.close()
                    for pidfd, (_, other) in children.items():
                        os.close(pidfd)
                        other.close()
                    return json.loads(message), fds
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ, "exit")
            else:  # a child exited
                pid, conn = children.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass  # the runner gave up on this case
                conn.close()
    # Its folder (socket and log) is the zygote's: gone with it, even when the
    # runner that made it was killed and could not remove it.
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    sys.exit(0)


def become_worker(request: dict, fds: list[int]) -> int:
    """In a forked child: take the case's pipes, session and environment, then
    run the worker."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (devnull, fds[0], fds[1]):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    from probes.run import worker
    from probes.run.channel import Channel

    return worker.run(request["case"], Channel(fds[2], request["token"]))


def leave(code: int, preloaded: int) -> None:
    """Exit a forked worker as the interpreter would, short of tearing down
    the `preloaded` modules (see the module's docstring)."""
    # Counted, not compared name by name: iterating sys.modules writes to every
    # name's reference count, copying a few hundred of the zygote's pages.
    if len(sys.modules) != preloaded:
        sys.exit(code)  # the case's own modules are torn down as at any exit
    threading._shutdown()  # what interpreter exit does first: wait for non-daemon threads
    atexit._run_exitfuncs()
    gc.collect()  # the case's objects in cycles released, their finalizers run
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.PyDLL(None).exit(code)  # PyDLL: holds the GIL, so no Python thread runs while C++ tears down


def preload(iut_name: str, modules: list[str]) -> None:
    import probes.run.probe_case  # noqa: F401  the worker's whole import graph
    import probes.run.worker  # noqa: F401
    from kvref.oracle import table
    from probes.iut import iut

    table.load()
    iut(iut_name)  # the installed IUTs read, and this one's declaration imported and checked, once
    for name in modules:
        importlib.import_module(name)


def main(argv: list[str]) -> None:
    path, iut_name, *modules = argv
    preload(iut_name, modules)
    gc.freeze()  # children's collections skip (and so do not copy) the preloaded objects
    preloaded = len(sys.modules)
    request, fds = serve(path)
    leave(become_worker(request, fds), preloaded)


if __name__ == "__main__":
    main(sys.argv[1:])
