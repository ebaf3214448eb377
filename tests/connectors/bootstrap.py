"""The driver process's set-up, before jax or any connector is imported:
the environment tpu-inference reads, the stand-ins on sys.path, the
tpu_inference package without its __init__, and the library the connectors
import as `tpu_raiden` (the facade, or tpu-sync-jax's wheel)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "standins"
LIBRARIES = ("facade", "tpu-sync-jax")
DEVICES = 8

# What the connectors and runner/kv_cache.py read from the environment, fixed
# here so every run is the same. VLLM_HOST_IP is what vllm's get_ip (the
# stand-in) answers, so the disaggregated connector advertises 127.0.0.1.
ENVIRONMENT = {
    "VLLM_HOST_IP": "127.0.0.1",
    "JAX_PLATFORMS": "cpu",
    "TPU_MULTIHOST_BACKEND": "",
    "TPU_OFFLOAD_DECODE_SAVE": "0",
    "CLOUD_TPU_TASK_ID": "0",
    "RAIDEN_NUM_SLOTS": "4",
    "RAIDEN_TRANSPORT_PARALLELISM": "1",
    "TPU_P2P_WAIT_PULL_TIMEOUT": "30",
}


def prepare_environment() -> None:
    """Set the environment before jax starts: 8 CPU devices."""
    for key, value in ENVIRONMENT.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip()
    if "jax" in sys.modules:
        raise RuntimeError("jax was imported before the driver set XLA_FLAGS")


def put_standins_on_path() -> None:
    """The stand-ins (vllm, torch, torchax) first on sys.path: this process only."""
    for name in ("vllm", "torch", "torchax"):
        found = importlib.util.find_spec(name)
        if found is not None and not str(found.origin or "").startswith(str(STANDINS)):
            raise RuntimeError(f"a real {name!r} is importable here ({found.origin}); the driver's stand-ins "
                               "would shadow it: run in the peer environment, which has none")
    sys.path.insert(0, str(STANDINS))


def load_tpu_inference() -> Path:
    """tpu_inference as a package whose __init__ is not run: the installed
    __init__ pre-loads tpu-sync-jax's native modules and asks the GCE metadata
    server for TPU info over the network (tpu_inference/tpu_info.py), neither
    of which belongs in a CPU run that must only touch 127.0.0.1. A module
    object with __path__ set to the installed package directory lets its
    submodules import as they are."""
    spec = importlib.util.find_spec("tpu_inference")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("tpu_inference is not installed in this interpreter "
                                  "(pip install --no-deps tpu-inference==0.32.0)")
    path = Path(list(spec.submodule_search_locations)[0])
    package = types.ModuleType("tpu_inference")
    package.__path__ = [str(path)]
    package.__file__ = str(path / "__init__.py")
    package.__package__ = "tpu_inference"
    package.__spec__ = importlib.util.spec_from_file_location("tpu_inference", path / "__init__.py",
                                                              submodule_search_locations=[str(path)])
    sys.modules["tpu_inference"] = package
    return path


def install_library(lib: str) -> dict:
    """Make `tpu_raiden` importable as the library under test; returns what was done.

    facade: kvref.compat.tpu_sync.install("tpu_raiden").
    tpu-sync-jax: its wheel installs the package `tpu_sync` (no `tpu_raiden`
    anywhere), so `tpu_raiden`, `tpu_raiden.api` and `tpu_raiden.api.jax`
    are that package's own modules under the name the connectors import;
    nothing is added to them, so whatever the wheel lacks (the store the
    offload connector imports) stays missing."""
    if lib == "facade":
        from kvref.compat import tpu_sync
        tpu_sync.install("tpu_raiden")
        return {"tpu_raiden": "kvref.compat.tpu_sync (install)"}
    if lib == "tpu-sync-jax":
        if importlib.util.find_spec("tpu_raiden") is not None:
            raise RuntimeError("a package named tpu_raiden is installed here; refusing to run over it")
        done = {}
        for name in ("tpu_sync", "tpu_sync.api", "tpu_sync.api.jax"):
            module = importlib.import_module(name)
            alias = name.replace("tpu_sync", "tpu_raiden", 1)
            sys.modules[alias] = module
            done[alias] = name
        sys.modules["tpu_raiden.api.jax.kv_cache_manager"] = importlib.import_module(
            "tpu_sync.api.jax.kv_cache_manager")
        done["tpu_raiden.api.jax.kv_cache_manager"] = "tpu_sync.api.jax.kv_cache_manager"
        return done
    raise ValueError(f"--lib must be one of {LIBRARIES}, got {lib!r}")


def library_version(lib: str) -> str:
    from importlib import metadata
    dist = "kvref" if lib == "facade" else "tpu-sync-jax"
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def stand_in_runner_module() -> None:
    """tpu_inference.runner.tpu_runner as a module holding only TPUModelRunner
    (tests.connectors.engine.ModelRunner). The disaggregated connector imports
    TPUModelRunner at module level, for annotations only; the real module
    imports torch, flax, vllm's model runner and every model, none of which a
    CPU test of the connectors can install. What register_runner reads of
    the runner (kv_caches, mesh, topology_order_id) the stand-in has."""
    from tests.connectors.engine import ModelRunner
    module = types.ModuleType("tpu_inference.runner.tpu_runner",
                              "Stand-in: TPUModelRunner is tests.connectors.engine.ModelRunner.")
    module.TPUModelRunner = ModelRunner
    sys.modules["tpu_inference.runner.tpu_runner"] = module
