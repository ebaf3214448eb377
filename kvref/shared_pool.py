"""A host pool attached under a shared-memory key (tpu-sync's enable_shm with
RAIDEN_SHM_KEY): one manager at a time per key. The attachment is a segment
in /dev/shm named after the key, held under an exclusive lock and naming the
manager's process; a second manager asking for the same key, in this process
or another, is refused, so no chunk is ever handed out by two allocators. A
lock taken on a segment its holder removed meanwhile is let go and the key
taken anew, so a release racing an attach never leaves two holders.

The memory itself lives in segments beside it (`segment`: the host pool's
bytes, a store's table): a holder that closes removes them, one that dies
leaves them, and the next holder of the key made for the same geometry
recovers their bytes (anything else is made anew). A killed process's lock
goes with it, so its key is taken over by the next holder; a child it
forked holds none of its keys (a lock on an open file is shared across
fork, so the child lets go of its copy at once)."""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import re
import weakref
from pathlib import Path

import numpy as np

SEGMENTS = Path("/dev/shm")
PREFIX = "kvref-pool-"
KEY = re.compile(r"[A-Za-z0-9._-]{1,200}")


ATTACH_TRIES = 100
HEADER_BYTES = 4096  # a segment's header: its format and the geometry it was made for
MAGIC = b"kvref-segment-1\n"


def check_key(key, name: str = "shm_key") -> str:
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise ValueError(f"{name} must be 1 to 200 letters, digits, '.', '_' or '-', got {key!r}")
    return key


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open at `fd`."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


_HELD: "weakref.WeakSet[PoolAttachment]" = weakref.WeakSet()


def _let_go_in_child() -> None:
    for attachment in list(_HELD):
        attachment._let_go_of_fork_copy()


os.register_at_fork(after_in_child=_let_go_in_child)


class PoolAttachment:
    def __init__(self, key, leave_segment: bool = False, prefix: str = PREFIX):
        """Hold `key` (segments named `prefix` + key); `leave_segment`: leave
        them all when released, as an old bug did."""
        key = check_key(key)
        self.path = SEGMENTS / f"{prefix}{key}"
        self._leave_segment = leave_segment
        self._segments: list[Path] = []
        for _ in range(ATTACH_TRIES):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ValueError(f"the shared-memory pool {key!r} is attached by another manager (pid {holder}); "
                                 "two managers never share one pool's chunks: give each its own key") from None
            if _same_file(fd, self.path):
                break
            # Its holder released it (removed the segment) between our open and our lock:
            # the lock we hold is on a file no one else can find. Take the key anew.
            os.close(fd)
        else:
            raise ValueError(f"the shared-memory pool {key!r} was released and taken again {ATTACH_TRIES} times "
                             "while this manager attached it; try again")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        _HELD.add(self)

    def segment(self, name: str, size: int, geometry: bytes) -> tuple[np.ndarray, bool]:
        """`size` bytes of shared memory under the key (its segment `name`),
        and whether they were recovered: a segment a holder that died left,
        made for the same `geometry`, keeps its bytes; any other is made
        anew, zeroed, its memory reserved now (a full /dev/shm is an OSError
        here, not a crash at the first touch)."""
        path = self.path.with_name(f"{self.path.name}+{name}")  # '+' is in no key
        header = MAGIC + hashlib.sha256(geometry).digest()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            recovered = os.fstat(fd).st_size == HEADER_BYTES + size and os.pread(fd, len(header), 0) == header
            if not recovered:
                os.ftruncate(fd, 0)
                os.posix_fallocate(fd, 0, HEADER_BYTES + size)
                os.pwrite(fd, header, 0)
            mapped = mmap.mmap(fd, HEADER_BYTES + size)
        finally:
            os.close(fd)
        self._segments.append(path)
        return np.frombuffer(mapped, np.uint8, size, HEADER_BYTES), recovered

    def _let_go_of_fork_copy(self) -> None:
        """In a forked child: close the copy of the locked descriptor (the lock
        is the parent's) and never release what the parent holds."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def release(self) -> None:
        """Remove the segments and let go of the key (once; a fork's copy does nothing)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if not self._leave_segment:
            for path in [*self._segments, self.path]:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        os.close(fd)
