"""Whether this machine has a TPU, and of which generation.

A TPU is "visible" when the machine has one, whether or not any software can
open it: a PCI function of Google's vendor id with a TPU's device id (as JAX
detects chips; kvref.generations has the ids), or, for a chip the table does
not know yet, a Google PCI device beside an accelerator device node
(/dev/accel*, /dev/vfio/<group>). A Google device alone is not a TPU: a plain
GCE VM's network card (gVNIC) is one. Then every failure to open the TPU (a
missing runtime, a TPU another process holds, JAX falling back to the CPU) is
an error, never "no TPU here".

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

from kvref.generations import (DEVICES_PER_CHIP, GENERATIONS, GOOGLE_PCI_VENDOR, chip_of_device_kind,
                               chip_of_pci_device)
from kvref.oracle import generation_of_device_kind

ASK_JAX = "import jax; print(jax.devices('tpu')[0].device_kind)"
ASK_SECONDS = 300  # a cold TPU runtime can take minutes to come up
NO_TPU = "no TPU here: no Google PCI device with a TPU's device id, and no accelerator device node"
PCI_DEVICES = Path("/sys/bus/pci/devices")
DEVICE_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")


# Tests set this to "cpu": the hardware adapters then run every step of their
# own on JAX CPU devices, so only the device itself goes untested off a TPU.
STANDIN_VARIABLE = "KVPROBE_TPU_STANDIN"


def standin_platform() -> str | None:
    """The JAX platform standing in for the TPU, or None on real hardware."""
    return os.environ.get(STANDIN_VARIABLE) or None


class TpuUnavailable(RuntimeError):
    """A TPU is visible, but its runtime could not be started."""


def google_pci_devices() -> list[str]:
    """The device ids of this machine's Google PCI functions ("0x0063")."""
    found = []
    for vendor in sorted(PCI_DEVICES.glob("*/vendor")):
        try:
            if vendor.read_text().strip().lower() == GOOGLE_PCI_VENDOR:
                found.append((vendor.parent / "device").read_text().strip().lower())
        except OSError:
            continue
    return found


def tpu_chips() -> list[str]:
    """The TPU chips the PCI bus shows, by name (an unknown Google device id as itself)."""
    devices = google_pci_devices()
    known = [chip for chip in map(chip_of_pci_device, devices) if chip]
    if known:
        return known
    if devices and any(glob.glob(pattern) for pattern in DEVICE_NODES):
        return devices  # a chip the table does not know yet, beside its device nodes
    return []


def tpu_visible() -> bool:
    return bool(tpu_chips())


def tpu_devices() -> int | None:
    """How many JAX devices this machine's TPU chips make (one per chip where
    the table does not know the chip), or None without a TPU."""
    chips = tpu_chips()
    return sum(DEVICES_PER_CHIP.get(chip, 1) for chip in chips) if chips else None


# Set on a host of a multi-host slice; JAX then waits for every host to join.
MULTI_HOST_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")


def multi_host() -> str | None:
    """Why this TPU VM is one host of a multi-host slice, or None."""
    for name in MULTI_HOST_VARIABLES:
        hosts = [h for h in os.environ.get(name, "").split(",") if h.strip()]
        if len(hosts) > 1:
            return (f"this TPU VM is one of {len(hosts)} hosts of a slice ({name}), and JAX would wait "
                    "for all of them; kvprobe probes one host: run it on a single-host TPU VM")
    return None


@functools.cache
def local_generation() -> str | None:
    """This machine's TPU generation; None when it has no TPU; TpuUnavailable
    when it has one that JAX cannot open, or that is one host of a multi-host
    slice (refused at once, not a start-up hang)."""
    if not tpu_visible():
        return None
    if reason := multi_host():
        raise TpuUnavailable(reason)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    try:
        done = subprocess.run([sys.executable, "-c", ASK_JAX], capture_output=True, text=True,
                              timeout=ASK_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        raise TpuUnavailable(f"a TPU is here, but JAX did not open it within {ASK_SECONDS} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise TpuUnavailable(f"a TPU is here, but JAX could not open it: {done.stderr.strip()[-1500:]}")
    generation = generation_of_kind(lines[-1])
    if generation is None:
        raise TpuUnavailable(f"a TPU is here ({lines[-1]}), but neither kvref's layout table nor the "
                             "installed libtpu knows that device kind")
    return generation


def generation_of_kind(kind: str) -> str | None:
    """The generation a device kind names: a shipped one under any of its
    names, else a chip the installed libtpu compiles for and reports under
    this same kind ("TPU v2" -> v2, "TPU8i" -> tpu8i), else None."""
    named = chip_of_device_kind(kind)
    shipped = generation_of_device_kind(kind) or (named if named in GENERATIONS else None)
    if shipped:
        return shipped
    from kvref.oracle import compiler

    match = re.fullmatch(r"TPU ?v?(\d+)([a-z]*)", kind.strip(), re.IGNORECASE)
    candidates = [named] if named else []
    if match:
        number, suffix = match.group(1), match.group(2).lower()
        candidates += [f"v{number}{suffix}", f"tpu{number}{suffix}"]
    for chip in candidates:
        if compiler.accepts(chip) is None and compiler.device_kind(chip) == kind.strip():
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
    return generation_of_kind(tpu_device().device_kind)
