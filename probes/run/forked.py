"""The runner's side of a zygote (probes.run.zygote): start one per
interpreter and environment, keep it warm, and have it fork a worker per case.
A case forked here is watched exactly like one started as a fresh process:
its stdout and stderr are pipes read to the end, its whole process group is
killed at the deadline, and its exit status is the zygote's report of it.
The zygote of a loopback_only IUT runs in a network namespace of its own with
only lo (probes.run.netns), so every worker it forks does; its socket is a
path in the file system, which reaches across network namespaces."""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict

from kvref.bounded_reads import tail
from probes.run import netns
from probes.run.channel import FD_VARIABLE, Heard, new_token
from probes.run.zygote import MESSAGE_BYTES, READY

READY_SECONDS = 60.0
DRAIN_SECONDS = 5.0  # after a kill, for the pipes to close and the status to come
KEPT = 4  # warm zygotes at once; the least recently used one goes first
# Of a worker's stdout and of its stderr, the end is kept: a verdict's detail
# quotes the last 4,000 characters, and `kvprobe fuzz` reads back the sequence a
# crash ended in (every step of a long run: tens of thousands of lines). A
# worker that writes without end costs no more than this.
KEPT_OUTPUT_BYTES = 32 * 2**20


class ZygoteUnavailable(RuntimeError):
    """No warm parent for this case: the runner starts a fresh interpreter."""


class ZygoteLost(RuntimeError):
    """The zygote died while its child ran: the child's exit status is unknown."""


class Zygote:
    def __init__(self, python: str, iut_name: str, modules: tuple[str, ...], env: dict,
                 loopback_only: bool = False):
        self.dir = tempfile.mkdtemp(prefix="kvprobe-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.log = open(os.path.join(self.dir, "stderr"), "w+")
        arguments = (self.path, iut_name, *modules)
        command = (netns.python_command(python, "probes.run.zygote", *arguments) if loopback_only
                   else [python, "-m", "probes.run.zygote", *arguments])
        self.proc = subprocess.Popen(command,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env, start_new_session=True)
        with live(self.proc.pid):  # an interrupt while it starts ends it (and the wait)
            ready = _read_line(self.proc.stdout, READY_SECONDS).startswith(READY)
        if not ready:
            self.close(wait=0)  # no new cases; then its log is read, and it goes
            said = tail(self.log.name, 8000).decode(errors="replace")[-2000:]
            self.close()
            raise ZygoteUnavailable(f"the zygote of {python} did not start:\n{said}")

    def run(self, text: str, env: dict, timeout: float) -> Ran:
        """Fork a worker for the case `text`."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        said_r, said_w = os.pipe()
        token = new_token()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.path)
            socket.send_fds(conn, [json.dumps({"case": text, "env": env, "token": token}).encode()],
                            [out_w, err_w, said_w])
            conn.settimeout(READY_SECONDS)
            pid = json.loads(conn.recv(MESSAGE_BYTES) or b"{}").get("pid")
        except OSError as e:
            for fd in (out_r, err_r, said_r):
                os.close(fd)
            conn.close()
            raise ZygoteUnavailable(f"the zygote did not fork: {e}") from e
        finally:
            for fd in (out_w, err_w, said_w):
                os.close(fd)
        if pid is None:
            for fd in (out_r, err_r, said_r):
                os.close(fd)
            conn.close()
            raise ZygoteUnavailable("the zygote closed the connection without forking")
        with live(pid):
            return _watch(pid, out_r, err_r, said_r, conn, timeout, token)

    def close(self, wait: float = 5.0) -> None:
        """Tell the zygote to take no new cases; it exits when the cases it
        forked have ended. Waits `wait` seconds for that, then kills it."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        if wait:
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def _watch(pid: int, out_r: int, err_r: int, said_r: int, conn: socket.socket, timeout: float, token: str) -> Ran:
    """Read the worker's pipes to the end and its status from the zygote; at the
    deadline, kill its process group and drain."""
    chunks = {out_r: KeptEnd(KEPT_OUTPUT_BYTES), err_r: KeptEnd(KEPT_OUTPUT_BYTES), said_r: KeptEnd(None)}
    returncode, killed = None, False
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(conn, selectors.EVENT_READ)
        while len(selector.get_map()):
            left = deadline - time.monotonic()
            if left <= 0:
                if killed:
                    break
                kill_group(pid)
                killed, deadline = True, time.monotonic() + DRAIN_SECONDS
                continue
            for key, _ in selector.select(left):
                if key.fileobj is conn:
                    message = conn.recv(MESSAGE_BYTES)
                    if message:
                        returncode = json.loads(message)["returncode"]
                        # The worker has exited: what it started and left holding its pipes goes now,
                        # and the pipes are read to their end.
                        kill_group(pid)
                        deadline = min(deadline, time.monotonic() + DRAIN_SECONDS)
                    selector.unregister(conn)
                else:
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].add(data)
                    else:
                        selector.unregister(key.fd)
    end_group(pid)  # nothing the worker started may outlive it
    for fd in chunks:
        os.close(fd)
    conn.close()
    if returncode is None:
        raise ZygoteLost(f"the zygote that forked worker {pid} gave no exit status")
    out, err = (chunks[fd].bytes().decode(errors="replace") for fd in (out_r, err_r))
    return Ran(returncode, out, err, killed, Heard.parse(chunks[said_r].bytes(), token))


