"""File names made from layout and shape texts."""

from __future__ import annotations


def file_safe(text: str) -> str:
    """`bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}` -> `bf16_512_3_2048__2_0_1_T_8_128__2_1`."""
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")
