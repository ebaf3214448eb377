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
    # This machine's TPU (probes.iut.hardware).
    "TpuUnavailable": "hardware:TpuUnavailable", "NO_TPU": "hardware:NO_TPU", "tpu_visible": "hardware:tpu_visible",
    "local_generation": "hardware:local_generation", "tpu_devices": "hardware:tpu_devices",
    "tpu_chips": "hardware:tpu_chips", "holdable_chips": "hardware:holdable_chips",
    "device_only_standin": "hardware:device_only_standin", "runtime_environment": "hardware:runtime_environment",
    "local_runtime": "hardware:local_runtime", "google_pci_devices": "hardware:google_pci_devices",
    # The environments of their own IUTs run in (probes.iut.peer_env), and library builds (probes.iut.builds).
    "PEER_ENVS": "peer_env:PEER_ENVS", "peer_env_named": "peer_env:peer_env", "declared_env": "peer_env:declared_env",
    "create_peer_env": "peer_env:create", "verify_peer_env": "peer_env:verify", "CHECKOUT": "peer_env:REPO",
    "ensure_build": "builds:ensure", "published_builds": "builds:published", "BuildUnavailable": "builds:BuildUnavailable",
    # What a library offers its callers, read from it (`kvprobe coverage`).
    "Entry": "surface:Entry",
    # The production library's manager, for the peer benchmark.
    "JaxSyncManager": "tpu_sync:JaxSyncManager",
    # Whole modules, only where a caller reads their source: a reproducer copies parts of these.
    "tpu_sync": "tpu_sync", "jax_arrays": "jax_arrays",
}
__all__ = sorted(FACE)


def __getattr__(name: str):
    if name not in FACE:
        raise AttributeError(f"module 'probes.iut' has no attribute {name!r}")
    module, _, attribute = FACE[name].partition(":")
    loaded = importlib.import_module(f"probes.iut.{module}")
    return getattr(loaded, attribute) if attribute else loaded
