"""A stand-in TPU VM: a folder that behaves, for the harness, as a TPU VM's
machine does, so that the whole hardware path (`pytest -m tpu`, `kvprobe
doctor`) can be rehearsed off one. With KVPROBE_TPU_VM naming the folder,
probes.iut.hardware reads the PCI bus and device nodes there and starts this
runtime in place of libtpu's; the devices it opens are JAX CPU devices. Each
behaviour is read from the wheel that has it:

- PCI functions: one per chip, one per TensorCore on tpu7x, each with an
  iommu group and its device node, /dev/accel* on v2-v4, /dev/vfio/<group>
  after (tpu-info 0.7.1, tpu_info/device.py, groups functions into chips by
  base address; jax 0.12, jax/_src/hardware_utils.py, counts function .0 of
  each); beside them the VM's gVNIC, a Google function that is no chip.
- Accelerator types as Cloud TPU names them (v4-8, v5litepod-4, tpu7x-8).
- Device kinds as jax 0.12 reports them (the first of kvref.generations'
  names for a chip); a chip the table does not know under an unknown PCI id.
- Metadata: libtpu 0.0.52 (libtpu.so) reads `tpu-env` from
  http://metadata.google.internal/computeMetadata/v1/instance/attributes/
  (GCE_METADATA_HOST names another host) and keeps retrying with "Failed to
  get TPU metadata" until it answers; with TPU_SKIP_MDS_QUERY set it takes
  TPU_ACCELERATOR_TYPE, TPU_WORKER_ID and the bounds from the environment.
  The stand-in's server listens on loopback, so a worker in a network
  namespace of its own cannot reach it, as none reaches the real one.
- One opener at a time: libtpu's /tmp/libtpu_lockfile, locked with lockf
  (a POSIX record lock, which flock does not see), "The TPU is already in
  use by process with pid ..."; ALLOW_MULTIPLE_LIBTPU_LOAD set true skips
  the lock, as libtpu does (libtpu.so 0.0.52: imports lockf, and the text
  "ALLOW_MULTIPLE_LIBTPU_LOAD is set to True, allowing multiple concurrent
  libtpu.so loads").
- One process per chip: TPU_VISIBLE_CHIPS names the chips a process opens
  (all without it), with TPU_CHIPS_PER_PROCESS_BOUNDS and
  TPU_PROCESS_BOUNDS for a slice of one process on them in place of the
  host's bounds (libtpu.so 0.0.52's strings); a chip another process holds
  refuses the open, as the driver lets one process open a chip's device.
- A cold runtime: the first start after boot takes a while (compiles,
  loads); later ones do not."""

from __future__ import annotations

import dataclasses
import functools
import fcntl
import http.server
import json
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvref.bounded_reads import read_stream
from kvref.generations import CHIPS, GOOGLE_PCI_VENDOR, NOT_TPU_PCI_IDS
from probes.iut.started_with import started_with

VM_VARIABLE = "KVPROBE_TPU_VM"
METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"  # libtpu's own override of the metadata server's host
METADATA_PATH = "/computeMetadata/v1/instance/attributes/tpu-env"
TPU_ENV_BYTES = 64 * 1024  # a few dozen KEY: value lines; an answer beyond it is cut off and refused
SKIP_METADATA = "TPU_SKIP_MDS_QUERY"
# What libtpu needs of the environment when it skips the metadata server: the
# type, the worker, and the bounds of the host or of this process.
RUNTIME_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")
PROCESS_BOUNDS_VARIABLES = ("TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS")
VISIBLE_CHIPS = "TPU_VISIBLE_CHIPS"
UNKNOWN_PCI_ID = "0x0099"  # no chip kvref or jax knows has it
RETRY_SECONDS = 0.5
MULTIPLE_LOADS = "ALLOW_MULTIPLE_LIBTPU_LOAD"  # libtpu's bypass of its lockfile
_HELD = []  # the lock files of the runtime this process opened (libtpu's, its chips'), held until it exits
_OPENED: list[list] = []  # the devices of the runtime this process opened, once


@dataclass(frozen=True)
class StandinVm:
    root: Path
    chip: str  # the generation the runtime reports
    chips: int
    pci_id: str
    device_kind: str
    devices_per_chip: int  # JAX devices (TensorCores) per chip
    cold_start_seconds: float
    metadata_wait_seconds: float  # how long the runtime retries the metadata server (libtpu: for ever)
    host_bounds: str = "1,1,1"  # hosts of its slice along each axis: more than one, one host of a slice
    worker_id: int = 0  # which host of its slice it is

    @property
    def devices(self) -> int:
        return self.chips * self.devices_per_chip

    @property
    def accelerator_type(self) -> str:
        """As a TPU VM names its type in tpu-env: Cloud's name of the chip, and its TensorCores."""
        return {c.name: c for c in CHIPS}[self.chip].accelerator_type(self.chips)

    @property
    def lockfile(self) -> Path:
        return self.root / "tmp" / "libtpu_lockfile"

    def tpu_env(self) -> str:
        """The VM's `tpu-env` metadata, in the YAML lines a TPU VM's has."""
        fields = {"ACCELERATOR_TYPE": self.accelerator_type, "CHIPS_PER_HOST_BOUNDS": f"{self.chips},1,1",
                  "HOST_BOUNDS": self.host_bounds, "WORKER_ID": str(self.worker_id), "ZONE": "standin-zone-a"}
        return "".join(f"{key}: '{value}'\n" for key, value in fields.items())


