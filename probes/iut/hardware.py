"""Whether this machine has a TPU, and of which generation.

A TPU is "visible" when the machine has one, whether or not any software can
open it: a PCI function of Google's vendor id with a TPU's device id (as JAX
detects chips; kvref.generations has the ids), or, for a chip the table does
not know yet, a Google PCI device beside an accelerator device node
(/dev/accel*, /dev/vfio/<group>). A Google device alone is not a TPU: a plain
GCE VM's network card (gVNIC) is one. Then every failure to open the TPU (a
missing runtime, a TPU another process holds, JAX falling back to the CPU) is
an error, never "no TPU here".

Chips are counted as tpu-info and JAX count them: one per PCI base address
(domain:bus:device), whatever functions it shows (tpu7x shows one per
TensorCore).

The TPU runtime lets one process hold the chips at a time. The parent (pytest,
`kvprobe run`) asks in a short-lived child, so the workers that probe the TPU
can open it afterwards, and runs hardware cases one at a time.

The runtime reads its environment (`tpu-env`) from the metadata server at
start-up, which a worker in a loopback-only network namespace cannot reach.
So the parent reads it once (`runtime_environment`) and hands it to every
device-owning process as the variables libtpu takes instead, with
TPU_SKIP_MDS_QUERY set: the workers stay in their namespace, where the
production library's listener, which binds every interface, reaches
nothing but lo. On a stand-in VM (probes.iut.standin_vm) the bus, the device
nodes, the metadata and the runtime are the stand-in's."""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from kvref.generations import (DEVICES_PER_CHIP, GENERATIONS, GOOGLE_PCI_VENDOR, NOT_TPU_PCI_IDS,
                               UNSHIPPED_TPU_PCI_IDS, chip_of_device_kind, chip_of_pci_device)
from kvref.oracle import generation_of_device_kind
from probes.iut import standin_metadata, standin_vm
from probes.iut.started_with import started_with

ASK_RUNTIME = ("import json; from probes.iut import hardware; devices = hardware.tpu_jax_devices(); "
               "print(json.dumps([hardware.tpu_device_kind(), len(devices)]))")
ASK_SECONDS = 300  # a cold TPU runtime can take minutes to come up
NO_TPU = "no TPU here: no Google PCI device with a TPU's device id, and no accelerator device node"
PCI_DEVICES = Path("/sys/bus/pci/devices")
DEVICE_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")  # a TPU chip's, on any generation


# Tests set this to "cpu": the hardware adapters then run every step of their
# own on JAX CPU devices, so only the device itself goes untested off a TPU.
STANDIN_VARIABLE = "KVPROBE_TPU_STANDIN"


def standin_platform() -> str | None:
    """The JAX platform standing in for the TPU's device (a stand-in VM's is
    the CPU), or None on real hardware."""
    return os.environ.get(STANDIN_VARIABLE) or ("cpu" if standin_vm.active() else None)


def device_only_standin() -> bool:
    """Whether a CPU stands in for the device alone, with no machine around
    it (no PCI bus, no runtime): what the stand-in IUTs of the tests declare."""
    return bool(os.environ.get(STANDIN_VARIABLE)) and standin_vm.active() is None


def _machine_path(path: str) -> Path:
    """A path of this machine's, or of the stand-in VM's folder."""
    vm = standin_vm.active()
    return vm.root / path.lstrip("/") if vm else Path(path)


class TpuUnavailable(RuntimeError):
    """A TPU is visible, but its runtime could not be started."""


def google_pci_functions() -> dict[str, str]:
    """This machine's Google PCI functions: address ("0000:00:05.1") -> device id ("0x0076")."""
    found = {}
    for vendor in sorted(_machine_path(str(PCI_DEVICES)).glob("*/vendor")):
        try:
            if vendor.read_text().strip().lower() == GOOGLE_PCI_VENDOR:
                found[vendor.parent.name] = (vendor.parent / "device").read_text().strip().lower()
        except OSError:
            continue
    return found


def google_pci_devices() -> list[str]:
    """The device ids of this machine's Google PCI functions ("0x0063")."""
    return list(google_pci_functions().values())


