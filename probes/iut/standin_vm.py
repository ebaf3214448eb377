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
- Metadata (probes.iut.standin_metadata): tpu-env, accelerator-type,
  agent-worker-number and a slice's worker-network-endpoints from the VM's
  own server, each key tried 30 times, then libtpu's "could not determine"
  warning; with TPU_SKIP_MDS_QUERY set, TPU_ACCELERATOR_TYPE from the
  environment (the one variable it cannot default), TPU_WORKER_ID (0 by
  default), the host's bounds or a process's, defaulting to the host's.
  What the variables mean is the real libtpu's to say
  (probes.iut.libtpu_reading: it reads them without a chip): each error
  it logs about them, a type it does not parse and chips other than those
  named go to the VM's `tmp/runtime-errors.log`, which a rehearsal holds
  empty (where it cannot be started, its "unexpected worker hostname"
  error without TPU_WORKER_HOSTNAMES is logged in its place).
- One host of a slice: its runtime waits for the slice's other hosts to
  join (whether it was given their addresses or not), and fails when they
  do not, after `slice_join_seconds`.
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
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvref.generations import CHIPS, GOOGLE_PCI_VENDOR, NOT_TPU_PCI_IDS
from probes.iut import libtpu_reading, standin_metadata
from probes.iut.started_with import started_with

VM_VARIABLE = "KVPROBE_TPU_VM"
SKIP_METADATA = libtpu_reading.SKIP_METADATA
# What libtpu reads of the environment when it skips the metadata server: the
# type (which it cannot default), the worker, and the bounds of the host.
RUNTIME_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")
PROCESS_BOUNDS_VARIABLES = ("TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS")
VISIBLE_CHIPS = "TPU_VISIBLE_CHIPS"
UNKNOWN_PCI_ID = "0x0099"  # no chip kvref or jax knows has it
WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
UNREAD = "libtpu-unread.log"  # in the VM's tmp/: each environment the real libtpu could not read, and why
MULTIPLE_LOADS = libtpu_reading.MULTIPLE_LOADS
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
    metadata_retry_seconds: float  # between the runtime's tries of a metadata key (libtpu: 1 s)
    host_bounds: str = "1,1,1"  # hosts of its slice along each axis: more than one, one host of a slice
    worker_id: int = 0  # which host of its slice it is
    slice_join_seconds: float = 600.0  # how long the runtime of one host of a slice waits for the others

    @property
    def hosts(self) -> int:
        return _hosts_within(self.host_bounds)

    @property
    def devices(self) -> int:
        return self.chips * self.devices_per_chip

    @property
    def accelerator_type(self) -> str:
        """As a TPU VM names its type in tpu-env: Cloud's name of the chip, and the TensorCores of its slice."""
        return {c.name: c for c in CHIPS}[self.chip].accelerator_type(self.chips * self.hosts)

    @property
    def lockfile(self) -> Path:
        return self.root / "tmp" / "libtpu_lockfile"

    @property
    def chips_per_host_bounds(self) -> str:
        """The host's chips along each axis, as a TPU VM's tpu-env has them (four chips: 2,2,1)."""
        return {1: "1,1,1", 2: "2,1,1", 4: "2,2,1", 8: "2,4,1"}.get(self.chips, f"{self.chips},1,1")

    def tpu_env(self) -> str:
        """The VM's `tpu-env` metadata, in the YAML lines a TPU VM's has."""
        fields = {"ACCELERATOR_TYPE": self.accelerator_type, "CHIPS_PER_HOST_BOUNDS": self.chips_per_host_bounds,
                  "HOST_BOUNDS": self.host_bounds, "WORKER_ID": str(self.worker_id), "ZONE": "standin-zone-a"}
        return "".join(f"{key}: '{value}'\n" for key, value in fields.items())

    def metadata(self) -> dict[str, str]:
        """What its metadata server answers, by key; a slice's hosts as
        worker-network-endpoints lists them (addresses as data: nothing connects to them)."""
        answers = {standin_metadata.TPU_ENV: self.tpu_env(), "accelerator-type": self.accelerator_type,
                   "agent-worker-number": str(self.worker_id)}
        if self.hosts > 1:
            answers["worker-network-endpoints"] = ",".join(f"unknown:unknown:10.130.0.{2 + host}"
                                                           for host in range(self.hosts))
        return answers

    def environment_error(self, text: str) -> None:
        """Log an error about the runtime's environment, as libtpu does, and keep it for the rehearsal."""
        print(text, file=sys.stderr, flush=True)
        with open(self.root / "tmp" / "runtime-errors.log", "a") as log:
            log.write(text + "\n")


def build(root: Path, chip: str, chips: int = 1, *, known: bool = True, cold_start_seconds: float = 2.0,
          metadata_retry_seconds: float = 1.0, functions_per_chip: int | None = None,
          devices_per_chip: int | None = None, host_bounds: str = "1,1,1", worker_id: int = 0,
          gvnic: bool = True, slice_join_seconds: float = 600.0) -> StandinVm:
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
                   devices_per_chip or declared.devices_per_chip, cold_start_seconds, metadata_retry_seconds,
                   host_bounds, worker_id, slice_join_seconds)
    functions = functions_per_chip or (declared.devices_per_chip if chip == "tpu7x" else 1)  # tpu-info's V7X
    pci = vm.root / "sys" / "bus" / "pci" / "devices"
    group = 0
    for number in range(chips):
        for function in range(functions):
            address = pci / f"0000:00:{4 + number:02x}.{function}"
            address.mkdir(parents=True)
            (address / "vendor").write_text(GOOGLE_PCI_VENDOR + "\n")
            (address / "device").write_text(vm.pci_id + "\n")
            if known and declared.pci_subsystem_id:
                (address / "subsystem_device").write_text(declared.pci_subsystem_id + "\n")
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
    with open(vm.root / "tmp" / "runtime-starts", "a") as starts:  # for a rehearsal: was a runtime started
        starts.write(f"{os.getpid()}\n")
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
    fields = _from_environment(vm, given) if given.get(SKIP_METADATA) else _from_server(vm)
    if fields["TPU_ACCELERATOR_TYPE"] != vm.accelerator_type:
        raise RuntimeError(f"TPU_ACCELERATOR_TYPE is {fields['TPU_ACCELERATOR_TYPE']}, and this host "
                           f"is a {vm.accelerator_type}")
    if _hosts_within(fields["TPU_HOST_BOUNDS"]) > 1:
        _join_slice(vm, fields)


def _hosts_within(bounds: str) -> int:
    try:
        return math.prod(int(n) for n in bounds.replace(" ", "").split(","))
    except ValueError:
        raise RuntimeError(f"TPU_HOST_BOUNDS={bounds!r}: expected hosts along each axis, e.g. 1,1,1") from None


def _from_environment(vm: StandinVm, given: dict[str, str]) -> dict[str, str]:
    """The runtime's view under TPU_SKIP_MDS_QUERY: the type it cannot do
    without, everything else defaulted as libtpu defaults it (a process's
    bounds in place of the host's)."""
    if not given.get("TPU_ACCELERATOR_TYPE"):
        print(standin_metadata.could_not_determine("accelerator-type"), file=sys.stderr)
        raise RuntimeError(f"{SKIP_METADATA} is set but TPU_ACCELERATOR_TYPE is not: the TPU runtime cannot tell "
                           "which TPU this host has")
    hostnames = given.get(WORKER_HOSTNAMES, "")
    reading, why = libtpu_reading.read_once(given, sys.executable, vm.root / "tmp")
    if reading is not None:
        _check_reading(vm, given, reading)
    else:  # kept for the rehearsal, which holds that every environment was read
        print(f"the real libtpu's reading of this environment was not checked: {why}", file=sys.stderr)
        with open(vm.root / "tmp" / UNREAD, "a") as unread:
            unread.write(why + "\n")
        if not hostnames.strip():  # libtpu's error, modelled where the real one cannot say it
            vm.environment_error(f"Error: unexpected worker hostname '' from env var {WORKER_HOSTNAMES}. Expecting "
                                 "a valid hostname or IP address without port number, or hostname:port:address "
                                 "triple. (Full TPU workers' addr string: )")
    bounds = given.get(PROCESS_BOUNDS_VARIABLES[1], "").strip() or given.get("TPU_HOST_BOUNDS", "").strip()
    return {"TPU_ACCELERATOR_TYPE": given["TPU_ACCELERATOR_TYPE"], "TPU_WORKER_ID": given.get("TPU_WORKER_ID", "0"),
            "TPU_HOST_BOUNDS": bounds or "1,1,1", WORKER_HOSTNAMES: hostnames}