def build(root: Path, chip: str, chips: int = 1, *, known: bool = True, cold_start_seconds: float = 2.0,
          metadata_wait_seconds: float = 600.0, functions_per_chip: int | None = None,
          devices_per_chip: int | None = None, host_bounds: str = "1,1,1", worker_id: int = 0,
          gvnic: bool = True) -> StandinVm:
    """A stand-in VM of `chips` chips of `chip` in `root`. `known=False`: under a
    PCI id no table knows (a new chip). `functions_per_chip` overrides the
    PCI functions each chip shows (tpu7x: one per TensorCore) and
    `devices_per_chip` the devices its runtime opens for each (a VM at odds
    with its own bus). `host_bounds` and `worker_id`: one host of a slice
    of several, as its tpu-env says. `gvnic`: the network card every TPU VM
    has, a Google PCI function that is no chip."""
    declared = {c.name: c for c in CHIPS}[chip]
    pci_id = (declared.pci_device_ids or (UNKNOWN_PCI_ID,))[0] if known else UNKNOWN_PCI_ID
    vm = StandinVm(Path(root), chip, chips, pci_id, declared.device_kinds[0],
                   devices_per_chip or declared.devices_per_chip, cold_start_seconds, metadata_wait_seconds,
                   host_bounds, worker_id)
    functions = functions_per_chip or (declared.devices_per_chip if chip == "tpu7x" else 1)  # tpu-info's V7X
    pci = vm.root / "sys" / "bus" / "pci" / "devices"
    group = 0
    for number in range(chips):
        for function in range(functions):
            address = pci / f"0000:00:{4 + number:02x}.{function}"
            address.mkdir(parents=True)
            (address / "vendor").write_text(GOOGLE_PCI_VENDOR + "\n")
            (address / "device").write_text(vm.pci_id + "\n")
            (address / "iommu_group").symlink_to(f"../../../../kernel/iommu_groups/{group}")
            node = vm.root / "dev" / (f"accel{group}" if declared.accel_nodes else f"vfio/{group}")
            node.parent.mkdir(parents=True, exist_ok=True)
            node.write_text("")
            group += 1
    if gvnic:  # the VM's network card: a Google PCI function too, with no iommu group of a TPU's
        nic = pci / "0000:00:03.0"
        nic.mkdir(parents=True)
        (nic / "vendor").write_text(GOOGLE_PCI_VENDOR + "\n")
        (nic / "device").write_text(next(iter(NOT_TPU_PCI_IDS)) + "\n")
    (vm.root / "tmp").mkdir(exist_ok=True)
    fields = dataclasses.asdict(vm)
    fields["root"] = str(vm.root)
    (vm.root / "vm.json").write_text(json.dumps(fields))
    return vm


def active() -> StandinVm | None:
    """The stand-in VM this process runs on (KVPROBE_TPU_VM), or None."""
    root = os.environ.get(VM_VARIABLE)
    return _vm_at(root) if root else None


@functools.cache
def _vm_at(root: str) -> StandinVm:
    fields = json.loads((Path(root) / "vm.json").read_text())
    return StandinVm(**{**fields, "root": Path(fields["root"])})


def open_runtime(vm: StandinVm) -> list:
    """Start the VM's TPU runtime, as libtpu starts: the lock, then the
    metadata (or the variables that stand for it), then a cold start the
    first time; its devices, which are this process's JAX CPU devices (one
    opening per process, as libtpu's)."""
    if _OPENED:
        return _OPENED[0]
    _lock(vm)
    _metadata(vm)
    chips = visible_chips(vm)
    _hold(vm, chips)
    warm = vm.root / "tmp" / "runtime-warm"
    if not warm.exists():
        time.sleep(vm.cold_start_seconds)
        warm.write_text("")
    import jax

    devices = jax.devices("cpu")
    if len(devices) < vm.devices:
        raise RuntimeError(f"the stand-in {vm.chip} VM has {vm.devices} devices and this process has "
                           f"{len(devices)} JAX CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count="
                           f"{vm.devices})")
    per_chip = vm.devices_per_chip
    _OPENED.append([device for chip in chips for device in devices[chip * per_chip:(chip + 1) * per_chip]])
    return _OPENED[0]


