"""This project's own IUTs. Each is declared to kvprobe the way any team's
is: an entry point of the group `kvprobe.iuts` (pyproject.toml) naming one of
these objects, resolved by probes.iut.registry."""

from __future__ import annotations

import kvref
from probes.iut.adapter import IUT
from probes.iut.compat import CompatLibrary
from probes.iut.jax_arrays import JaxCpuArrays, JaxTpuArrays
from probes.iut.reference import KvrefLibrary, SimArrays
from probes.iut.torch_tpu import TORCH_TPU_GENERATIONS, TorchTpuArrays
from probes.iut.tpu_sync import TELEMETRY_VARIABLE, TpuSyncJaxLibrary, TpuSyncTorchLibrary
from probes.iut.xla_arrays import TorchXlaArrays

# Why a probe does not apply, said once for every IUT it holds for.
NO_SIM_VIEWS = ("pending_views", "the simulated device has no views of one array into another")
NO_JAX_VIEWS = ("pending_views", "a jax.Array has no views into another: slicing copies")
NO_TORCH_TPU_VIEWS = ("pending_views", "the TorchTPU adapter makes no views")
NO_JAX_PLANS = ("plan_binding", "tpu-sync-jax has no register_active_plan")
NO_WRAPPER_PLANS = ("plan_binding", "the wrapper API the facade serves has no register_active_plan")
NO_TORCH_PLANS = ("plan_binding", "tpu-sync-torch has no way to read a registered plan back")
# A host->device copy of a few MiB lands in about a millisecond on a TPU,
# before any check after the put can see it in flight.
NO_TORCH_ALLOCATOR = tuple((case, "tpu-sync-torch has no d2h_auto_allocate or unlock_blocks")
                           for case in ("host_chunks", "inflight_step", "release_order/save_in_flight",
                                        "release_order/exit_in_flight"))
# The torch arrays make each cache on one device.
NO_TORCH_MESH = tuple((probe, "these torch arrays make every cache on one device, never split over a mesh")
                      for probe in ("sharded_roundtrip", "block_sharded", "uneven_shards"))
# kvref cannot order a raw copy against a framework's computations, so on
# framework arrays it returns from each transfer once it has landed.
LANDS_BEFORE_RETURN = tuple((probe, "kvref returns from each transfer on these arrays once it has landed (it cannot "
                                     "order a raw copy against their framework's computations otherwise): nothing is "
                                     "ever in flight to overlap, drop or leave to the exit")
                            for probe in ("unawaited_transfers", "release_order/save_in_flight",
                                          "release_order/exit_in_flight"))
# torch_xla writes an in-place step's output to a new buffer: no step of it aliases a cache's storage.
NO_XLA_ALIASING = tuple((probe, "torch_xla gives an in-place step's output a buffer of its own, so no step "
                                "donates a cache in place") for probe in ("donation_in_place", "pull_across_donation"))
# The wheel records its pulls for dump_metrics_to_string only with this set, exactly so.
PULL_RECORDS = ("ENABLE_RAIDEN_METRICS", "true")
# Its process-wide metrics (bytes moved, the pool gauge) are scraped only through a telemetry backend a serving
# stack names; the prometheus one, as for a /metrics endpoint.
TELEMETRY = (TELEMETRY_VARIABLE, "prometheus")
# JAX, torch_xla and TorchTPU deadlock in a forked child of a process that used them: no cache is made there.
NO_FORKED_CACHES = tuple((f"fork_forms/{kind}", "this framework deadlocks in a forked child of a process that used "
                          "it (its runtime's threads stay in the parent), so no cache can be made there")
                         for kind in ("pool_in_child", "slots_in_child"))
# kvref's own manager has no worker or controller settings; its facade has tpu-sync's.
NO_WORKER = ("worker_registration", "kvref's own manager has no worker or controller (the wrapper's settings); "
                                    "its facade, kvref-compat, registers as the wrapper does")