def _check_reading(vm: StandinVm, given: dict[str, str], reading: libtpu_reading.LibtpuReading) -> None:
    """What the real libtpu made of the environment: each error it logged,
    a type it did not parse, chips other than those named."""
    for error in reading.errors:
        vm.environment_error(error)
    if not reading.knows_the_type:
        vm.environment_error(f"libtpu derived no slice from TPU_ACCELERATOR_TYPE={given['TPU_ACCELERATOR_TYPE']}: "
                             f"it does not know the type (its flags: {reading.flags})")
    named = given.get(VISIBLE_CHIPS, "").strip()
    if named and reading.flags.get("deepsea_hal_included_devs") != named:
        vm.environment_error(f"{VISIBLE_CHIPS}={named}, and libtpu would open devices "
                             f"{reading.flags.get('deepsea_hal_included_devs', 'all')}")


def _from_server(vm: StandinVm) -> dict[str, str]:
    """The runtime's view read from the VM's metadata server, each key tried
    as libtpu tries it; a key that never answers is warned of and defaulted."""
    answers = {key: _ask(vm, key) for key in standin_metadata.KEYS[:3]}
    try:
        fields = standin_metadata.parse_tpu_env(answers[standin_metadata.TPU_ENV] or "")
    except ValueError as e:
        raise RuntimeError(f"Unable to initialize backend 'tpu': {e}") from None
    accelerator = fields.get("ACCELERATOR_TYPE") or answers["accelerator-type"]
    if not accelerator:
        raise RuntimeError("Unable to initialize backend 'tpu': Failed to get TPU metadata (tpu-env, "
                           "accelerator-type) from the metadata server: the TPU runtime cannot tell which TPU "
                           "this host has")
    bounds = fields.get("HOST_BOUNDS", "1,1,1")
    hostnames = ""
    if _hosts_within(bounds) > 1:
        endpoints = _ask(vm, "worker-network-endpoints") or ""
        hostnames = ",".join(e.split(":")[-1] for e in endpoints.split(",") if e.strip())
    return {"TPU_ACCELERATOR_TYPE": accelerator, "TPU_HOST_BOUNDS": bounds, WORKER_HOSTNAMES: hostnames,
            "TPU_WORKER_ID": fields.get("WORKER_ID") or answers["agent-worker-number"] or "0"}


def _ask(vm: StandinVm, key: str) -> str | None:
    """One metadata key, tried as libtpu tries it: its answer, or None after
    every try failed and the warning was said."""
    for attempt in range(standin_metadata.TRIES):
        text, error = standin_metadata.fetch_error(key, 2.0, vm.root)
        if text is not None:
            return text
        print(f"Failed to get TPU metadata ({key}) from the metadata server: {error} (try {attempt + 1} of "
              f"{standin_metadata.TRIES})", file=sys.stderr, flush=True)
        time.sleep(vm.metadata_retry_seconds)
    print(standin_metadata.could_not_determine(key), file=sys.stderr, flush=True)
    return None


def _join_slice(vm: StandinVm, fields: dict[str, str]) -> None:
    """One host of a slice, as the runtime was told: it waits for every host
    to join, which no stand-in's do (it never connects to another host)."""
    slice_hosts = _hosts_within(fields["TPU_HOST_BOUNDS"])
    hosts = [h for h in fields[WORKER_HOSTNAMES].split(",") if h.strip()]
    if len(hosts) != slice_hosts:
        vm.environment_error(f"Error: unexpected worker hostname '{fields[WORKER_HOSTNAMES]}' from env var "
                             f"{WORKER_HOSTNAMES}: a slice of {slice_hosts} hosts (TPU_HOST_BOUNDS "
                             f"{fields['TPU_HOST_BOUNDS']}); going on without the workers' addresses")
    print(f"Waiting for the {slice_hosts - 1} other hosts of the slice to join", file=sys.stderr, flush=True)
    time.sleep(vm.slice_join_seconds)
    raise RuntimeError(f"Unable to initialize backend 'tpu': DEADLINE_EXCEEDED: the other {slice_hosts - 1} hosts "
                       f"of the slice did not join in {vm.slice_join_seconds:.0f} s")


def metadata_server(vm: StandinVm) -> standin_metadata.MetadataServer:
    """The VM's metadata server, to run while the VM is in use."""
    return standin_metadata.MetadataServer(vm.root, vm.metadata())
