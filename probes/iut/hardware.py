"""Which TPU generation this machine has.

The TPU runtime lets one process hold the chips at a time. The parent (pytest,
`kvprobe run`) asks in a short-lived child, so the workers that probe the TPU
can open it afterwards, and runs hardware cases one at a time."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from kvref.oracle import generation_of_device_kind

ASK_JAX = "import jax; print(jax.devices('tpu')[0].device_kind)"
ASK_SECONDS = 300  # a cold TPU runtime can take minutes to come up


@functools.cache
def local_generation() -> str | None:
    """This machine's TPU generation, or None when JAX finds no TPU."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    try:
        done = subprocess.run([sys.executable, "-c", ASK_JAX], capture_output=True, text=True,
                              timeout=ASK_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return None
    return generation_of_device_kind(lines[-1])


def tpu_device():
    """This process's first TPU device (a worker's, never the parent's)."""
    import jax

    return jax.devices("tpu")[0]


def local_tpu_generation() -> str | None:
    """The generation of the TPU this process has opened, or None."""
    try:
        kind = tpu_device().device_kind
    except Exception:  # no TPU backend at all
        return None
    return generation_of_device_kind(kind)
