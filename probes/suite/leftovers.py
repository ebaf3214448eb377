"""What a process leaves behind when it goes, read from /proc while it
lives: the named shared memory it maps or holds open (/dev/shm), the
processes it started (its descendants), and the Unix socket files it bound.
Once it is gone, whichever of them is still there, the very file (its
inode) or process (its start time), and not taken over by the process
that took its place, is held by nothing of its library's: nothing
reclaims shared memory or a socket file but a reboot or a hand, a stray
process runs until someone kills it, and each restart adds more.

Files elsewhere are not judged: libtpu keeps its logs and its lock file in
/tmp on purpose, and a lock dies with its process unless a process it
started holds it on (a descendant, judged)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SHARED_MEMORY = "/dev/shm/"  # where a process's named shared memory lives (shm_open, and files made there)
PROC = Path("/proc")


@dataclass(frozen=True)
class Holdings:
    shared_memory: frozenset[tuple[str, int]]  # path, inode
    started: frozenset[tuple[int, str, str]]  # pid, start time (a pid reused is not it), name
    socket_files: frozenset[tuple[str, int]]  # path, inode

    @classmethod
    def of(cls, pid: int) -> Holdings:
        """What the process `pid` holds now (nothing of what it can no longer be read of: it ended meanwhile)."""
        proc = PROC / str(pid)
        mapped = {fields[5].strip() for fields in (line.split(maxsplit=5) for line in _lines(proc / "maps"))
                  if len(fields) == 6}
        opened = _links(proc / "fd")
        inodes = {link[len("socket:["):-1] for link in opened if link.startswith("socket:[")}
        where = _link(proc / "cwd") or "/"  # a path bound relative to it
        bound = {os.path.join(where, fields[7]) for fields in (line.split(maxsplit=7)
                                                               for line in _lines(proc / "net" / "unix"))
                 if len(fields) == 8 and fields[6] in inodes and not fields[7].startswith("@")}  # @: abstract
        shared = {path for path in mapped | opened if path.startswith(SHARED_MEMORY) and not path.endswith("(deleted)")}
        return cls(_with_inodes(shared), frozenset(_descendants(pid)), _with_inodes(bound))

    def left(self, besides: Holdings | None = None) -> list[str]:
        """Each of these still there and not among what `besides` (the successor) holds, said as what it is."""
        taken = besides or Holdings(frozenset(), frozenset(), frozenset())
        return ([f"named shared memory {path}" for path, inode in sorted(self.shared_memory - taken.shared_memory)
                 if _inode(path) == inode] +
                [f"process {pid} ({name}), which it started, still running"
                 for pid, started, name in sorted(self.started - taken.started) if _running(pid, started)] +
                [f"the socket file {path}" for path, inode in sorted(self.socket_files - taken.socket_files)
                 if _inode(path) == inode])


def _lines(path: Path) -> list[str]:
    try:
        return path.read_bytes().decode(errors="replace").splitlines()
    except OSError:
        return []


def _link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # gone meanwhile
        return None


def _links(fds: Path) -> set[str]:
    try:
        entries = list(fds.iterdir())
    except OSError:
        return set()
    return {link for link in map(_link, entries) if link is not None}


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _with_inodes(paths: set[str]) -> frozenset[tuple[str, int]]:
    return frozenset((path, inode) for path in paths if (inode := _inode(path)) is not None)


def _stat(pid: int) -> tuple[str, str, int, str] | None:
    """A process's name, state, parent and start time (proc(5): the name is in parentheses, and may hold any)."""
    lines = _lines(PROC / str(pid) / "stat")
    if not lines:
        return None
    name, _, rest = lines[0].partition(" (")[2].rpartition(") ")
    fields = rest.split()
    if len(fields) < 20:
        return None
    return name, fields[0], int(fields[1]), fields[19]


def _descendants(pid: int) -> set[tuple[int, str, str]]:
    parents: dict[int, list[tuple[int, str, str]]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            name, _, parent, started = stat
            parents.setdefault(parent, []).append((int(entry.name), started, name))
    found, frontier = set(), [pid]
    while frontier:
        for child in parents.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child[0])
    return found


def _running(pid: int, started: str) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[3] == started and stat[1] not in ("Z", "X")  # a zombie has ended
