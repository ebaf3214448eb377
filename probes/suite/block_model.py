"""A plain model of a block manager: every layer's device blocks and host
blocks as bytes, and the rule that decides whether a d2h or h2d request is
valid. Valid requests move whole blocks; invalid ones must be refused and
change nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class BlockModel:
    device: list[list[bytes]]  # per layer, per device block
    host: list[list[bytes | None]] = field(default_factory=list)  # per layer, per host block
    host_blocks: int = 0
    zeroed_pool: bool = True  # False: a new pool's contents are unknown (None) until written

    def __post_init__(self):
        if not self.host:
            self.host = [[bytes(len(layer[0])) if self.zeroed_pool else None] * self.host_blocks
                         for layer in self.device]

    @property
    def rows(self) -> int:
        return len(self.device[0])

    def problem(self, d2h: bool, src, dst, sizes) -> str | None:
        """Why a request is invalid, or None when a correct manager must do it."""
        sizes = [1] * len(src) if sizes is None else sizes
        if not (len(src) == len(dst) == len(sizes)):
            return "lists of different lengths"
        for values in (src, dst, sizes):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX:
                    return f"{v!r} is not an int64 block number"
        src_limit, dst_limit = (self.rows, self.host_blocks) if d2h else (self.host_blocks, self.rows)
        for s, d, n in zip(src, dst, sizes):
            if n < 1:
                return f"copy size {n}"
            if s < 0 or d < 0 or s + n > src_limit or d + n > dst_limit:
                return f"range out of bounds ({s}, {d}, {n})"
        spans = sorted((d, d + n) for d, n in zip(dst, sizes))
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
            return "overlapping destinations"
        return None

    def apply(self, d2h: bool, src, dst, sizes) -> None:
        """Carry out a valid request."""
        sizes = [1] * len(src) if sizes is None else sizes
        for layer in range(len(self.device)):
            source = self.device[layer] if d2h else self.host[layer]
            target = self.host[layer] if d2h else self.device[layer]
            moved = [(d + k, source[s + k]) for s, d, n in zip(src, dst, sizes) for k in range(n)]
            for index, block in moved:
                target[index] = block
