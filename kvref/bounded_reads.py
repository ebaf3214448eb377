"""Reads bounded where they enter: a file or an answer is read up to what it
can legitimately be, and refused beyond it naming the bound, before it is
held whole. A sysfs file may be a FIFO or /dev/zero, a matrix a 2 GiB line,
a metadata server a stream that never ends: none may cost more than its bound
in memory or time."""

from __future__ import annotations

import os
import stat
import time
from typing import BinaryIO

CHUNK = 64 * 1024


class TooLarge(ValueError):
    """More bytes than the bound of what is being read."""


def read_file(path, most: int, what: str) -> bytes:
    """A regular file's bytes, at most `most` of them: a FIFO, a device or a
    directory is refused (opened without blocking, never read), as is a file
    longer than `most`, naming the bound."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{what} ({path}) is not a regular file (a {_kind(mode)}); expected a file of at most "
                             f"{most:,} bytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return read_stream(f, most, f"{what} ({path})")
    finally:
        os.close(fd)


def read_stream(stream: BinaryIO, most: int, what: str, seconds: float | None = None) -> bytes:
    """What `stream` holds, at most `most` bytes; TooLarge beyond that, read no
    further; TimeoutError where it has not ended within `seconds` (a stream
    that drips a byte at a time is cut off there, between two reads)."""
    parts, held = [], 0
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not end within {seconds:g} s; not read further")
        part = stream.read1(min(CHUNK, most + 1 - held)) if hasattr(stream, "read1") else \
            stream.read(min(CHUNK, most + 1 - held))
        if not part:
            return b"".join(parts)
        parts.append(part)
        held += len(part)
        if held > most:
            raise TooLarge(f"{what} is larger than {most:,} bytes, the most it can be; not read further")


def tail(path, keep: int) -> bytes:
    """The last `keep` bytes of a file (all of a shorter one), read from there."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - keep))
        return f.read(keep)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
             (stat.S_ISDIR, "directory"), (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "special file")
