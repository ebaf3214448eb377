"""The environment a process was started with."""

from __future__ import annotations

from pathlib import Path


def started_with() -> dict[str, str]:
    """This process's environment as it was started, before jax, libtpu or
    the harness set anything in os.environ (Linux keeps it in /proc)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}
