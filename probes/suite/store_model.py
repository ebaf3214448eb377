"""The store of saved blocks as the contract states it (kvref.kv_store's
module docstring lists the rules; this is their second, independent
statement, so a prediction never agrees with the reference by
construction): entries in order of use, counted pins, lookup of the
leading run, all-or-nothing insert that evicts the least recently used
unpinned entries and never one it names."""

from __future__ import annotations

from collections import OrderedDict


class StoreModel:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: OrderedDict[bytes, int] = OrderedDict()  # hash -> chunk, least recently used first
        self.pins: dict[bytes, int] = {}

    def lookup(self, hashes: list[bytes]) -> list[tuple[bytes, int]]:
        run = []
        for h in hashes:
            if h not in self.entries:
                break
            run.append((h, self.entries[h]))
        return run

    def pin(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self.pins[h] = self.pins.get(h, 0) + 1

    def release(self, hashes: list[bytes]) -> None:
        for h in hashes:
            if self.pins.get(h, 0) == 0:
                continue
            self.pins[h] -= 1
            if self.pins[h] == 0:
                del self.pins[h]
                self.entries.move_to_end(h)

    def insert(self, hashes: list[bytes], chunks: list[int]) -> tuple[bool, list[bytes]]:
        """(taken, evicted): taken only if every hash was new and all fit."""
        new = [(h, c) for h, c in zip(hashes, chunks) if h not in self.entries]
        room = self.capacity - len(self.entries)
        evictable = [h for h in self.entries if h not in hashes and h not in self.pins]
        if len(new) > room + len(evictable):
            return False, []
        evicted = evictable[:max(0, len(new) - room)]
        for h in evicted:
            del self.entries[h]
        for h in hashes:
            if h in self.entries:
                self.entries.move_to_end(h)
        for h, c in new:
            self.entries[h] = c
        return len(new) == len(hashes), evicted
