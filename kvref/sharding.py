"""How a cache is split over a device mesh, in one text form used by the CLI,
matrices, CSVs and reports: `mesh(data=2,model=4) spec(data,None,model)`.

The mesh names its axes and their sizes, major first; the spec says, per
dimension of the array, which mesh axes split it (`None`: none; `(a,b)`: two
axes, a major), as JAX's PartitionSpec does. A spec shorter than the array's
rank leaves the remaining dimensions whole; an axis the spec does not name
replicates the array along it. Devices are numbered row-major over the mesh.

What a block id means on a sharded cache (the reference's rule, see
`KVCacheManager`): block ids are global. Where dimension 0 (the blocks) is
split, block b lives on the devices whose part of dimension 0 holds it, and
only those move it; where other dimensions are split, each device holds its
part of every block, and a host block holds all of a block's parts."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from kvref import _core

_AXIS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit takes other scripts' digits too
_TEXT = re.compile(r"\s*mesh\((?P<mesh>[^()]*)\)\s*spec\((?P<spec>(?:[^()]|\([^()]*\))*)\)\s*")
FORM = "mesh(AXIS=SIZE,...) spec(ENTRY,...), each ENTRY None, an axis, or (axis,axis,...)"


@dataclass(frozen=True)
class Sharding:
    mesh: tuple[tuple[str, int], ...]  # (axis, size), major first
    spec: tuple[tuple[str, ...], ...]  # per leading dimension, the axes splitting it

    def __post_init__(self):
        names = [name for name, _ in self.mesh]
        if not self.mesh:
            raise ValueError(f"sharding {self} has an empty mesh; expected {FORM}")
        for name, size in self.mesh:
            if not isinstance(name, str) or not _AXIS.fullmatch(name) or name == "None":
                raise ValueError(f"mesh axis name {name!r} in {self} is not an identifier")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"mesh axis {name} in {self} has size {size!r}; expected a positive integer")
        if len(set(names)) != len(names):
            raise ValueError(f"mesh of {self} names an axis twice")
        used = [axis for entry in self.spec for axis in entry]
        unknown = sorted(set(used) - set(names))
        if unknown:
            raise ValueError(f"spec of {self} names axis {', '.join(unknown)}, not in the mesh "
                             f"(axes: {', '.join(names)})")
        if len(set(used)) != len(used):
            raise ValueError(f"spec of {self} splits two dimensions over one mesh axis")

    @classmethod
    def parse(cls, text: str) -> "Sharding":
        if not isinstance(text, str):
            raise TypeError(f"a sharding is text ({FORM}), got {type(text).__name__}")
        found = _TEXT.fullmatch(text)
        if not found:
            raise ValueError(f"cannot read sharding {text!r}; expected {FORM}, "
                             "e.g. mesh(data=2,model=4) spec(data,None,model)")
        mesh = []
        for item in _split(found["mesh"]):
            name, eq, size = item.partition("=")
            if not eq or not _SIZE.fullmatch(size.strip()):
                raise ValueError(f"mesh axis {item!r} in {text!r} is not AXIS=SIZE (a size of ASCII digits)")
            mesh.append((name.strip(), int(size)))
        spec = tuple(_spec_entry(item, text) for item in _split(found["spec"]))
        return cls(tuple(mesh), spec)

    def __str__(self) -> str:
        mesh = ",".join(f"{name}={size}" for name, size in self.mesh)
        entries = ("None" if not e else e[0] if len(e) == 1 else f"({','.join(e)})" for e in self.spec)
        return f"mesh({mesh}) spec({','.join(entries)})"

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.mesh)

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.mesh)

    def partition_spec(self) -> tuple:
        """The spec's entries as jax.sharding.PartitionSpec takes them."""
        return tuple(None if not e else e[0] if len(e) == 1 else e for e in self.spec)

    @property
    def devices(self) -> int:
        return math.prod(size for _, size in self.mesh)

    def parts(self, dim: int) -> int:
        """How many parts dimension `dim` is split into."""
        sizes = dict(self.mesh)
        return math.prod(sizes[a] for a in self.spec[dim]) if dim < len(self.spec) else 1

    def check(self, dims) -> tuple[int, ...]:
        """The dims, checked: the spec fits the rank and each split divides."""
        dims = tuple(int(d) for d in dims)
        if len(self.spec) > len(dims):
            raise ValueError(f"sharding {self} splits {len(self.spec)} dimensions of a rank-{len(dims)} "
                             "array; the spec may have at most one entry per dimension")
        for d, size in enumerate(dims):
            if size % self.parts(d):
                raise ValueError(f"sharding {self} splits dimension {d} ({size}) into {self.parts(d)} "
                                 f"parts, which does not divide it")
        return dims

    def shard_dims(self, dims) -> tuple[int, ...]:
        """One device's part of an array of `dims`."""
        dims = self.check(dims)
        return tuple(size // self.parts(d) for d, size in enumerate(dims))

    def shard_starts(self, dims) -> list[tuple[int, ...]]:
        """Per device (row-major over the mesh), where its part starts in each dimension."""
        shard, sizes = self.shard_dims(dims), dict(self.mesh)
        starts = []
        for coords in itertools.product(*map(range, self.axis_sizes)):
            at = dict(zip(self.axis_names, coords))
            starts.append(tuple(_part_index(self.spec[d] if d < len(self.spec) else (), at, sizes) * shard[d]
                                for d in range(len(shard))))
        return starts

    @property
    def splits_blocks(self) -> bool:
        return self.parts(0) > 1


# Where one device's shard of a layer lies (csrc/block_mover.h, declared there
# once): first_block, the global id of the device's first block; host_slot,
# which part of a host block its part of a block fills; host_slots, the parts
# a host block holds; reads, whether it is the copy a d2h reads (replicas hold
# the same bytes, and every one is written).
ShardPlacement = _core.ShardPlacement


def placements_of(starts: list[tuple[int, ...]]) -> list[ShardPlacement]:
    """Placements of shards that start at `starts` (per shard, per dimension):
    the parts of a block, one host slot each, ordered by where they start."""
    slots = sorted({tuple(start[1:]) for start in starts})
    seen, found = set(), []
    for start in map(tuple, starts):
        found.append(ShardPlacement(first_block=start[0], host_slot=slots.index(start[1:]), host_slots=len(slots),
                                    reads=start not in seen))
        seen.add(start)
    return found


def _part_index(axes: tuple[str, ...], at: dict, sizes: dict) -> int:
    """A device's part along a dimension split over `axes` (mixed radix, major first)."""
    index = 0
    for axis in axes:
        index = index * sizes[axis] + at[axis]
    return index


def _split(text: str) -> list[str]:
    """Comma-separated items, commas inside parentheses kept."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip() or items:
        items.append(current.strip())
    return items


def _spec_entry(item: str, text: str) -> tuple[str, ...]:
    if item == "None":
        return ()
    if item.startswith("(") and item.endswith(")"):
        axes = tuple(a.strip() for a in item[1:-1].split(","))
    else:
        axes = (item,)
    for axis in axes:
        if not _AXIS.fullmatch(axis) or axis == "None":
            raise ValueError(f"spec entry {item!r} in {text!r} is not None, an axis or (axis,axis,...)")
    return axes


def uneven_parts(dims, dim: int, parts: int) -> list[tuple[slice, ...]]:
    """Where each of `parts` pieces of an array of `dims` lies when dimension
    `dim` is split where `parts` does not divide it: equal pieces, the
    remainder on the last (as tpu-sync's shard arithmetic splits)."""
    size = dims[dim]
    if parts < 1 or size < parts:
        raise ValueError(f"cannot split dimension {dim} ({size}) into {parts} parts")
    base = size // parts
    bounds = [i * base for i in range(parts)] + [size]
    return [tuple(slice(a, b) if d == dim else slice(None) for d in range(len(dims)))
            for a, b in zip(bounds[:-1], bounds[1:])]