class KeptEnd:
    """A pipe's output as read, keeping the last `most` bytes or more (None:
    all of it); the count is carried, so each read costs its own length."""

    def __init__(self, most: int | None):
        self.most, self.held, self.chunks = most, 0, collections.deque()

    def add(self, data: bytes) -> None:
        self.chunks.append(data)
        self.held += len(data)
        while self.most is not None and len(self.chunks) > 1 and self.held - len(self.chunks[0]) >= self.most:
            self.held -= len(self.chunks.popleft())

    def bytes(self) -> bytes:
        return b"".join(self.chunks)


_LIVE: set[int] = set()  # process groups of the workers (and zygotes starting) running now
_LIVE_LOCK = threading.Lock()
# Set by kill_live (a run interrupted): a worker a case's thread starts after it
# (a fresh interpreter in place of a zygote that was killed starting) dies at once.
_STOPPED = threading.Event()


@contextlib.contextmanager
def live(pid: int):
    """While the worker whose process group `pid` leads is running."""
    with _LIVE_LOCK:
        _LIVE.add(pid)
        stopped = _STOPPED.is_set()
    if stopped:
        kill_group(pid)
    try:
        yield
    except BaseException:  # its watcher was interrupted (Ctrl-C, a test's timeout): it dies too
        kill_group(pid)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(pid)


def kill_live() -> int:
    """Kill every worker running now, and each one started later until
    resume() (a run that was interrupted): how many were running."""
    with _LIVE_LOCK:
        _STOPPED.set()
        pids = list(_LIVE)
    for pid in pids:
        kill_group(pid)
    return len(pids)


def resume() -> None:
    """Workers live again (a new run in a process whose earlier run was interrupted)."""
    _STOPPED.clear()


@dataclasses.dataclass
class Ran:
    """How one worker ended: its status, its output, and what its verdict channel carried."""

    returncode: int
    out: str
    err: str
    killed: bool
    heard: Heard


