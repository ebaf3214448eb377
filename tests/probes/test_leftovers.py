"""What a process leaves behind (probes.suite.leftovers): named shared
memory, a process it started and a socket file it bound are each named once
it is gone, and nothing is where the process removed or never named them."""

import os
import signal
import subprocess
import sys

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
def holder(tmp_path):
    started = []

    def start(tidy: bool):
        name = f"kvprobe-test-leftovers-{os.getpid()}-{len(started)}"
        child = subprocess.Popen([sys.executable, "-c", HOLDER, "tidy" if tidy else "messy", name, str(tmp_path)],
                                 stdout=subprocess.PIPE, text=True)
        started.append((child, name))
        assert child.stdout.readline().strip() == "ready"
        return child, name

    yield start
    for child, name in started:
        child.kill()
        child.wait()
        for path in (f"/dev/shm/{name}", tmp_path / f"{name}.sock"):
            if os.path.exists(path):
                os.unlink(path)


def test_what_a_killed_process_held_is_named_once_it_is_gone(holder, tmp_path):
    child, name = holder(tidy=False)
    held = Holdings.of(child.pid)
    assert held.shared_memory == {f"/dev/shm/{name}"}
    assert held.socket_files == {str(tmp_path / f"{name}.sock")}
    [(helper, _, helper_name)] = held.started
    assert helper_name == "sleep"
    child.kill()
    child.wait()
    try:
        assert held.left() == [f"named shared memory /dev/shm/{name}",
                               f"process {helper} (sleep), which it started, still running",
                               f"the socket file {tmp_path / f'{name}.sock'}"]
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
    assert Holdings.of(gone.pid) is None
