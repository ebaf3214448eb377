"""A disk cache of live compiler answers, one file per jax/libtpu version set,
so a shape compiled once is not compiled again."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("KVREF_CACHE_DIR") or Path.home() / ".cache" / "kvref")


def cache_path(versions: dict[str, str]) -> Path:
    root = cache_root()
    tag = "-".join(f"{k}{v}" for k, v in sorted(versions.items()))
    return root / f"tpu-layouts-{tag}.json"


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def get(path: Path, generation: str, key: str) -> tuple[str, int, str] | None:
    entry = read(path).get(generation, {}).get(key)
    return tuple(entry) if entry else None


def put(path: Path, generation: str, key: str, entry: tuple[str, int, str]) -> None:
    """Merge one answer in and replace the file atomically; a cache that cannot
    be written only costs a recompile next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read(path)
        data.setdefault(generation, {})[key] = list(entry)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass
