"""An array type without a layout, `bf16[512,3,2048]`: the one text form that
names a KV-cache shape in the layout table, the shape matrices, result CSVs,
reports and error messages."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvref.dtypes import element_type
from kvref.values import is_integer

_KEY_RE = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]", re.ASCII)


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
        object.__setattr__(self, "dims", tuple(dims))

    @classmethod
    def parse(cls, text: str) -> "ShapeKey":
        """`bf16[512,3,2048]` (no spaces, no layout) -> ShapeKey."""
        if not isinstance(text, str):
            raise TypeError(f"a shape key is text such as 'bf16[512,3,2048]', got "
                            f"{type(text).__name__}")
        m = _KEY_RE.fullmatch(text.strip())
        if not m or ",," in m.group(2) or m.group(2).startswith(",") or m.group(2).endswith(","):
            raise ValueError(f"malformed shape {text!r}; expected a dtype and dims such as "
                             "'bf16[512,3,2048]'")
        dims = tuple(int(d) for d in m.group(2).split(",")) if m.group(2) else ()
        return cls(m.group(1), dims)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"
