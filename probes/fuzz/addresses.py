"""Fuzz category `addresses`: every spelling of an address a serving stack
may hand kvref for peers to dial (a store's store_server_ip, the facade's
$VLLM_HOST_IP). Each input is drawn from a family whose answer is known
without kvref: spellings of the wildcard (0.0.0.0 and :: in any form the
resolver takes, IPv4-mapped too) must be refused, every other address taken."""

from __future__ import annotations

import kvref
from probes.fuzz.mismatch import Mismatch


def _v4_zero(rng) -> str:
    """0.0.0.0 as inet_aton takes it: one to four parts, each 0 in decimal, octal or hex."""
    parts = int(rng.integers(1, 5))
    spell = lambda: str(rng.choice(["0", "00", "000", "0x0", "0X00"]))  # noqa: E731
    return ".".join(spell() for _ in range(parts))


def _v6_zero(rng) -> str:
    """:: as eight zero groups, some compressed, each with up to four zeros."""
    groups = ["0" * int(rng.integers(1, 5)) for _ in range(8)]
    if rng.random() < 0.7:
        start = int(rng.integers(0, 8))
        end = int(rng.integers(start + 1, 9))  # "::" stands for one group or more
        text = ":".join(groups[:start]) + "::" + ":".join(groups[end:])
    else:
        text = ":".join(groups)
    return text


def _v4(rng) -> str:
    first = int(rng.integers(1, 224))
    return ".".join(str(p) for p in (first, *rng.integers(0, 256, 3)))


FAMILIES = {  # name: (draw, refused)
    "v4_wildcard": (_v4_zero, True),
    "v6_wildcard": (_v6_zero, True),
    "v6_wildcard_bracketed": (lambda rng: f"[{_v6_zero(rng)}]", True),
    "v4_mapped_wildcard": (lambda rng: f"::ffff:{'.'.join(['0'] * 4)}", True),
    "blank": (lambda rng: " " * int(rng.integers(0, 3)), True),
    "v4": (_v4, False),
    "loopback": (lambda rng: f"127.{'.'.join(str(p) for p in rng.integers(0, 256, 3))}", False),
    "v6": (lambda rng: ":".join(f"{int(g):x}" for g in rng.integers(1, 65536, 8)), False),
    "v4_mapped": (lambda rng: f"::ffff:{_v4(rng)}", False),
    "name": (lambda rng: "host-" + "".join(rng.choice(list("abcdefgh0123456789"), int(rng.integers(1, 12)))), False),
}


class PeerAddresses:
    name = "addresses"

    def generate(self, rng) -> dict:
        family = str(rng.choice(sorted(FAMILIES)))
        return {"family": family, "address": FAMILIES[family][0](rng)}

    def run(self, case: dict) -> str:
        address, refused = case["address"], FAMILIES[case["family"]][1]
        try:
            store = kvref.KVCacheStore(1, store_server_ip=address)
        except ValueError as e:
            if not refused:
                raise Mismatch(f"{address!r} ({case['family']}) refused: {e}") from None
            if "wildcard" not in str(e):
                raise Mismatch(f"{address!r} refused without saying it is a wildcard: {e}") from None
            return "refused"
        store.close()
        if refused:
            raise Mismatch(f"{address!r} ({case['family']}) binds every interface, and was taken")
        return "accepted"
