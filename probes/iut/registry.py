"""Every implementation under test, declared once: the CLI, the runner, the
worker and the predictions read this table. Adding an IUT is an Arrays or a
Library module (probes.iut.protocol) and one line here."""

from __future__ import annotations

import dataclasses

import kvref
from probes.iut import builds
from probes.iut.adapter import IUT, Adapter
from probes.iut.jax_arrays import JaxCpuArrays, JaxTpuArrays
from probes.iut.reference import KvrefLibrary, SimArrays
from probes.iut.torch_tpu import TORCH_TPU_GENERATIONS, TorchTpuArrays
from probes.iut.tpu_sync import TpuSyncJaxLibrary, TpuSyncTorchLibrary
from probes.iut.xla_arrays import TorchXlaArrays

IUTS: dict[str, IUT] = {iut.name: iut for iut in (
    IUT("kvref-sim", SimArrays, KvrefLibrary, targets=kvref.GENERATIONS, any_tpu_type=True),
    IUT("kvref-jax", JaxCpuArrays, KvrefLibrary, targets=("cpu",), preload=("jax",)),
    IUT("tpu-sync-jax", JaxCpuArrays, TpuSyncJaxLibrary, targets=("cpu",), interpreter="jax",
        preload=("jax",), loopback_only=True),
    IUT("kvref-torch-xla", TorchXlaArrays, KvrefLibrary, targets=("cpu",), interpreter="xla",
        preload=("torch_xla",), environment=(("PJRT_DEVICE", "CPU"),)),
    IUT("tpu-sync-jax-tpu", JaxTpuArrays, TpuSyncJaxLibrary, targets=kvref.GENERATIONS,
        interpreter="jax", jax_platforms=None, owns_device=True, startup_seconds=300.0,
        loopback_only=True),
    IUT("tpu-sync-torch-tpu", TorchTpuArrays, TpuSyncTorchLibrary, targets=TORCH_TPU_GENERATIONS,
        interpreter="torch", jax_platforms=None, owns_device=True, startup_seconds=300.0,
        loopback_only=True),
)}


def iut(name: str) -> IUT:
    """A declared IUT, or `NAME==VERSION`: that IUT with another build of its library."""
    base, version = builds.split(name)
    if base not in IUTS:
        raise ValueError(f"unknown implementation under test {base!r}; expected one of "
                         f"{sorted(IUTS)}, optionally NAME==VERSION for a build of its library")
    declared = IUTS[base]
    if version is None:
        return declared
    if declared.library.distribution not in builds.LIBRARIES:
        raise ValueError(f"{base} has no builds to choose; builds exist for "
                         f"{', '.join(n for n, i in IUTS.items() if i.library.distribution in builds.LIBRARIES)}")
    return dataclasses.replace(declared, name=name, build=version)


def check_target(name: str, generation: str) -> None:
    iut(name).check_target(generation)


def adapter_for(name: str, generation: str, faults: kvref.Faults = kvref.Faults(),
                options: dict | None = None) -> Adapter:
    return Adapter(iut(name), generation, faults, options)