def run_watched(command: list[str], text: str, limit: float, env: dict | None = None) -> Ran:
    """`command` in a process group of its own, a new verdict channel's token
    and then `text` on its stdin, the channel's fd named by FD_VARIABLE.
    Killed, with its group, after `limit` seconds; nothing it started
    outlives it."""
    token = new_token()
    said_r, said_w = os.pipe()
    env = {**(os.environ if env is None else env), FD_VARIABLE: str(said_w)}
    said: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(said_r, said), daemon=True)
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, env=env, pass_fds=(said_w,))
    except BaseException:
        os.close(said_r)
        raise
    finally:
        os.close(said_w)
    reader.start()
    # Once the worker has exited, what it started (and left holding its pipes) goes too.
    threading.Thread(target=_kill_group_after, args=(proc,), daemon=True).start()
    with live(proc.pid):
        try:
            out, err = proc.communicate(f"{token}\n{text}", timeout=limit)
            killed = False
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            killed = True
    end_group(proc.pid)
    reader.join(DRAIN_SECONDS)  # the group is gone: every holder of the channel has closed it
    return Ran(proc.returncode, out, err, killed, Heard.parse(b"".join(said), token))


def _kill_group_after(proc: subprocess.Popen) -> None:
    """Kill the process group `proc` leads once `proc` has exited."""
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pid is not reused yet
    except ChildProcessError:  # reaped already: run_watched kills its group itself
        return
    kill_group(proc.pid)


def _drain(fd: int, into: list[bytes]) -> None:
    try:
        while data := os.read(fd, 65536):
            into.append(data)
    finally:
        os.close(fd)


def kill_group(pid: int) -> None:
    """SIGKILL to the process group `pid` leads (a worker and all it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(pid: int) -> None:
    """Kill the process group `pid` leads and wait, at most DRAIN_SECONDS, until
    each of its processes has exited: a SIGKILL is only queued when kill
    returns, and the next case may need what they hold (a TPU's chips)."""
    kill_group(pid)
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return  # the group is empty (its leader, reaped, was its last)
    deadline = time.monotonic() + DRAIN_SECONDS
    for member in _group_members(pid):
        try:
            fd = os.pidfd_open(member)
        except OSError:  # gone already, or a kernel without pidfds: nothing to wait on
            continue
        try:
            with selectors.DefaultSelector() as selector:  # epoll: any fd number, unlike select()
                selector.register(fd, selectors.EVENT_READ)
                selector.select(max(0.0, deadline - time.monotonic()))  # readable once it has exited
        finally:
            os.close(fd)


def _group_members(pgid: int) -> list[int]:
    """The pids in process group `pgid`, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        except OSError:
            continue  # it exited meanwhile
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _read_line(stream, timeout: float) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return stream.readline().decode(errors="replace")


_zygotes: OrderedDict[tuple, Zygote | None] = OrderedDict()
_closing: list[Zygote] = []
_lock = threading.Lock()


def zygote_for(python: str, iut_name: str, modules: tuple[str, ...], env: dict,
               loopback_only: bool = False) -> Zygote:
    """The warm zygote of this interpreter, IUT, preload and environment (the
    environment is part of the key: modules read it when imported), in a
    loopback-only network namespace or not (never one zygote for both)."""
    key = (python, iut_name, modules, tuple(sorted(env.items())), loopback_only)
    with _lock:
        _reap_closed()
        if key in _zygotes:
            _zygotes.move_to_end(key)
        else:
            while len(_zygotes) >= KEPT:
                _, old = _zygotes.popitem(last=False)
                if old:  # its running cases still get their status
                    old.close(wait=0)
                    _closing.append(old)
            try:
                _zygotes[key] = Zygote(python, iut_name, modules, env, loopback_only)
            except ZygoteUnavailable:
                _zygotes[key] = None
                raise
        zygote = _zygotes[key]
    if zygote is None:
        raise ZygoteUnavailable(f"the zygote of {python} could not start earlier in this run")
    return zygote


def _reap_closed() -> None:
    """Wait for the zygotes closed earlier whose cases have all ended: a long
    session (a team's pytest run) leaves no zombie behind them."""
    for zygote in [z for z in _closing if z.proc.poll() is not None]:
        _closing.remove(zygote)
        zygote.close()


@atexit.register
def close_all() -> None:
    with _lock:
        while _zygotes:
            _, zygote = _zygotes.popitem()
            if zygote:
                zygote.close()
        while _closing:
            _closing.pop().close()
