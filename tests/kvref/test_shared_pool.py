"""A shared-memory key has one holder at a time, also when a release races an
attach (kvref.shared_pool)."""

import fcntl
import os
import signal
import subprocess
import sys
import uuid

import pytest

from kvref import shared_pool
from kvref.shared_pool import PoolAttachment


def test_a_release_between_an_attachs_open_and_its_lock_leaves_one_holder(monkeypatch):
    """B opens the segment, A releases it (removing it) before B locks: B's lock
    is on a file nobody else can find. B must take the key anew, so that C,
    attaching next, is refused rather than becoming a second holder."""
    key = f"race-{uuid.uuid4().hex[:8]}"
    first = PoolAttachment(key)
    locks = []
    real_flock = fcntl.flock

    def flock_after_a_release(fd, operation):
        if not locks:
            first.release()
        locks.append(fd)
        return real_flock(fd, operation)

    monkeypatch.setattr(shared_pool.fcntl, "flock", flock_after_a_release)
    second = PoolAttachment(key)
    monkeypatch.setattr(shared_pool.fcntl, "flock", real_flock)
    try:
        assert len(locks) == 2  # the first lock was on the removed segment, let go
        with pytest.raises(ValueError, match=f"the shared-memory pool '{key}' is attached by another manager"):
            PoolAttachment(key)
    finally:
        second.release()
    PoolAttachment(key).release()  # free again


HOLDER_THAT_FORKS = """
import os, sys, time
from kvref.shared_pool import PoolAttachment
held = PoolAttachment(sys.argv[1])
if os.fork() == 0:  # a child that outlives its parent (a worker the serving process started)
    os.write(1, b"child\\n")  # it has run, and let go of its copy, at the fork
    time.sleep(60)
    os._exit(0)
os.write(1, b"held\\n")  # each line one write: print's could interleave with the other process's
time.sleep(60)
"""


def test_a_key_whose_holder_died_is_free_though_a_child_it_forked_lives():
    # flock is shared by every copy of the descriptor: a child forked by the holder kept the
    # key after its parent was killed, and the restart was refused naming the dead pid.
    key = f"forked-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER_THAT_FORKS, key], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert sorted(holder.stdout.readline().strip() for _ in range(2)) == ["child", "held"]
        holder.kill()
        holder.wait(timeout=30)
        PoolAttachment(key).release()  # the restart takes the key
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the child too
        for path in shared_pool.SEGMENTS.glob(f"{shared_pool.PREFIX}{key}*"):
            path.unlink()
