"""Ask the real XLA TPU compiler (libtpu, ahead of time, no TPU needed) which
layout it gives an array: compile `zeros(shape)` for one device of a TPU
topology and read the output's layout and size back."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass

from kvref.dtypes import element_type
from kvref.generations import DEFAULT_TOPOLOGIES, TOPOLOGIES, check_generation
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
    check_generation(generation)
    versions()
    if generation in TOPOLOGIES or ":" in generation:
        return _describe(TOPOLOGIES.get(generation, generation)).devices[0]
    errors = []
    for topology in DEFAULT_TOPOLOGIES:  # a bare chip: the first topology libtpu accepts
        try:
            return _describe(f"{generation}:{topology}").devices[0]
        except OracleUnavailable as e:
            errors.append(str(e))
    raise OracleUnavailable(f"the installed libtpu compiles for no {generation!r} topology of "
                            f"{', '.join(DEFAULT_TOPOLOGIES)}: {errors[0]}")


# Ahead-of-time compiles open no TPU, so several processes may load libtpu at
# once (a run's parent and its workers, test processes) without its lockfile.
MULTIPLE_LOADS = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def libtpu_log() -> str:
    from kvref.oracle.cache import cache_root

    return str(cache_root() / "libtpu.log")


@contextlib.contextmanager
def _libtpu_quiet():
    """libtpu's start-up chatter on a host without a TPU (TPU environment
    warnings, source location traces) goes to libtpu_log(), not the user's
    terminal; an error names that file."""
    path = libtpu_log()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield  # nowhere to put it: the chatter stays where it was
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


def _describe(name: str):
    os.environ.setdefault(*MULTIPLE_LOADS)
    from jax.experimental import topologies

    try:
        with _libtpu_quiet():
            return topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as e:  # libtpu raises many kinds of errors here
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OracleUnavailable(f"libtpu could not describe topology {name!r}: {first} "
                                f"(libtpu's messages: {libtpu_log()})") from e


def device_kind(generation: str) -> str:
    """The device kind the compiler reports for this TPU type ("TPU v2")."""
    return _device(generation).device_kind


def accepts(generation: str) -> str | None:
    """None when the installed libtpu compiles for this TPU type, else why not."""
    try:
        _device(generation)
    except (OracleUnavailable, ValueError) as e:
        return str(e)
    return None


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
    with _libtpu_quiet():
        compiled = fn.lower().compile()
    out_dtype = element_type(compiled.out_info.dtype).name
    if out_dtype != element.name:
        raise OracleUnavailable(f"the compiler made {ShapeKey(element.name, dims)} into {out_dtype} "
                                "(64-bit types need jax_enable_x64)")
    shape = Shape(element.name, dims, Layout.from_jax(compiled.output_formats.layout))
    output_bytes = compiled.memory_analysis().output_size_in_bytes
    return CompiledLayout(shape, int(output_bytes), device.device_kind)
