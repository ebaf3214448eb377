"""A process that cannot start a thread at that moment (a pids cgroup limit, a
full address space), for the threads whose names start with one prefix."""

import contextlib
import threading


@contextlib.contextmanager
def no_thread_for(prefix: str):
    start = threading.Thread.start

    def refused(thread):
        if thread.name.startswith(prefix):
            raise RuntimeError("can't start new thread")  # what Python says at a pids limit
        start(thread)

    threading.Thread.start = refused
    try:
        yield
    finally:
        threading.Thread.start = start
