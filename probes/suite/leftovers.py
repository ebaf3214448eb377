"""What a process leaves behind when it goes, read from /proc while it
lives: the named shared memory it maps or holds open (/dev/shm), the
processes it started (its descendants), and the Unix socket files it bound.
Once it is gone, whichever of them is still there is held by no process of
the library's: nothing reclaims shared memory or a socket file but a
reboot or a hand, a stray process runs until someone kills it, and each
restart adds more.

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
    shared_memory: frozenset[str]
    started: frozenset[tuple[int, str, str]]  # pid, start time (a pid reused is not it), name
    socket_files: frozenset[str]

    @classmethod
    def of(cls, pid: int) -> Holdings | None:
        """What the process `pid` holds now; None when it is gone (or going) meanwhile."""
        proc = PROC / str(pid)
        try:
            mapped = {line.split(maxsplit=5)[-1].strip() for line in (proc / "maps").read_text().splitlines()
                      if len(line.split(maxsplit=5)) == 6}
            opened = _links(proc / "fd")
            sockets = (proc / "net" / "unix").read_text().splitlines()[1:]
        except OSError:
            return None
        inodes = {link[len("socket:["):-1] for link in opened if link.startswith("socket:[")}
        bound = {fields[7] for fields in map(str.split, sockets)
                 if len(fields) == 8 and fields[6] in inodes and not fields[7].startswith("@")}  # @: abstract
        return cls(frozenset(path for path in mapped | opened
                             if path.startswith(SHARED_MEMORY) and not path.endswith("(deleted)")),
                   frozenset(_descendants(pid)), frozenset(bound))

    def left(self) -> list[str]:
        """Each of these still there, said as what it is."""
        return ([f"named shared memory {path}" for path in sorted(self.shared_memory) if os.path.exists(path)] +
                [f"process {pid} ({name}), which it started, still running"
                 for pid, started, name in sorted(self.started) if _running(pid, started)] +
                [f"the socket file {path}" for path in sorted(self.socket_files) if os.path.exists(path)])


def _links(fds: Path) -> set[str]:
    links = set()
    for fd in fds.iterdir():
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed meanwhile
            pass
    return links


def _stat(pid: int) -> tuple[str, str, int, str] | None:
    """A process's name, state, parent and start time (proc(5): the name is in parentheses, and may hold any)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name, _, rest = text.partition(" (")[2].rpartition(") ")
    fields = rest.split()
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