NO_TORCH_WORKER = ("worker_registration", "the TorchTPU adapter builds tpu-sync-torch's manager without its worker "
                                          "settings")
# JAX CPU workers get enough devices for the sharded probes and the serving matrix (TP 8).
JAX_CPU_MESH = ("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# kvref holds an XLA tensor's buffer alive through DLPack, which has no f8 types in torch_xla.
XLA_NO_F8 = (("f8e4m3fn", "torch_xla's DLPack has no f8 types, so kvref cannot hold such a cache's buffer alive "
                          "while blocks move, and refuses it"),)
LANDS_AT_ONCE = ("host_transferred_construction",
                 "a TPU lands a host->device copy of a few MiB in about a millisecond, before it can be "
                 "seen in flight")

KVREF_SIM = IUT("kvref-sim", SimArrays, KvrefLibrary, targets=kvref.GENERATIONS, any_tpu_type=True,
                not_applicable=(NO_SIM_VIEWS, NO_WORKER))
KVREF_JAX = IUT("kvref-jax", JaxCpuArrays, KvrefLibrary, targets=("cpu",), preload=("jax",),
                environment=(JAX_CPU_MESH,),
                not_applicable=(NO_JAX_VIEWS, *LANDS_BEFORE_RETURN, *NO_FORKED_CACHES, NO_WORKER))
TPU_SYNC_JAX = IUT("tpu-sync-jax", JaxCpuArrays, TpuSyncJaxLibrary, targets=("cpu",), interpreter="jax",
                   preload=("jax",), environment=(JAX_CPU_MESH, PULL_RECORDS, TELEMETRY), loopback_only=True,
                   not_applicable=(NO_JAX_VIEWS, NO_JAX_PLANS, *NO_FORKED_CACHES))
# kvref's drop-in facade on the arrays tpu-sync-jax runs on, through the wrapper's API.
KVREF_COMPAT = IUT("kvref-compat", JaxCpuArrays, CompatLibrary, targets=("cpu",), preload=("jax",),
                   environment=(JAX_CPU_MESH,),
                   not_applicable=(NO_JAX_VIEWS, NO_WRAPPER_PLANS, *LANDS_BEFORE_RETURN, *NO_FORKED_CACHES))
KVREF_TORCH_XLA = IUT("kvref-torch-xla", TorchXlaArrays, KvrefLibrary, targets=("cpu",), interpreter="xla",
                      preload=("torch_xla",), environment=(("PJRT_DEVICE", "CPU"),),
                      not_applicable=(*NO_TORCH_MESH, *LANDS_BEFORE_RETURN, *NO_XLA_ALIASING, *NO_FORKED_CACHES,
                                      NO_WORKER),
                      unheld_dtypes=XLA_NO_F8)
TPU_SYNC_JAX_TPU = IUT("tpu-sync-jax-tpu", JaxTpuArrays, TpuSyncJaxLibrary, targets=kvref.GENERATIONS,
                       interpreter="jax", jax_platforms=None, owns_device=True, startup_seconds=300.0,
                       any_tpu_type=True, loopback_only=True, environment=(TELEMETRY,),
                       not_applicable=(NO_JAX_VIEWS, NO_JAX_PLANS, LANDS_AT_ONCE, *NO_FORKED_CACHES))
TPU_SYNC_TORCH_TPU = IUT("tpu-sync-torch-tpu", TorchTpuArrays, TpuSyncTorchLibrary,
                         targets=TORCH_TPU_GENERATIONS, interpreter="torch", jax_platforms=None,
                         owns_device=True, startup_seconds=300.0, any_tpu_type=True, loopback_only=True,
                         not_applicable=(NO_TORCH_TPU_VIEWS, NO_TORCH_PLANS, *NO_TORCH_ALLOCATOR, LANDS_AT_ONCE,
                                         *NO_TORCH_MESH, *NO_FORKED_CACHES, NO_TORCH_WORKER))