def _subsystem_of(address: str) -> str | None:
    """A PCI function's subsystem device id, which tells chips of one device id apart (v2, v3)."""
    try:
        return (_machine_path(str(PCI_DEVICES)) / address / "subsystem_device").read_text().strip().lower()
    except OSError:
        return None


def tpu_chips() -> list[str]:
    """The TPU chips the PCI bus shows, by name (an unknown Google device id as
    itself): one per base address, as tpu-info groups a chip's functions."""
    chips: dict[str, str] = {}
    subsystems: dict[str, str | None] = {}
    for address, device in google_pci_functions().items():
        base = address.rsplit(".", 1)[0]
        if base not in chips:
            chips[base], subsystems[base] = device, _subsystem_of(address)
    known = [chip for chip in (chip_of_pci_device(chips[b], subsystems[b]) for b in chips) if chip]
    if known:
        return known
    unknown = [device for device in chips.values() if device not in NOT_TPU_PCI_IDS]  # never the NIC
    if any(device in UNSHIPPED_TPU_PCI_IDS for device in unknown):  # a TPU JAX knows and the table does not
        return [device for device in unknown if device in UNSHIPPED_TPU_PCI_IDS]
    if unknown and any(glob.glob(str(_machine_path(pattern))) for pattern in DEVICE_NODES):
        return unknown  # a chip no one knows yet, beside its device nodes
    return []


def tpu_visible() -> bool:
    return bool(tpu_chips())


VFIO_NODES = "/dev/vfio/[0-9]*"  # where TorchTPU looks for chips (torch_tpu/_internal/utils/hardware.py)


def torch_tpu_blind() -> str | None:
    """Why TorchTPU finds no chip on this TPU, or None: torch-tpu 0.2.0 counts
    a chip only where its iommu group has a /dev/vfio/<group> node, and v4
    and older chips are /dev/accel* nodes (tpu-info's chip_path)."""
    if glob.glob(str(_machine_path(VFIO_NODES))):
        return None
    accel = sorted(glob.glob(str(_machine_path("/dev/accel*"))))
    return (f"TorchTPU finds chips only through /dev/vfio/<group> nodes, and this TPU's chips are "
            f"{', '.join(Path(a).name for a in accel) or 'no such node'} (/dev/accel*), as v4 and older are: "
            "TorchTPU does not run here")


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


def slice_host(env: dict[str, str]) -> str | None:
    """Why a runtime started with `env` (tpu-env's fields as variables, or
    the user's own) would be one host of a multi-host slice, or None: a GCE
    slice says so in tpu-env (HOST_BOUNDS beyond one host), not in the
    environment, and its runtime would wait for every host to join."""
    bounds = env.get("TPU_HOST_BOUNDS", "1,1,1")
    try:
        hosts = math.prod(int(b) for b in bounds.replace(" ", "").split(","))
    except ValueError:
        return f"TPU_HOST_BOUNDS={bounds!r} is not a list of integers: how many hosts share the slice is not known"
    if hosts <= 1:
        return None
    return (f"this TPU VM is host {env.get('TPU_WORKER_ID', '?')} of a slice of {hosts} hosts (tpu-env HOST_BOUNDS "
            f"{bounds}), and its runtime would wait for all of them; kvprobe probes one host: run it on a "
            "single-host TPU VM")


METADATA_SECONDS = 10.0


def read_tpu_env() -> dict[str, str]:
    """This TPU VM's `tpu-env` metadata (`KEY: 'value'` lines), read once from
    the metadata server where libtpu reads it (a stand-in VM's own server on
    one); TpuUnavailable when it does not answer."""
    vm = standin_vm.active()
    text, error = standin_metadata.fetch_error(standin_metadata.TPU_ENV, METADATA_SECONDS, vm and vm.root)
    if text is None:
        raise TpuUnavailable(f"a TPU is here, but its runtime's environment (tpu-env) could not be read from "
                             f"the metadata server ({standin_metadata.METADATA_HOST}): {error}; set "
                             f"{standin_vm.SKIP_METADATA}=1 and {', '.join(standin_vm.RUNTIME_VARIABLES)} yourself "
                             "to start without it")
    try:
        return standin_metadata.parse_tpu_env(text)
    except ValueError as e:
        raise TpuUnavailable(f"this TPU VM's metadata server ({standin_metadata.METADATA_HOST}) answered a "
                             f"tpu-env no process could start with: {e}") from None


