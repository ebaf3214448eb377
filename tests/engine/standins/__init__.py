"""Stand-ins the engine needs on JAX's CPU backend (issue 50), one module
each, each saying why the CPU needs it; every other module is the real one.

`install()` applies them in the engine's processes, before tpu-inference's
modules that read them are imported; `APPLIED` lists what was done, which
the driver writes into its summary."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPLIED: list[str] = []


def install(mla: bool = False) -> list[str]:
    """Apply them; with `mla`, those an MLA model needs too."""
    if APPLIED:
        return APPLIED
    # libtpu: a package on sys.path (vLLM's platform choice imports it).
    sys.path.insert(0, str(HERE))
    APPLIED.append("libtpu (import only)")
    # The engine's child processes (vLLM inspects a model's class in one) get libtpu and the
    # torchvision schemas too: child_site/sitecustomize.py runs at their start.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE / "child_site"), str(HERE),
                                                          os.environ.get("PYTHONPATH", "")) if p)
    APPLIED.append("child processes: libtpu and the torchvision schemas (PYTHONPATH)")
    from tests.engine.standins import attention, compiler_options, hbm, mesh, moe_kernel, torchvision_ops
    # torchvision first: importing tpu_inference imports transformers, which imports torchvision.
    for module in (torchvision_ops, moe_kernel, hbm, mesh, compiler_options, attention):
        APPLIED.append(module.install())
    if mla:
        from tests.engine.standins import host_free, mla_kernel, unquantized_mla
        for module in (mla_kernel, host_free, unquantized_mla):
            APPLIED.append(module.install())
    return APPLIED