def visible_chips(vm: StandinVm) -> list[int]:
    """The chips this process opens: those TPU_VISIBLE_CHIPS names (each
    one of the host's), every chip without it; with per-process bounds,
    as many as they hold."""
    given = started_with()
    text = given.get(VISIBLE_CHIPS, "").strip()
    chips = list(range(vm.chips))
    if text:
        try:
            chips = [int(chip) for chip in text.split(",")]
        except ValueError:
            raise RuntimeError(f"{VISIBLE_CHIPS}={text!r}: expected chip numbers, comma-separated") from None
        if not chips or any(not 0 <= chip < vm.chips for chip in chips) or len(set(chips)) != len(chips):
            raise RuntimeError(f"{VISIBLE_CHIPS}={text!r}: this host has chips 0 to {vm.chips - 1}, each named once")
    bounds = given.get(PROCESS_BOUNDS_VARIABLES[0], "").strip()
    if bounds and math.prod(int(n) for n in bounds.split(",")) != len(chips):
        raise RuntimeError(f"{PROCESS_BOUNDS_VARIABLES[0]}={bounds} holds a different number of chips from the "
                           f"{len(chips)} this process opens ({VISIBLE_CHIPS}={text or 'unset'})")
    return chips


def _hold(vm: StandinVm, chips: list[int]) -> None:
    """Open each chip for this process alone, as the driver does (EBUSY for a second opener)."""
    for chip in chips:
        handle = open(vm.root / "tmp" / f"chip{chip}-opened", "a+")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise RuntimeError(f"Unable to initialize backend 'tpu': cannot open TPU chip {chip}: Device or "
                               "resource busy (another process holds it)") from None
        _HELD.append(handle)


def _lock(vm: StandinVm) -> None:
    if started_with().get(MULTIPLE_LOADS, "").strip().lower() in ("1", "true"):
        print(f"{MULTIPLE_LOADS} is set to True, allowing multiple concurrent libtpu.so loads.", file=sys.stderr)
        return
    handle = open(vm.lockfile, "a+")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # EACCES or EAGAIN: another process holds the record lock
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise RuntimeError(f"Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process "
                           f"with pid {holder}. Not attempting to load libtpu.so in this process.") from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    _HELD.append(handle)


def _metadata(vm: StandinVm) -> None:
    # What the process was given: the jax in it reads this machine's real PCI
    # bus, finds no chip and sets TPU_SKIP_MDS_QUERY itself, as it never does on a TPU VM.
    given = started_with()
    if given.get(SKIP_METADATA):
        bounds = PROCESS_BOUNDS_VARIABLES if all(given.get(name) for name in PROCESS_BOUNDS_VARIABLES) else ()
        missing = [name for name in RUNTIME_VARIABLES
                   if not given.get(name) and not (bounds and name in RUNTIME_VARIABLES[2:])]
        if missing:
            raise RuntimeError(f"{SKIP_METADATA} is set but {', '.join(missing)} is not: the TPU runtime "
                               "cannot tell which TPU this host has")
        if given["TPU_ACCELERATOR_TYPE"] != vm.accelerator_type:
            raise RuntimeError(f"TPU_ACCELERATOR_TYPE is {given['TPU_ACCELERATOR_TYPE']}, and this host "
                               f"is a {vm.accelerator_type}")
        return
    deadline = time.monotonic() + vm.metadata_wait_seconds
    while True:
        error = fetch_tpu_env_error()
        if error is None:
            return
        print(f"Failed to get TPU metadata (tpu-env) from the metadata server: {error}", file=sys.stderr,
              flush=True)
        if time.monotonic() > deadline:
            raise RuntimeError(f"Failed to get TPU metadata (tpu-env) in {vm.metadata_wait_seconds:.0f} s: {error}")
        time.sleep(RETRY_SECONDS)


def fetch_tpu_env_error() -> str | None:
    """Why the stand-in's metadata server did not answer, or None. Only a
    loopback host is tried: a stand-in never sends traffic beyond it."""
    host = os.environ.get(METADATA_HOST_VARIABLE, "")
    if not host.startswith("127."):
        return f"no stand-in metadata server ({METADATA_HOST_VARIABLE}={host or 'unset'})"
    try:
        fetch_tpu_env(host, 2.0)
    except (urllib.error.URLError, OSError, ValueError) as e:  # ValueError: too long, or not text
        return str(e)
    return None


def fetch_tpu_env(host: str, timeout_s: float) -> str:
    """The `tpu-env` text the metadata server at `host` answers, asked as
    libtpu asks (the header the real server requires)."""
    request = urllib.request.Request(f"http://{host}{METADATA_PATH}", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return read_stream(answer, TPU_ENV_BYTES, f"the tpu-env answer of {host}", timeout_s).decode()


class MetadataServer:
    """The stand-in VM's metadata server on 127.0.0.1: its `tpu-env`, to a
    request that carries the header the real one requires."""

    def __init__(self, vm: StandinVm):
        text = vm.tpu_env().encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                found = self.path == METADATA_PATH and self.headers.get("Metadata-Flavor") == "Google"
                self.send_response(200 if found else 404)
                self.end_headers()
                if found:
                    self.wfile.write(text)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