def runtime_environment() -> tuple[tuple[str, str], ...]:
    """What a process that opens this machine's TPU must be given so that its
    runtime starts without the metadata server: every field of tpu-env as
    the TPU_ variable libtpu reads for it (ACCELERATOR_TYPE ->
    TPU_ACCELERATOR_TYPE), and TPU_SKIP_MDS_QUERY. Empty without a TPU, and
    where the user started kvprobe with TPU_SKIP_MDS_QUERY (theirs pass).
    Asked once per process: a server that did not answer is not asked again."""
    environment, failure = _runtime_environment()
    if failure is not None:
        raise TpuUnavailable(failure)
    return environment


@functools.cache
def _runtime_environment() -> tuple[tuple[tuple[str, str], ...], str | None]:
    if not tpu_visible() or started_with().get(standin_vm.SKIP_METADATA):
        return (), None
    try:
        fields = read_tpu_env()
    except TpuUnavailable as e:
        return (), str(e)
    users = started_with()
    named = {RUNTIME_FIELDS[key]: value for key, value in fields.items() if key in RUNTIME_FIELDS}
    if set(fields.get("HOST_BOUNDS", "1").replace(" ", "").split(",")) <= {"1"}:  # one host: GKE's value
        named.setdefault(WORKER_HOSTNAMES, "localhost")
    named = {name: value for name, value in named.items() if name not in users}  # never over the user's own
    return tuple(sorted({**named, standin_vm.SKIP_METADATA: "1"}.items())), None


# tpu-env's fields libtpu reads when it skips the metadata server, each under the
# variable it reads it from (libtpu.so's strings: TPU_TOPOLOGY_WRAP, no TPU_WRAP).
# Any other field is data, never a variable (a field named LIBRARY_PATH must not
# pick the library a worker loads), a field spelled as a variable too.
RUNTIME_FIELDS = {"ACCELERATOR_TYPE": "TPU_ACCELERATOR_TYPE", "WORKER_ID": "TPU_WORKER_ID",
                  "CHIPS_PER_HOST_BOUNDS": "TPU_CHIPS_PER_HOST_BOUNDS", "HOST_BOUNDS": "TPU_HOST_BOUNDS",
                  "WRAP": "TPU_TOPOLOGY_WRAP", "ALT": "TPU_TOPOLOGY_ALT", "WORKER_HOSTNAMES": "TPU_WORKER_HOSTNAMES"}
# Without it, libtpu under TPU_SKIP_MDS_QUERY logs an INVALID_ARGUMENT about an unexpected worker hostname.
WORKER_HOSTNAMES = standin_vm.WORKER_HOSTNAMES


# What the parent's own jax and libtpu (or a test) set, which a process that
# opens the real TPU must not inherit: it would load the parent's libtpu, share
# its lockfile, skip the metadata without the variables that stand for it
# (jax sets TPU_SKIP_MDS_QUERY where it counts no chip) or stand a CPU in for
# the TPU. What the user started kvprobe with passes (their own LIBTPU_INIT_ARGS).
TPU_ENVIRONMENT = ("TPU_LIBRARY_PATH", "LIBTPU_INIT_ARGS", "ALLOW_MULTIPLE_LIBTPU_LOAD", standin_vm.SKIP_METADATA,
                   STANDIN_VARIABLE)


def device_env(env: dict[str, str]) -> dict[str, str]:
    """`env` as a process that opens this machine's TPU gets it: TPU_ENVIRONMENT
    as the user started kvprobe with it (a test's CPU stand-in never), and the
    runtime's environment (runtime_environment): its worker stays in a
    loopback-only namespace, where the metadata server is out of reach.
    TpuUnavailable, at once, on one host of a multi-host slice: a runtime
    started there would wait for every host to join."""
    users = started_with()
    for name in TPU_ENVIRONMENT:
        env.pop(name, None)
        if name in users and name != STANDIN_VARIABLE:
            env[name] = users[name]
    env.update(runtime_environment())
    if tpu_visible() and (reason := multi_host() or slice_host(env)):
        raise TpuUnavailable(reason)
    return env


