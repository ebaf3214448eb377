"""This project's own IUTs. Each is declared to kvprobe the way any team's
is: an entry point of the group `kvprobe.iuts` (pyproject.toml) naming one of
these objects, resolved by probes.iut.registry."""

from __future__ import annotations

import kvref
from probes.iut.adapter import IUT
from probes.iut.jax_arrays import JaxCpuArrays, JaxTpuArrays
from probes.iut.reference import KvrefLibrary, SimArrays
from probes.iut.torch_tpu import TORCH_TPU_GENERATIONS, TorchTpuArrays
from probes.iut.tpu_sync import TpuSyncJaxLibrary, TpuSyncTorchLibrary
from probes.iut.xla_arrays import TorchXlaArrays

KVREF_SIM = IUT("kvref-sim", SimArrays, KvrefLibrary, targets=kvref.GENERATIONS, any_tpu_type=True)
KVREF_JAX = IUT("kvref-jax", JaxCpuArrays, KvrefLibrary, targets=("cpu",), preload=("jax",))
TPU_SYNC_JAX = IUT("tpu-sync-jax", JaxCpuArrays, TpuSyncJaxLibrary, targets=("cpu",), interpreter="jax",
                   preload=("jax",), loopback_only=True)
KVREF_TORCH_XLA = IUT("kvref-torch-xla", TorchXlaArrays, KvrefLibrary, targets=("cpu",), interpreter="xla",
                      preload=("torch_xla",), environment=(("PJRT_DEVICE", "CPU"),))
TPU_SYNC_JAX_TPU = IUT("tpu-sync-jax-tpu", JaxTpuArrays, TpuSyncJaxLibrary, targets=kvref.GENERATIONS,
                       interpreter="jax", jax_platforms=None, owns_device=True, startup_seconds=300.0,
                       loopback_only=True)
TPU_SYNC_TORCH_TPU = IUT("tpu-sync-torch-tpu", TorchTpuArrays, TpuSyncTorchLibrary,
                         targets=TORCH_TPU_GENERATIONS, interpreter="torch", jax_platforms=None,
                         owns_device=True, startup_seconds=300.0, loopback_only=True)
