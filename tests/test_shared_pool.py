"""A shared-memory key has one holder at a time, also when a release races an
attach (kvref.shared_pool)."""

import fcntl
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
