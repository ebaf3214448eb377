"""What the fault models of a manager that leaves things behind start with
it: a helper process that nothing tells when the manager goes, and a Unix
socket file for local peers, closed with the manager but never removed. A
manager without them starts neither."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import tempfile

HELPER_SECONDS = 30  # the stray helper's life: the fault leaves it running, the host does not keep it for good
_SOCKETS = itertools.count()  # the socket files' names, one per manager


def started_leftovers(faults) -> list:
    """What the fault models switched on start now, for the manager to hold (a socket closes with its last
    reference)."""
    held: list = []
    if faults.helper_process_outlives_manager:
        held.append(subprocess.Popen(["sleep", str(HELPER_SECONDS)], start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if faults.socket_file_left:
        local = socket.socket(socket.AF_UNIX)
        local.bind(os.path.join(tempfile.gettempdir(), f"kvref-local-{os.getpid()}-{next(_SOCKETS)}.sock"))
        local.listen()
        held.append(local)
    return held
