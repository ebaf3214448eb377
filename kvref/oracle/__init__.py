"""Which layout a TPU generation's compiler gives an array: the shipped table
first, then the live compiler (cached on disk), else a clear error."""

from __future__ import annotations

from dataclasses import dataclass

from kvref.dtypes import element_type
from kvref.generations import GENERATIONS, check_generation
from kvref.oracle import cache, table
from kvref.oracle.compiler import OracleUnavailable
from kvref.shape import Shape

__all__ = ["GENERATIONS", "LayoutAnswer", "OracleUnavailable", "lookup", "tpu_layout"]


@dataclass(frozen=True)
class LayoutAnswer:
    shape: Shape
    generation: str
    source: str  # "table" or "compiler"
    versions: str  # "jax 0.10.2, libtpu 0.0.52"
    compiler_bytes: int  # the compiler's size for the buffer


def lookup(dtype, dims, generation: str, *, live: bool = True) -> LayoutAnswer:
    check_generation(generation)
    name = element_type(dtype).name
    dims = tuple(_dim(d) for d in dims)
    key = table.shape_key(name, dims)
    hit = table.lookup(generation, key)
    if hit:
        return LayoutAnswer(Shape.parse(hit[0]), generation, "table",
                            _version_text(table.load()["versions"]), hit[1])
    if not live:
        raise OracleUnavailable(f"{key} on {generation} is not in the shipped layout table")
    return _from_compiler(name, dims, generation, key)


def tpu_layout(dtype, dims, generation: str) -> Shape:
    """The layout `generation`'s XLA compiler picks for a new array."""
    return lookup(dtype, dims, generation).shape


def _from_compiler(name: str, dims: tuple[int, ...], generation: str, key: str) -> LayoutAnswer:
    from kvref.oracle import compiler

    try:
        versions = compiler.versions()
    except OracleUnavailable as e:
        raise OracleUnavailable(f"{key} on {generation} is not in the shipped layout table and {e}") from None
    path = cache.cache_path(versions)
    entry = cache.get(path, generation, key)
    if entry is None:
        answer = compiler.compile_layout(name, dims, generation)
        entry = (str(answer.shape), answer.output_bytes, answer.device_kind)
        cache.put(path, generation, key, entry)
    return LayoutAnswer(Shape.parse(entry[0]), generation, "compiler", _version_text(versions), entry[1])


def _version_text(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if k in ("jax", "libtpu"))


def _dim(d) -> int:
    if isinstance(d, bool) or not hasattr(d, "__index__") or int(d) < 0:
        raise ValueError(f"dim {d!r} must be a non-negative integer")
    return int(d)