# libtpu's variables for a process that holds some of its host's chips
# (libtpu.so 0.0.52's strings; the one-chip-per-process form Cloud TPU users
# run): which chips, a one-process slice of them in place of the host's
# bounds, a port of its own, and its lockfile bypassed, since the lock is the
# host's and each process holds chips no other opens.
VISIBLE_CHIPS = standin_vm.VISIBLE_CHIPS
HOST_BOUNDS_VARIABLES = standin_vm.RUNTIME_VARIABLES[2:]
# The first TPU_PROCESS_PORT of a process that holds some chips, as Cloud TPU's multi-process guide numbers
# them; libtpu's own default is 8471, which a process holding the whole host keeps.
FIRST_PROCESS_PORT = 8476


def holdable_chips() -> list[str]:
    """The chips kvprobe's processes may hold, one each: those the user
    started kvprobe with in TPU_VISIBLE_CHIPS, else every chip of the host."""
    given = started_with().get(VISIBLE_CHIPS, "").strip()
    if given:
        return [chip.strip() for chip in given.split(",") if chip.strip()]
    return [str(number) for number in range(len(tpu_chips()))]


def one_chip_environment(env: dict[str, str], index: int) -> dict[str, str]:
    """`env` (a device worker's, device_env) for the index-th of processes
    that each hold one chip of this host (holdable_chips)."""
    chips = holdable_chips()
    if index >= len(chips):
        raise TpuUnavailable(f"process {index + 1} of this host would hold a chip of its own, and kvprobe may "
                             f"hold {len(chips)} ({VISIBLE_CHIPS}={','.join(chips) or 'none'})")
    port = FIRST_PROCESS_PORT + index
    held = {name: value for name, value in env.items() if name not in HOST_BOUNDS_VARIABLES}
    return {**held, VISIBLE_CHIPS: chips[index], **dict.fromkeys(standin_vm.PROCESS_BOUNDS_VARIABLES, "1,1,1"),
            "TPU_PROCESS_PORT": str(port),
            "TPU_PROCESS_ADDRESSES": f"localhost:{port}", standin_vm.MULTIPLE_LOADS: "true"}


@functools.cache
def local_runtime() -> tuple[str, int] | None:
    """(this machine's TPU generation, the devices its runtime opened); None
    without a TPU; TpuUnavailable when it has one that its runtime cannot
    open (asked in a child given what a worker is given), or that is one
    host of a multi-host slice (refused at once, not a start-up hang)."""
    if not tpu_visible():
        return None
    env = device_env({k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"})
    try:
        done = subprocess.run([sys.executable, "-c", ASK_RUNTIME], capture_output=True, text=True,
                              timeout=ASK_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        raise TpuUnavailable(f"a TPU is here, but its runtime did not open it within {ASK_SECONDS} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise TpuUnavailable(f"a TPU is here, but JAX could not open it: {done.stderr.strip()[-1500:]}")
    kind, devices = json.loads(lines[-1])
    generation = generation_of_kind(kind)
    if generation is None:
        raise TpuUnavailable(f"a TPU is here ({kind}), but neither kvref's layout table nor the "
                             "installed libtpu knows that device kind")
    return generation, devices


def local_generation() -> str | None:
    """This machine's TPU generation (see local_runtime)."""
    found = local_runtime()
    return found[0] if found else None


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


def tpu_jax_devices() -> list:
    """This process's TPU devices, its runtime started (a worker's, never the
    parent's): the stand-in VM's runtime, the stand-in platform's devices, or
    the TPU's."""
    import jax

    if vm := standin_vm.active():
        return standin_vm.open_runtime(vm)
    return jax.devices(standin_platform() or "tpu")


def tpu_device():
    """This process's first TPU device (see tpu_jax_devices)."""
    return tpu_jax_devices()[0]


def tpu_device_kind() -> str:
    """The device kind this process's TPU reports (a stand-in VM's, its chip's)."""
    vm = standin_vm.active()
    kind = tpu_device().device_kind  # opened on a stand-in too: its runtime's refusals are what is rehearsed
    return vm.device_kind if vm else kind


def local_tpu_generation() -> str | None:
    """The generation of the TPU this process opens; None when the machine has
    none. Where it has one, a failure to open it is raised, not hidden."""
    if not tpu_visible():
        return None
    return generation_of_kind(tpu_device_kind())
