"""An array type without a layout, `bf16[512,3,2048]`: the one text form that
names a KV-cache shape in the layout table, the shape matrices, result CSVs,
reports and error messages."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvref.dtypes import ELEMENT_TYPES, element_type
from kvref.errors import LayoutError
from kvref.values import INT64_MAX, is_integer

_SHAPE_RE = re.compile(r"^\s*([a-z][a-z0-9]*)\[([^\]]*)\](?:\{([^{}]*)\})?\s*$", re.ASCII)
_DIGITS = re.compile(r"[0-9]+")


def split_shape_text(text, layout: bool = True) -> tuple[str, tuple[int, ...], str | None]:
    """XLA's text form of a shape, `bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}`
    (spaces around it allowed, none inside), as (dtype, dims, the layout's
    text or None); with `layout` False a layout is malformed. The one parser
    of Shape and ShapeKey."""
    if not isinstance(text, str):
        raise TypeError(f"a shape is text such as 'bf16[512,3,2048]', got {type(text).__name__}")
    m = _SHAPE_RE.match(text)
    if not m or (m.group(3) is not None and not layout):
        expected = "'bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}'" if layout else "'bf16[512,3,2048]' (no layout)"
        raise LayoutError(f"malformed shape text {shown(text)}; expected XLA form such as {expected}")
    dtype, dims_text, layout_text = m.groups()
    if dtype not in ELEMENT_TYPES:
        raise LayoutError(f"unknown element type {dtype!r} in {shown(text)}; expected one of "
                          f"{', '.join(ELEMENT_TYPES)}")
    return dtype, parse_ints(dims_text, text, "dims"), layout_text


def parse_ints(text: str, whole: str, what: str) -> tuple[int, ...]:
    """Comma-separated ASCII digits (so never negative), or ()."""
    if not text:
        return ()
    parts = text.split(",")
    if not all(_DIGITS.fullmatch(part) for part in parts):
        raise LayoutError(f"malformed {what} {shown(text)} in {shown(whole)}; expected comma-separated "
                          "integers of ASCII digits")
    too_big = next((part for part in parts if len(part.lstrip("0")) > len(str(INT64_MAX)) or int(part) > INT64_MAX),
                   None)
    if too_big is not None:  # XLA's dims are int64: a larger one would fail deep in the compiler
        raise LayoutError(f"{what} {shown(too_big, 40)} in {shown(whole, 80)} does not fit in int64 "
                          f"(at most {INT64_MAX})")
    return tuple(int(part) for part in parts)


def shown(text: str, limit: int = 200) -> str:
    """`text` quoted for a message, cut short when it is long."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


@dataclass(frozen=True, order=True)
class ShapeKey:
    dtype: str  # XLA element type name
    dims: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "dtype", element_type(self.dtype).name)
        dims = []
        for d in self.dims:
            if not is_integer(d) or int(d) < 0:
                raise ValueError(f"dim {d!r} of {self.dtype}{list(self.dims)} must be a "
                                 "non-negative integer")
            dims.append(int(d))
        elements = 1
        for d in dims:
            elements *= d
        if elements > INT64_MAX:  # XLA counts a shape's elements in int64
            raise LayoutError(f"{self.dtype}{dims}: its element count overflows int64 ({elements:.3g} > {INT64_MAX})")
        object.__setattr__(self, "dims", tuple(dims))

    @classmethod
    def parse(cls, text: str) -> "ShapeKey":
        """`bf16[512,3,2048]` (no layout) -> ShapeKey; kvref.LayoutError (a
        ValueError) naming what is malformed."""
        dtype, dims, _ = split_shape_text(text, layout=False)
        return cls(dtype, dims)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"
