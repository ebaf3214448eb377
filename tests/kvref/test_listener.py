"""Every server kvref opens to peers (a manager's listener, the process's
worker) holds what a stranger can make it hold: here, connections."""

import os
import subprocess
import sys

import numpy as np

import kvref
from kvref.listener import MOST_CONNECTIONS
from kvref.worker_registration import worker_endpoint

STRANGERS = 4 * MOST_CONNECTIONS

HOLDING = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2))
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(60)
"""


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def flooded(port: int) -> int:
    """How many descriptors this process gained while a stranger held STRANGERS idle connections to `port`."""
    before = descriptors()
    stranger = subprocess.Popen([sys.executable, "-c", HOLDING, str(port), str(STRANGERS)], stdout=subprocess.PIPE,
                                text=True)
    try:
        assert int(stranger.stdout.readline()) > 0  # it connected (the kernel accepts; the server decides)
        gained = descriptors() - before
    finally:
        stranger.kill()
        stranger.wait(timeout=30)
    return gained


def test_a_strangers_idle_connections_take_no_more_than_the_bound_of_descriptors():
    dev = kvref.SimDevice("v6e")
    manager = kvref.KVCacheManager([dev.put(np.zeros((16, 8, 128), np.float32))], 4, listen="127.0.0.1:0")
    try:
        port = int(manager.get_local_endpoints()[0]["endpoint"].rpartition(":")[2])
        assert flooded(port) <= MOST_CONNECTIONS + 8
    finally:
        manager.close()


def test_the_workers_server_is_bounded_the_same_way():
    port = int(worker_endpoint("127.0.0.1", 0).rpartition(":")[2])
    assert flooded(port) <= MOST_CONNECTIONS + 8
