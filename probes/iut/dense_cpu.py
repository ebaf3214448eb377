"""What arrays on a CPU backend share: no TPU layout, every array dense and
row-major as the backend's own compiler lays it out (JAX's and XLA's CPU
backends alike), and `cpu` as the device kind."""

from __future__ import annotations

import kvref


class DenseCpuArrays:
    platform = ""  # the backend, as the layout's source names it: "JAX", "XLA"

    def __init__(self, generation: str):
        self.generation = generation

    @classmethod
    def layout_of(cls, generation: str, key: kvref.ShapeKey) -> tuple[kvref.Shape, str]:
        return kvref.Shape(key.dtype, key.dims), f"dense ({cls.platform} CPU)"

    @property
    def device_kind(self) -> str:
        return "cpu"
