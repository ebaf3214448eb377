"""`kvprobe explain`: what a TPU generation does with one KV-cache shape, and
what a block-offload manager would make of it."""

from __future__ import annotations

from dataclasses import dataclass

import kvref
from kvref import remedies
from kvref.oracle import LayoutAnswer, OracleUnavailable, lookup


@dataclass(frozen=True)
class Explanation:
    shape: kvref.Shape
    source: str  # where the layout came from
    generation: str | None
    slices: kvref.MajorSlice
    legacy_slice_bytes: int
    host_blocks: int
    layers: int
    remedy: remedies.Remedy | None = None  # the cheapest change the compiler agreed makes blocks byte ranges
    remedy_note: str = ""  # why there is none

    @property
    def logical_bytes(self) -> int:
        return -(-self.shape.logical_elements * self.shape.element.bit_width // 8)

    @property
    def host_bytes_fixed(self) -> int | None:
        s = self.slices
        return self.host_blocks * s.slice_bytes * self.layers if s.addressable else None

    @property
    def host_bytes_legacy(self) -> int:
        return self.host_blocks * self.legacy_slice_bytes * self.layers


def resolve(text: str, generation: str | None, sharding: kvref.Sharding | None = None) -> tuple[kvref.Shape, str]:
    """A full layout text stands as given; `dtype[dims]` asks the generation's
    compiler (table first), for one device's shard where a sharding is given."""
    if "{" in text:
        if sharding is not None:
            raise ValueError(f"{text!r} is a layout already; --sharding takes a shape such as 'bf16[512,8,2048]'")
        return kvref.Shape.parse(text), "given"
    try:
        key = kvref.ShapeKey.parse(text.replace(" ", ""))
    except ValueError as e:
        raise ValueError(f"expected a shape such as 'bf16[512,3,2048]' or a full layout "
                         f"such as 'bf16[512,3,2048]{{2,0,1:T(8,128)(2,1)}}': {e}") from None
    if generation is None:
        raise ValueError(f"{text!r} has no layout; pass --generation to ask that TPU's compiler")
    answer: LayoutAnswer = lookup(key.dtype, key.dims, generation, sharding=sharding)
    over = f", one device's shard of {key} over {sharding}" if sharding else ""
    return answer.shape, f"{answer.source}: {answer.versions}{over}"


def explain(text: str, generation: str | None, host_blocks: int | None = None,
            layers: int = 1, sharding: kvref.Sharding | None = None) -> Explanation:
    shape, source = resolve(text, generation, sharding)
    rows = shape.dims[0] if shape.rank else 0
    slices = kvref.major_slice(shape)
    remedy, note = (None, "") if slices.addressable or not shape.rank else remedy_for(shape, generation)
    return Explanation(shape, source, generation, slices, kvref.legacy_major_slice_byte_size(shape),
                       rows if host_blocks is None else host_blocks, layers, remedy, note)


def remedy_for(shape: kvref.Shape, generation: str | None) -> tuple[remedies.Remedy | None, str]:
    """The cheapest remedy on `generation`, or None and why there is none."""
    if generation is None:
        return None, "a remedy needs a generation whose compiler checks it (--generation)"
    try:
        found = remedies.cheapest(shape.key, generation, shape)
    except (OracleUnavailable, ValueError) as e:
        return None, f"not checked: {str(e).splitlines()[0]}"
    return found, "" if found else "none of the changes tried makes blocks byte ranges on this compiler"


def remedy_text(remedy: remedies.Remedy | None, note: str) -> str:
    if remedy is None:
        return note
    return (f"{remedy.change}: {remedy.how} gives {remedy.shape} "
            f"({remedy.cost:.2f}x the memory)")


def render(e: Explanation) -> str:
    s, shape = e.slices, e.shape
    padding = shape.physical_size_bytes - e.logical_bytes
    share = padding / shape.physical_size_bytes if shape.physical_size_bytes else 0.0
    where = f" on {e.generation}" if e.generation else ""
    lines = [
        f"{shape.key}{where}",
        f"  layout          {shape}   ({e.source})",
        f"  physical size   {_bytes(shape.physical_size_bytes)} (logical {_bytes(e.logical_bytes)}, "
        f"padding {_bytes(padding)} = {share:.1%})",
    ]
    if s.addressable:
        lines.append(f"  dim-0 slices    addressable: {_bytes(s.slice_bytes)} per row")
    else:
        lines.append("  dim-0 slices    NOT addressable: " + s.reason)
        if s.rows_per_group and s.rows_per_group < shape.dims[0]:
            lines.append(f"                  smallest contiguous group: {s.rows_per_group} rows "
                         f"({_bytes(s.group_bytes)})")
        else:
            lines.append("                  no group of rows smaller than the whole buffer is contiguous")
    if not s.addressable:
        lines.append(f"  remedy          {remedy_text(e.remedy, e.remedy_note)}")
    fixed = _bytes(s.slice_bytes) if s.addressable else "refused"
    lines.append(f"  slice bytes     fixed: {fixed}   legacy formula: {_bytes(e.legacy_slice_bytes)}")
    pool = f"  host pool       {e.host_blocks} host blocks x {e.layers} layer(s): "
    fixed_pool = (_bytes(e.host_bytes_fixed) if e.host_bytes_fixed is not None
                  else "refused at construction")
    lines.append(pool + f"fixed {fixed_pool}; legacy {_bytes(e.host_bytes_legacy)}")
    return "\n".join(lines)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n:,} B ({n / size:.2f} {unit})"
    return f"{n:,} B"
