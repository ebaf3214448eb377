"""Whether this machine has a TPU, and of which generation.

A TPU is "visible" when the machine has one, whether or not any software can
open it: a Google PCI device or an accel device node. Then every failure to
open it (a missing runtime, a TPU another process holds, JAX falling back to
the CPU) is an error, never "no TPU here".

The TPU runtime lets one process hold the chips at a time. The parent (pytest,
`kvprobe run`) asks in a short-lived child, so the workers that probe the TPU
can open it afterwards, and runs hardware cases one at a time."""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
import sys
from pathlib import Path

from kvref.oracle import generation_of_device_kind

ASK_JAX = "import jax; print(jax.devices('tpu')[0].device_kind)"
ASK_SECONDS = 300  # a cold TPU runtime can take minutes to come up
GOOGLE_PCI_VENDOR = "0x1ae0"
NO_TPU = "no TPU here: no Google PCI device and no /dev/accel* device"


# Tests set this to "cpu": the hardware adapters then run every step of their
# own on JAX CPU devices, so only the device itself goes untested off a TPU.
STANDIN_VARIABLE = "KVPROBE_TPU_STANDIN"


def standin_platform() -> str | None:
    """The JAX platform standing in for the TPU, or None on real hardware."""
    return os.environ.get(STANDIN_VARIABLE) or None


class TpuUnavailable(RuntimeError):
    """A TPU is visible, but its runtime could not be started."""


def tpu_visible() -> bool:
    if glob.glob("/dev/accel*"):
        return True
    for vendor in Path("/sys/bus/pci/devices").glob("*/vendor"):
        try:
            if vendor.read_text().strip() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


@functools.cache
def local_generation() -> str | None:
    """This machine's TPU generation; None when it has no TPU; TpuUnavailable
    when it has one that JAX cannot open."""
    if not tpu_visible():
        return None
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    try:
        done = subprocess.run([sys.executable, "-c", ASK_JAX], capture_output=True, text=True,
                              timeout=ASK_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        raise TpuUnavailable(f"a TPU is here, but JAX did not open it within {ASK_SECONDS} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise TpuUnavailable(f"a TPU is here, but JAX could not open it: {done.stderr.strip()[-1500:]}")
    generation = generation_of_device_kind(lines[-1]) or _unshipped_chip(lines[-1])
    if generation is None:
        raise TpuUnavailable(f"a TPU is here ({lines[-1]}), but neither kvref's layout table nor the "
                             "installed libtpu knows that device kind")
    return generation


def _unshipped_chip(kind: str) -> str | None:
    """A chip the table does not ship, named as libtpu names it ("TPU v2" ->
    v2), if libtpu compiles for it and reports the same device kind."""
    from kvref.oracle import compiler

    match = re.fullmatch(r"TPU v(\d+)", kind.strip())
    chip = f"v{match.group(1)}" if match else None
    if chip and compiler.accepts(chip) is None and compiler.device_kind(chip) == kind.strip():
        return chip
    return None


def tpu_device():
    """This process's first TPU device (a worker's, never the parent's), or
    the stand-in platform's first device."""
    import jax

    return jax.devices(standin_platform() or "tpu")[0]


def local_tpu_generation() -> str | None:
    """The generation of the TPU this process opens; None when the machine has
    none. Where it has one, a failure to open it is raised, not hidden."""
    if not tpu_visible():
        return None
    return generation_of_device_kind(tpu_device().device_kind)
