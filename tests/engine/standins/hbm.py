"""Stand-in for tpu_inference.utils.get_device_hbm_limit.

The KV cache is sized from each device's HBM limit: memory_stats() gives none
on a CPU device, so tpu-inference falls back to live-array accounting and
`get_device_hbm_limit()`, which maps the TPU device kind (v5e, v6e, ...) to
its HBM and raises for anything else ("Expected TPU devices" for the CPU's
device kind). Here the limit is KVPROBE_ENGINE_HBM_BYTES (default 2 GiB),
which with gpu_memory_utilization sets how many KV blocks the engine gets."""

import os

DEFAULT = 2 << 30


def limit() -> int:
    return int(os.environ.get("KVPROBE_ENGINE_HBM_BYTES", DEFAULT))


def install() -> str:
    from tpu_inference import utils
    utils.get_device_hbm_limit = limit
    return f"hbm: get_device_hbm_limit -> {limit()} bytes"
