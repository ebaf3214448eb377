"""What a process leaves behind (probes.suite.leftovers): named shared
memory, a process it started and a socket file it bound are each named once
it is gone, and nothing is where the process removed or never named them."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvref.polling import wait_for
from probes.suite.leftovers import Holdings

# Holds a /dev/shm file, a Unix socket file and a `sleep` it started; with "tidy", the same with the file
# unlinked at once, an abstract socket (no file) and no process.
HOLDER = """
import os, socket, subprocess, sys, time
tidy, name = sys.argv[1] == "tidy", sys.argv[2]
shm = open(f"/dev/shm/{name}", "wb")
local = socket.socket(socket.AF_UNIX)
if tidy:
    os.unlink(f"/dev/shm/{name}")
    local.bind("\\0" + name)
else:
    local.bind(f"{sys.argv[3]}/{name}.sock")
    subprocess.Popen(["sleep", "30"], start_new_session=True)
local.listen()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def sockets():
    """A folder short enough for a socket's path (108 bytes at most; a pytest tmp_path can be near it)."""
    folder = tempfile.mkdtemp(prefix="kvl-", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder)


@pytest.fixture
def holder(sockets):
    started = []

    def start(tidy: bool):
        name = f"kvprobe-leftovers-{os.getpid()}-{len(started)}"
        child = subprocess.Popen([sys.executable, "-c", HOLDER, "tidy" if tidy else "messy", name, str(sockets)],
                                 stdout=subprocess.PIPE, text=True)
        started.append((child, name))
        assert child.stdout.readline().strip() == "ready"
        return child, name

    yield start
    for child, name in started:
        for pid, _, _ in Holdings.of(child.pid).started:  # its `sleep`, if the test did not get to kill it
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
        child.stdout.close()
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_what_a_killed_process_held_is_named_once_it_is_gone(holder, sockets):
    child, name = holder(tidy=False)
    held = Holdings.of(child.pid)
    assert {path for path, _ in held.shared_memory} == {f"/dev/shm/{name}"}
    assert {path for path, _ in held.socket_files} == {str(sockets / f"{name}.sock")}
    [(helper, _, helper_name)] = held.started
    assert helper_name == "sleep"
    child.kill()
    child.wait()
    try:
        assert held.left() == [f"named shared memory /dev/shm/{name}",
                               f"process {helper} (sleep), which it started, still running",
                               f"the socket file {sockets / f'{name}.sock'}"]
        assert held.left(besides=held) == []  # what a successor took over (a fixed name bound again) is not left
        (sockets / "other").touch()
        (sockets / "other").replace(sockets / f"{name}.sock")  # another file at its path now: not the one it left
        assert f"the socket file {sockets / f'{name}.sock'}" not in held.left()
    finally:
        os.kill(helper, signal.SIGKILL)
    assert wait_for(lambda: not any(left.startswith("process") for left in held.left()), 10.0, 0.05)


def test_a_process_that_names_nothing_it_holds_leaves_nothing(holder):
    child, _ = holder(tidy=True)
    held = Holdings.of(child.pid)
    assert held == Holdings(frozenset(), frozenset(), frozenset())
    child.kill()
    child.wait()
    assert held.left() == []


def test_a_gone_process_holds_nothing_to_read():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert Holdings.of(gone.pid) == Holdings(frozenset(), frozenset(), frozenset())
