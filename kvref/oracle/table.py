"""The shipped table of compiler answers: per generation, shape key -> layout
text and the compiler's byte size, with the versions that produced it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("data") / "tpu_layouts.json"


@functools.cache
def load(path: Path = TABLE_PATH) -> dict:
    """{"versions": {...}, "generations": {gen: {"device_kind": str,
    "layouts": {key: [layout_text, output_bytes]}, "remedies": {key: [change, how,
    layout_text, keeps_tiling] or []}}}}; empty when absent."""
    if not path.exists():
        return {"versions": {}, "generations": {}}
    return json.loads(path.read_text())


def lookup(generation: str, key: str) -> tuple[str, int] | None:
    entry = load().get("generations", {}).get(generation, {}).get("layouts", {}).get(key)
    return (entry[0], entry[1]) if entry else None


def remedy(generation: str, key: str) -> list | None:
    """The cheapest remedy shipped for a refused shape ([change, how, layout
    text, keeps the compiler's tiles]; [] when the compiler agreed to none), or
    None when none was shipped."""
    return load().get("generations", {}).get(generation, {}).get("remedies", {}).get(key)


def save(table: dict, path: Path = TABLE_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    load.cache_clear()
