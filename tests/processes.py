"""Processes read from /proc: a process's descendants, command line, and whether it lives."""

from pathlib import Path


def parents() -> dict[int, int]:
    """Each process's parent, by pid."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            found[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return found


def descendants(root: int) -> list[int]:
    parent_of, found, frontier = parents(), [], [root]
    while frontier:
        children = [pid for pid, parent in parent_of.items() if parent in frontier]
        found += children
        frontier = children
    return found


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
