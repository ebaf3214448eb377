"""Which layout a TPU generation's compiler gives an array: the shipped table
first, then the live compiler (cached on disk), else a clear error."""

from __future__ import annotations

from dataclasses import dataclass

from kvref.generations import GENERATIONS, check_generation, is_shipped
from kvref.oracle import cache, table
from kvref.oracle.compiler import OracleUnavailable
from kvref.shape import Layout, Shape
from kvref.shape_key import ShapeKey
from kvref.sharding import Sharding

__all__ = ["GENERATIONS", "LayoutAnswer", "OracleUnavailable", "device_kind", "generation_of_device_kind",
           "lookup", "table_key", "tpu_layout"]


@dataclass(frozen=True)
class LayoutAnswer:
    shape: Shape  # with a sharding, one device's shard
    generation: str
    source: str  # "table" or "compiler"
    versions: str  # "jax 0.10.2, libtpu 0.0.52"
    compiler_bytes: int  # the compiler's size for the buffer


def lookup(dtype, dims, generation: str, *, live: bool = True, sharding: Sharding | None = None,
           requested: Layout | None = None) -> LayoutAnswer:
    """The compiler's layout for a new array of `dims`; with a sharding, of
    one device's shard, as the compiler lays it out for the whole mesh; with
    `requested`, what the compiler gives when that layout is asked for."""
    check_generation(generation)
    shape_key = ShapeKey(dtype, dims)
    name, dims = shape_key.dtype, shape_key.dims
    if sharding is not None:
        sharding.check(dims)
    key = table_key(shape_key, sharding, requested)
    hit = table.lookup(generation, key)
    if hit:
        return LayoutAnswer(Shape.parse(hit[0]), generation, "table",
                            _version_text(table.load()["versions"]), hit[1])
    if not live:
        raise OracleUnavailable(f"{key} on {generation} is not in the shipped layout table")
    return _from_compiler(name, dims, generation, key, sharding, requested)


def table_key(shape_key: ShapeKey, sharding: Sharding | None = None, requested: Layout | None = None) -> str:
    """How the table and the disk cache name an answer: the shape, then its
    sharding, then the layout asked for."""
    parts = [str(shape_key)] + ([str(sharding)] if sharding else []) + ([f"requested{{{requested}}}"] if requested else [])
    return " ".join(parts)


def tpu_layout(dtype, dims, generation: str, sharding: Sharding | None = None) -> Shape:
    """The layout `generation`'s XLA compiler picks for a new array (or its shard)."""
    return lookup(dtype, dims, generation, sharding=sharding).shape


def device_kind(generation: str) -> str:
    """The device kind the compiler reports for a generation ("TPU v5 lite"),
    from the shipped table, or for a TPU type it does not ship, from the live
    compiler; empty when neither can say."""
    shipped = table.load()["generations"].get(check_generation(generation), {}).get("device_kind", "")
    if shipped or is_shipped(generation):
        return shipped
    from kvref.oracle import compiler

    try:  # any cached answer for it names the device; else ask the compiler
        cached = cache.read(cache.cache_path(compiler.versions())).get(generation, {})
        return next(iter(cached.values()))[2] if cached else compiler.device_kind(generation)
    except OracleUnavailable:
        return ""


def generation_of_device_kind(kind: str) -> str | None:
    """The generation whose compiler reports this device kind, or None."""
    for generation, entry in table.load()["generations"].items():
        if entry.get("device_kind") == kind:
            return generation
    return None


def _from_compiler(name: str, dims: tuple[int, ...], generation: str, key: str,
                   sharding: Sharding | None, requested: Layout | None = None) -> LayoutAnswer:
    from kvref.oracle import compiler

    try:
        versions = compiler.versions()
    except OracleUnavailable as e:
        raise OracleUnavailable(f"{key} on {generation} is not in the shipped layout table and {e}") from None
    path = cache.cache_path(versions)
    entry = cache.get(path, generation, key)
    if entry is None:
        answer = compiler.compile_layout(name, dims, generation, sharding, requested)
        entry = (str(answer.shape), answer.output_bytes, answer.device_kind)
        cache.put(path, generation, key, entry)
    return LayoutAnswer(Shape.parse(entry[0]), generation, "compiler", _version_text(versions), entry[1])


def _version_text(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if k in ("jax", "libtpu"))

