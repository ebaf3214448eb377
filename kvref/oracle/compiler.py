"""Ask the real XLA TPU compiler (libtpu, ahead of time, no TPU needed) which
layout it gives an array: compile `zeros(shape)` for one device of a TPU
topology and read the output's layout and size back."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kvref.dtypes import element_type
from kvref.generations import TOPOLOGIES, check_generation
from kvref.shape import Layout, Shape
from kvref.shape_key import ShapeKey


class OracleUnavailable(RuntimeError):
    """Neither the shipped table nor a working compiler can answer."""


@dataclass(frozen=True)
class CompiledLayout:
    shape: Shape
    output_bytes: int  # the compiler's own size for the output buffer
    device_kind: str


def versions() -> dict[str, str]:
    """Versions of jax, jaxlib and libtpu, or raise OracleUnavailable."""
    from importlib import metadata

    found = {}
    for dist in ("jax", "jaxlib", "libtpu"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise OracleUnavailable(
                f"the live TPU compiler needs {dist}, which is not installed; "
                "install the oracle extra: pip install 'kvref[oracle]'") from None
    return found


@functools.cache
def _device(generation: str):
    versions()
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(topology_name=TOPOLOGIES[generation], platform="tpu")
    except Exception as e:  # libtpu raises many kinds of errors here
        raise OracleUnavailable(f"libtpu could not describe topology {TOPOLOGIES[generation]!r}: {e}") from e
    return topology.devices[0]


def compile_layout(dtype, dims, generation: str) -> CompiledLayout:
    """The layout the TPU compiler of `generation` picks for a new array."""
    check_generation(generation)
    element = element_type(dtype)
    dims = tuple(int(d) for d in dims)
    device = _device(generation)
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    fn = jax.jit(lambda: jnp.zeros(dims, element.numpy), out_shardings=SingleDeviceSharding(device))
    compiled = fn.lower().compile()
    out_dtype = element_type(compiled.out_info.dtype).name
    if out_dtype != element.name:
        raise OracleUnavailable(f"the compiler made {ShapeKey(element.name, dims)} into {out_dtype} "
                                "(64-bit types need jax_enable_x64)")
    shape = Shape(element.name, dims, Layout.from_jax(compiled.output_formats.layout))
    output_bytes = compiled.memory_analysis().output_size_in_bytes
    return CompiledLayout(shape, int(output_bytes), device.device_kind)
