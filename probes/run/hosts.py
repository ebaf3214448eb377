"""Which host a case ran on, and the TPU generation of that host, for the
`host` and `host_generation` columns. Ray names TPU types its own way
(`TPU-V5LITEPOD`); TPU VMs name them by pod type (`v5litepod-8`)."""

from __future__ import annotations

import os
import re
import socket

from kvref.generations import RAY_ACCELERATOR_TYPES  # the label's value, and one unit of accelerator_type:<it>

RAY_ACCELERATOR_LABEL = "ray.io/accelerator-type"
TPU_TYPE_VARIABLE = "TPU_ACCELERATOR_TYPE"  # set on TPU VMs and GKE TPU nodes: "v4-8", "v5litepod-4"


def ray_resource(generation: str) -> str:
    """The Ray resource every host of `generation` has exactly one unit of."""
    if generation not in RAY_ACCELERATOR_TYPES:
        raise ValueError(f"no Ray accelerator type for generation {generation!r}; known: "
                         f"{', '.join(RAY_ACCELERATOR_TYPES)}")
    return f"accelerator_type:{RAY_ACCELERATOR_TYPES[generation]}"


def generation_of_accelerator(name: str) -> str:
    """`TPU-V4`, `v4-8`, `TPU-V5LITEPOD`, `v5litepod-4`, `tpu7x-8` -> the
    generation's kvprobe name; "" for no name; an unknown type as given."""
    if not name:
        return ""
    version = re.sub(r"^tpu-?v?", "v", name.strip().lower()).split("-")[0]  # "v5litepod", "v7x"
    for generation, ray_name in RAY_ACCELERATOR_TYPES.items():
        if version == ray_name.lower().replace("tpu-", ""):
            return generation
    return name


def this_host(labels: dict | None = None) -> tuple[str, str]:
    """(hostname, TPU generation or ""): from a Ray node's labels when given,
    else from the TPU VM's environment, else from its tpu-env metadata."""
    accelerator = (labels or {}).get(RAY_ACCELERATOR_LABEL) or os.environ.get(TPU_TYPE_VARIABLE, "")
    if not accelerator:
        from probes.iut import TpuUnavailable, runtime_environment

        try:
            accelerator = dict(runtime_environment()).get(TPU_TYPE_VARIABLE, "")
        except TpuUnavailable:  # the case that needed it says why
            accelerator = ""
    return socket.gethostname(), generation_of_accelerator(accelerator)
