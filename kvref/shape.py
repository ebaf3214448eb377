"""XLA shapes with layouts: `bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from kvref import _core
from kvref.dtypes import ELEMENT_TYPES, ElementType, element_type
from kvref.errors import LayoutError
from kvref.shape_key import ShapeKey, parse_ints, shown, split_shape_text
from kvref.values import INT64_MAX, is_integer


_TILE_RE = re.compile(r"T((?:\([^()]*\))+)")


# Tiles one layout may apply: the layout arithmetic walks a tile tree whose
# depth is the tile count, so the input must not choose it freely.
MAX_TILES = _core.MAX_TILES


@dataclass(frozen=True)
class Layout:
    """minor_to_major, tiles applied in order, and element size in bits
    (0: the type's natural storage size): a face over the C++ value
    (csrc/layout.h), which checks it, prints it and compares it."""

    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...] = ()
    element_bits: int = 0
    _value: _core.Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "minor_to_major", tuple(_as_int(d, "minor_to_major") for d in self.minor_to_major))
        object.__setattr__(self, "tiles", tuple(tuple(_as_int(t, "tile") for t in tile) for tile in self.tiles))
        object.__setattr__(self, "element_bits", _as_int(self.element_bits, "element_bits"))
        try:
            value = _core.Layout(list(self.minor_to_major), [list(t) for t in self.tiles], self.element_bits)
        except ValueError as e:
            raise LayoutError(str(e)) from None
        object.__setattr__(self, "_value", value)

    def equal(self, other: "Layout", *, ignore_element_size: bool = False, ignore_tiles: bool = False) -> bool:
        """Equal as XLA's Layout::Equal() says, optionally ignoring the element
        size (E) or the tiles (T): what a backend reports often lacks one."""
        return self._value.equal(other._value, ignore_element_size, ignore_tiles)

    @classmethod
    def default(cls, rank: int) -> "Layout":
        return cls(tuple(range(rank - 1, -1, -1)))

    @classmethod
    def from_jax(cls, layout) -> "Layout":
        """From a JAX layout (`major_to_minor`, `tiling`, `sub_byte_element_size_in_bits`)."""
        return cls(tuple(reversed(layout.major_to_minor)), tuple(tuple(t) for t in layout.tiling),
                   layout.sub_byte_element_size_in_bits)

    def __str__(self) -> str:
        return str(self._value)


@dataclass(frozen=True)
class Shape:
    """An array type with its layout. `Shape.parse(text)` reads XLA's text form;
    `str(shape)` prints it back. The layout is kept in normal form: an element
    size equal to the type's storage size is the default, so it is dropped
    (`{1,0:T(8,128)(2,1)E(16)}` of bf16 is `{1,0:T(8,128)(2,1)}`)."""

    dtype: str
    dims: tuple[int, ...]
    layout: Layout = None
    _tiled: _core.TiledLayout = field(init=False, repr=False, compare=False)  # the C++ arithmetic

    def __post_init__(self):
        element = element_type(self.dtype)
        object.__setattr__(self, "dtype", element.name)
        dims = tuple(_as_int(d, "dim") for d in self.dims)
        object.__setattr__(self, "dims", dims)
        if any(d < 0 for d in dims):
            raise LayoutError(f"dims {list(dims)} must not be negative")
        layout = self.layout if self.layout is not None else Layout.default(len(dims))
        object.__setattr__(self, "layout", layout)
        _check_element_bits(element, layout.element_bits, self)
        if layout.element_bits == element.storage_bits:
            layout = Layout(layout.minor_to_major, layout.tiles)
            object.__setattr__(self, "layout", layout)
        try:
            core = _core.TiledLayout(list(dims), layout._value, self.element_bits)
        except (ValueError, OverflowError) as e:
            raise LayoutError(f"{ShapeKey(element.name, dims)}{layout}: {e}") from None
        object.__setattr__(self, "_tiled", core)

    @classmethod
    def parse(cls, text: str) -> "Shape":
        if not isinstance(text, str):
            raise TypeError(f"Shape.parse expects str, got {type(text).__name__}")
        try:
            dtype, dims, layout_text = split_shape_text(text)
            return cls(dtype, dims, _parse_layout(layout_text, text) if layout_text is not None else None)
        except LayoutError as e:
            if shown(text) in str(e):
                raise
            raise LayoutError(f"{e} (in {shown(text)})") from None

    def equal(self, other: "Shape", *, ignore_layout: bool = False, ignore_element_size: bool = False,
              ignore_tiles: bool = False) -> bool:
        """Same type and dims, and layouts equal as Layout.equal says (or not compared)."""
        return self.key == other.key and (ignore_layout or self.layout.equal(
            other.layout, ignore_element_size=ignore_element_size, ignore_tiles=ignore_tiles))

    def __str__(self) -> str:
        return f"{self.key}{self.layout}"

    @property
    def key(self) -> ShapeKey:
        """The array type without its layout: `bf16[512,3,2048]`."""
        return ShapeKey(self.dtype, self.dims)

    @property
    def element(self) -> ElementType:
        return ELEMENT_TYPES[self.dtype]

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def element_bits(self) -> int:
        """Bits one element takes in the physical buffer."""
        return self.layout.element_bits or self.element.storage_bits

    @cached_property
    def physical_size_bytes(self) -> int:
        return self._tiled.physical_bytes

    @property
    def physical_elements(self) -> int:
        """Element slots in the physical buffer, padding included."""
        return self._tiled.physical_elements

    @property
    def logical_elements(self) -> int:
        return self._tiled.logical_elements

    @property
    def physical_order(self) -> tuple[int, ...]:
        """Logical dims from the physically major-most to the minor-most."""
        return tuple(reversed(self.layout.minor_to_major))


def _check_element_bits(element: ElementType, bits: int, shape) -> None:
    if bits == 0 or bits == element.storage_bits:
        return
    if element.is_sub_byte and element.bit_width <= bits < 8 and 8 % bits == 0:
        return
    allowed = [b for b in range(element.bit_width, 8) if 8 % b == 0] if element.is_sub_byte else []
    raise LayoutError(f"element size E({bits}) does not fit {element.name}; expected "
                      f"{' or '.join(f'E({b})' for b in allowed + [element.storage_bits])} or none")


def _as_int(value, what: str) -> int:
    if not is_integer(value):
        raise LayoutError(f"{what} {value!r} is not an integer")
    value = int(value)
    if not -INT64_MAX <= value <= INT64_MAX:
        raise LayoutError(f"{what} {value} does not fit in int64")
    return value


def _parse_layout(text: str, whole: str) -> Layout:
    order_text, _, extra = text.partition(":")
    minor_to_major = parse_ints(order_text, whole, "minor_to_major")
    tiles: tuple = ()
    element_bits = 0
    rest = extra
    m = _TILE_RE.match(rest)
    if m:
        groups = re.findall(r"\(([^()]*)\)", m.group(1))
        tiles = tuple(parse_ints(g, whole, "tile") for g in groups)
        rest = rest[m.end():]
    m = re.match(r"E\(([0-9]+)\)", rest)
    if m:
        element_bits = int(m.group(1))
        rest = rest[m.end():]
    if rest:
        raise LayoutError(f"unsupported layout part {shown(rest)} in {shown(whole)}; expected "
                          "T(...)(...) tiles and an optional E(bits)")
    return Layout(minor_to_major, tiles, element_bits)
