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
from kvref.generations import CHIP_CONFIGS, DEFAULT_TOPOLOGIES, TOPOLOGIES, check_generation
from kvref.shape import Layout, Shape
from kvref.shape_key import ShapeKey
from kvref.sharding import Sharding


class OracleUnavailable(RuntimeError):
    """Neither the shipped table nor a working compiler can answer."""


class LayoutRefused(ValueError):
    """The compiler would not lay an array out as requested."""


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
    return _devices(generation, 1)[0]


# Larger topologies of a chip, tried in order for a mesh its own topology
# cannot hold (2-D chips, then 3-D ones).
MESH_TOPOLOGIES = ("2x2", "2x4", "4x4", "4x8", "2x2x1", "2x2x2", "2x2x4", "2x4x4")


@functools.cache
def _devices(generation: str, count: int) -> tuple:
    """At least `count` devices of one topology of this TPU type: the one its
    name gives, or for a chip named alone, the first libtpu accepts that is
    large enough."""
    check_generation(generation)
    versions()
    if ":" in generation:
        devices = _describe(generation).devices
        if len(devices) < count:
            raise ValueError(f"a mesh of {count} devices is larger than topology {generation} "
                             f"({len(devices)} devices)")
        return tuple(devices)
    chip = generation
    tried = ([TOPOLOGIES[chip].split(":")[1]] if chip in TOPOLOGIES else list(DEFAULT_TOPOLOGIES))
    tried += [t for t in MESH_TOPOLOGIES if t not in tried] if count > 1 else []
    errors = []
    for topology in tried:
        try:
            devices = _describe(f"{chip}:{topology}").devices
        except OracleUnavailable as e:
            errors.append(str(e))
            continue
        if len(devices) >= count:
            return tuple(devices)
    if errors and len(errors) == len(tried):
        raise OracleUnavailable(f"the installed libtpu compiles for no {generation!r} topology of "
                                f"{', '.join(tried)}: {errors[0]}")
    raise ValueError(f"a mesh of {count} devices is larger than any {chip} topology tried "
                     f"({', '.join(tried)})")


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

    config = CHIP_CONFIGS.get(name.partition(":")[0])  # as the chip's hosts run it
    try:
        with _libtpu_quiet():
            if config:
                return topologies.get_topology_desc(topology_name=name, platform="tpu", chip_config_name=config)
            return topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as e:  # libtpu raises many kinds of errors here
        raise OracleUnavailable(f"libtpu could not describe topology {name!r}: {_first_line(e)} "
                                f"(libtpu's messages: {libtpu_log()})") from e


def _first_line(e: BaseException) -> str:
    """The first line of libtpu's or jax's message (they run to pages), or the error's type."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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


def compile_layout(dtype, dims, generation: str, sharding: Sharding | None = None,
                   requested: Layout | None = None) -> CompiledLayout:
    """The layout the TPU compiler of `generation` picks for a new array; with
    a sharding, for one device's shard of it (compiled over the whole mesh),
    and the size is one device's. `requested`: the layout asked for through
    JAX's layout API (its tiles, if none, the compiler's to choose); what the
    compiler gives may differ, so the answer is what it gave."""
    check_generation(generation)
    element = element_type(dtype)
    dims = tuple(int(d) for d in dims)
    shard_dims = dims if sharding is None else sharding.shard_dims(dims)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    if sharding is None:
        device = _device(generation)
        out = SingleDeviceSharding(device)
    else:
        devices = _devices(generation, sharding.devices)[: sharding.devices]
        device = devices[0]
        mesh = Mesh(np.array(devices, dtype=object).reshape(sharding.axis_sizes), sharding.axis_names)
        out = NamedSharding(mesh, PartitionSpec(*sharding.partition_spec()))
    if requested is not None:
        from jax.experimental.layout import Format
        from jax.experimental.layout import Layout as JaxLayout

        out = Format(JaxLayout(major_to_minor=tuple(reversed(requested.minor_to_major)),
                               tiling=requested.tiles or None), out)
    fn = jax.jit(lambda: jnp.zeros(dims, element.numpy), out_shardings=out)
    try:
        with _libtpu_quiet():
            compiled = fn.lower().compile()
    except Exception as e:  # jax raises several kinds; only a requested layout is the caller's to answer for
        if requested is None:
            raise
        raise LayoutRefused(f"the {generation} compiler refused layout {{{requested}}} for "
                            f"{ShapeKey(element.name, dims)}: {_first_line(e)[:300]}") from None
    out_dtype = element_type(compiled.out_info.dtype).name
    if out_dtype != element.name:
        raise OracleUnavailable(f"the compiler made {ShapeKey(element.name, dims)} into {out_dtype} "
                                "(64-bit types need jax_enable_x64)")
    shape = Shape(element.name, shard_dims, Layout.from_jax(compiled.output_formats.layout))
    output_bytes = compiled.memory_analysis().output_size_in_bytes
    return CompiledLayout(shape, int(output_bytes), device.device_kind)
