"""Block lists and flags in every form a caller may pass them: NumPy arrays
and scalars of every type, mixed scalar types, masked arrays, 0-d arrays,
tuples. A form is JSON (a failing input replays), and the model says, from
the documented meaning alone, whether the value is a block list or a flag at
all: integers of any NumPy integer type are, bools, floats, time spans,
strings and masked entries are not."""

from __future__ import annotations

import numpy as np

INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
OTHER_DTYPES = ("bool", "float16", "float32", "float64", "longdouble", "complex64", "complex128",
                "timedelta64[s]", "datetime64[s]", "str", "bytes", "object")
FORMS = ("list", "tuple", "array", "scalars", "mixed_scalars", "masked", "zero_d_items")


class NotABlockList(str):
    """The model's reason a value is not a block list at all."""


def random_form(rng, values: list, block_list: bool = False) -> dict:
    """How to pass `values` (plain ints, or anything): a form and a dtype that
    can hold them, or the plain list when no NumPy form can. With
    `block_list`, only forms that are block lists."""
    if rng.random() < 0.6 or not all(type(v) is int for v in values):
        return {"form": "list"}
    form = FORMS[int(rng.integers(1, len(FORMS) - 2 * block_list))]  # masked and 0-d items come last
    dtypes = INTEGER_DTYPES if block_list or rng.random() < 0.6 else OTHER_DTYPES
    dtype = dtypes[int(rng.integers(len(dtypes)))]
    if not _holds(dtype, values) or (form in ("scalars", "mixed_scalars") and dtype == "object") \
            or (form == "mixed_scalars" and dtype not in INTEGER_DTYPES):
        return {"form": "list"} if form != "tuple" else {"form": "tuple"}
    return {"form": form, "dtype": dtype}


def _holds(dtype: str, values: list) -> bool:
    """Whether NumPy builds an array of `dtype` from `values` without wrapping."""
    if dtype in INTEGER_DTYPES:
        info = np.iinfo(dtype)
        return all(info.min <= v <= info.max for v in values)
    if dtype.startswith(("timedelta64", "datetime64")):
        return all(-(2**63) < v < 2**63 for v in values)  # int64 counts, NaT excluded
    return True


def materialize(values: list, form: dict):
    """The object a caller passes."""
    kind = form["form"]
    if kind == "list":
        return list(values)
    if kind == "tuple":
        return tuple(values)
    dtype = np.dtype(form["dtype"])
    items = [str(v) for v in values] if dtype.kind in "US" else values
    if kind == "array":
        return np.array(items, dtype=dtype)
    if kind == "masked":
        return np.ma.array(np.array(items, dtype=dtype), mask=[i % 2 for i in range(len(values))])
    if kind == "zero_d_items":
        return [np.array(v, dtype=dtype) for v in items]
    if kind == "mixed_scalars":  # every other one of the widest type of the other signedness
        other = np.dtype("int64" if dtype.kind == "u" else "uint64")
        return [(other if i % 2 and 0 <= v < 2**63 else dtype).type(v) for i, v in enumerate(values)]
    return list(np.array(items, dtype=dtype))  # NumPy scalars of `dtype`


def model_values(values: list, form: dict) -> list | NotABlockList:
    """The plain values the block model judges, or why the object is not a
    block list whatever its values."""
    kind, dtype = form["form"], form.get("dtype")
    if kind == "masked":
        return NotABlockList("a masked array")
    if kind in ("list", "tuple") or dtype in INTEGER_DTYPES and kind != "zero_d_items":
        return list(values)
    if not values:
        return []  # an empty list or array of any type names no block
    return NotABlockList(f"{kind} of {dtype}" if kind != "zero_d_items" else "0-d arrays as items")


FLAGS = {  # how a flag is passed: (the object, whether it is a bool)
    "True": (lambda: True, True), "np.True_": (lambda: np.True_, True),
    "1": (lambda: 1, False), "np.int8(1)": (lambda: np.int8(1), False), "1.0": (lambda: 1.0, False),
    "'true'": (lambda: "true", False), "'false'": (lambda: "false", False), "None": (lambda: None, False),
    "np.array(True)": (lambda: np.array(True), False), "[True]": (lambda: [True], False),
}


def random_flag(rng, valid_share: float = 0.6) -> str:
    names = list(FLAGS)
    return names[int(rng.integers(2))] if rng.random() < valid_share else names[int(rng.integers(2, len(names)))]
