"""Implementations under test: the adapter protocol, the reference, the
production libraries and the peer environments they run in.

This package's face: what the rooms to its left (probes.run, probes.report,
probes.bench) may use, each name below, imported from `probes.iut` itself
and never from a module of it (tests/probes/test_architecture.py holds them to it).
A name is loaded when first asked for, so importing the face costs nothing
and a worker loads only what it uses."""

from __future__ import annotations

import importlib

# name -> "module" (the module itself) or "module:attribute", within probes.iut.
FACE = {
    # Which IUTs there are, and each one's declared value.
    "IUT": "adapter:IUT", "IUTError": "registry:IUTError", "iut": "registry:iut",
    "usable_iuts": "registry:usable_iuts", "known_iuts": "registry:known_iuts",
    "source_of_iut": "registry:source_of_iut", "adapter_for": "registry:adapter_for",
    "STARTUP_SECONDS": "adapter:STARTUP_SECONDS",
    # How one of its workers is started (probes.iut.launch).
    "python_of": "launch:python_of", "build_missing": "launch:build_missing", "environment": "launch:environment",
    "side_environments": "launch:side_environments",
    # This machine's TPU, the environments of their own IUTs run in, library builds.
    "hardware": "hardware", "TpuUnavailable": "hardware:TpuUnavailable", "peer_env": "peer_env",
    "PEER_ENVS": "peer_env:PEER_ENVS", "builds": "builds",
    # What a library offers its callers, read from it (`kvprobe coverage`).
    "Entry": "surface:Entry",
    # The production library's halves, for a reproducer and the peer benchmark.
    "tpu_sync": "tpu_sync", "jax_arrays": "jax_arrays",
}
__all__ = sorted(FACE)


def __getattr__(name: str):
    if name not in FACE:
        raise AttributeError(f"module 'probes.iut' has no attribute {name!r}")
    module, _, attribute = FACE[name].partition(":")
    loaded = importlib.import_module(f"probes.iut.{module}")
    return getattr(loaded, attribute) if attribute else loaded
