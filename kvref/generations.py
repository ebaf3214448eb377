"""The TPU generations kvref ships layouts for, the topology each is compiled
for, and how any other TPU type is named.

A TPU type the shipped table does not know is written `chip:topology`
(`v2:2x2`) or as a bare chip (`v2`, compiled for the first of
DEFAULT_TOPOLOGIES the installed libtpu accepts); its layouts come live from
the compiler (kvref.oracle)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TpuChip:
    """One TPU chip under every name the tools around it use."""

    name: str  # kvprobe's name for it
    topology: str | None  # what its shipped layouts are compiled for; None: not shipped
    device_kinds: tuple[str, ...]  # JAX's device_kind first, then the other names JAX accepts
    pci_device_ids: tuple[str, ...]  # under Google's PCI vendor id, as JAX detects chips
    ray_accelerator_type: str  # Ray's accelerator type for a host of it
    torch_tpu_name: str | None = None  # torch.tpu.get_device_name(); None: TorchTPU does not run on it
    devices_per_chip: int = 1  # JAX devices one chip shows (its TensorCores where JAX shows each)
    accel_nodes: bool = False  # its chips are /dev/accel<N> (tpu-info's chip_path), not /dev/vfio/<group>
    # The chip configuration its hosts run, where libtpu's compile-only topology defaults to another
    # (v4: megacore, one device of two TensorCores per chip; libtpu describes v4:2x2x1 as 8 single cores).
    chip_config: str | None = None
    # Cloud TPU's accelerator types name a host by the chip's name and its TensorCores ("v4-8": four
    # v4 chips of two TensorCores; "v5litepod-4": four of one), the name Ray's, but for tpu7x's.
    tensorcores_per_chip: int = 1
    cloud_name: str | None = None  # None: Ray's accelerator type, lower case, without "tpu-"
    # The PCI subsystem device id that tells it from another chip of the same device id
    # (tpu-info 0.7.1's device.py: 0x0027 is v2 under 0x004e, v3 under 0x004f).
    pci_subsystem_id: str | None = None

    def accelerator_type(self, chips: int) -> str:
        """Cloud TPU's accelerator type for a host of `chips` of it (tpu-env's ACCELERATOR_TYPE)."""
        name = self.cloud_name or self.ray_accelerator_type.lower().removeprefix("tpu-")
        return f"{name}-{chips * self.tensorcores_per_chip}"


# Read from jax's hardware_utils.py and pallas tpu_info.py, Ray's accelerator
# types and torch-tpu 0.2.0's hardware module.
CHIPS: tuple[TpuChip, ...] = (
    TpuChip("v2", None, ("TPU v2",), ("0x0027",), "TPU-V2", devices_per_chip=2, accel_nodes=True,
            tensorcores_per_chip=2, pci_subsystem_id="0x004e"),
    TpuChip("v3", "v3:2x2", ("TPU v3",), ("0x0027",), "TPU-V3", devices_per_chip=2, accel_nodes=True,
            tensorcores_per_chip=2, pci_subsystem_id="0x004f"),
    TpuChip("v4", "v4:2x2x1", ("TPU v4",), ("0x005e",), "TPU-V4", "TPU v4", accel_nodes=True,
            chip_config="megacore", tensorcores_per_chip=2),
    TpuChip("v5e", "v5e:1x1", ("TPU v5 lite", "TPU v5e"), ("0x0063",), "TPU-V5LITEPOD", "TPU v5e"),
    TpuChip("v5p", "v5p:2x2x1", ("TPU v5", "TPU v5p"), ("0x0062",), "TPU-V5P", "TPU v5p", tensorcores_per_chip=2),
    TpuChip("v6e", "v6e:1x1", ("TPU v6 lite", "TPU v6e"), ("0x006f",), "TPU-V6E", "TPU v6e"),
    TpuChip("tpu7x", "tpu7x:2x2x1", ("TPU7x", "TPU7"), ("0x0076",), "TPU-V7X", "TPU v7", devices_per_chip=2,
            tensorcores_per_chip=2, cloud_name="tpu7x"),
)
GOOGLE_PCI_VENDOR = "0x1ae0"

# Everything below is derived from CHIPS.
GENERATIONS: tuple[str, ...] = tuple(c.name for c in CHIPS if c.topology)
DEFAULT_GENERATION = GENERATIONS[-1]  # the newest shipped: what a device or command assumes unless told
TOPOLOGIES: dict[str, str] = {c.name: c.topology for c in CHIPS if c.topology}
RAY_ACCELERATOR_TYPES: dict[str, str] = {c.name: c.ray_accelerator_type for c in CHIPS}
TORCH_TPU_NAMES: dict[str, str] = {c.torch_tpu_name: c.name for c in CHIPS if c.torch_tpu_name}
CHIP_NAMES: tuple[str, ...] = tuple(c.name for c in CHIPS)
DEVICES_PER_CHIP: dict[str, int] = {c.name: c.devices_per_chip for c in CHIPS}
CHIP_CONFIGS: dict[str, str] = {c.name: c.chip_config for c in CHIPS if c.chip_config}


def chip_of_device_kind(kind: str) -> str | None:
    """The chip a device kind names (any name JAX accepts for it), or None."""
    kind = kind.strip()
    return next((c.name for c in CHIPS if kind in c.device_kinds), None)


def chip_of_pci_device(device_id: str, subsystem_id: str | None = None) -> str | None:
    """The chip of a Google PCI device id ("0x0063" -> v5e), told by its
    subsystem id from another chip of the same device id ("0x0027": v2 or
    v3); None where the ids name no chip, or two without telling which."""
    named = [c for c in CHIPS if device_id.strip().lower() in c.pci_device_ids]
    if len(named) > 1:
        named = [c for c in named if subsystem_id and c.pci_subsystem_id == subsystem_id.strip().lower()]
    return named[0].name if len(named) == 1 else None


# TPU chips jax 0.12 counts by PCI device id (jax/_src/hardware_utils.py) that
# this table ships no layouts for: found as TPUs of a type not known here.
UNSHIPPED_TPU_PCI_IDS = ("0x0056", "0x0083", "0x007c")  # no public name, TPU8i, TPU8t
# Google PCI functions that are never a TPU, beside which an unknown chip is looked for.
NOT_TPU_PCI_IDS = {"0x0042": "gVNIC, a GCE VM's network card"}

# Tried in this order for a chip named without a topology.
DEFAULT_TOPOLOGIES: tuple[str, ...] = ("1x1", "2x2", "1x1x1", "2x2x1")
TPU_TYPE = re.compile(r"(?P<chip>[a-z][a-z0-9]*)(?::(?P<topology>[1-9][0-9]*(?:x[1-9][0-9]*)+))?")


def check_generation(generation: str) -> str:
    """A shipped generation, or any TPU type written chip or chip:topology;
    whether libtpu knows it is the compiler's to say."""
    if generation in TOPOLOGIES:
        return generation
    if not isinstance(generation, str) or not TPU_TYPE.fullmatch(generation):
        raise ValueError(f"unknown TPU generation {generation!r}; expected one of "
                         f"{', '.join(GENERATIONS)}, or a TPU type the installed libtpu compiles for, "
                         "written chip or chip:topology (v2, v2:2x2)")
    return generation


def chip_of(generation: str) -> str:
    return check_generation(generation).split(":")[0]


def is_shipped(generation: str) -> bool:
    return generation in TOPOLOGIES


def report_name(generation: str) -> str:
    """The folder a TPU type's reports go to: a new chip's name (`v2:2x2` ->
    `v2`); a shipped chip on another topology keeps it (`v4:2x2x2` -> `v4-2x2x2`)."""
    chip = chip_of(generation)
    if generation in TOPOLOGIES or chip not in TOPOLOGIES:
        return generation if generation in TOPOLOGIES else chip
    return generation.replace(":", "-")
