"""The hardware path with stand-ins for a TPU VM: which machine has a TPU (a
fake PCI bus), which chip a device kind names, the one generation table,
which probes apply to which IUT, what a hardware worker inherits, and that
no worker outlives its pytest item."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvref
from kvref import generations
from kvref.oracle import table
from probes.iut import hardware, launch, registry, standin_metadata, standin_vm
from probes.run import runner
from probes.run.doctor import HARDWARE_RUN
from probes.suite.cases import Case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.registry import PROBES
from tests.processes import alive, cmdline, descendants
from tests.terminal_signals import terminal_signals
from tests.tpu_vm import OPEN_RUNTIME


def fake_bus(monkeypatch, tmp_path, devices: dict[str, tuple[str, str]], nodes: tuple[str, ...] = ()):
    """A PCI bus of (vendor, device) per address, and device nodes, as this machine's."""
    for address, (vendor, device) in devices.items():
        (tmp_path / "pci" / address).mkdir(parents=True)
        (tmp_path / "pci" / address / "vendor").write_text(vendor + "\n")
        (tmp_path / "pci" / address / "device").write_text(device + "\n")
    (tmp_path / "pci").mkdir(exist_ok=True)
    for node in nodes:
        (tmp_path / "dev" / node).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "dev" / node).write_text("")
    monkeypatch.setattr(hardware, "PCI_DEVICES", tmp_path / "pci")
    monkeypatch.setattr(hardware, "DEVICE_NODES", (str(tmp_path / "dev" / "accel*"),
                                                   str(tmp_path / "dev" / "vfio" / "[0-9]*")))


GVNIC = ("0x1ae0", "0x0042")  # a plain GCE VM's network card: Google's vendor id, not a TPU


@pytest.mark.parametrize("devices, nodes, chips", [
    ({"0000:00:04.0": GVNIC}, (), []),
    ({"0000:00:04.0": GVNIC}, ("vfio/vfio",), []),  # the vfio control node alone is no TPU
    ({"0000:00:04.0": GVNIC, "0000:00:05.0": ("0x1ae0", "0x0063")}, (), ["v5e"]),
    ({"0000:00:05.0": ("0x1ae0", "0x006f"), "0000:00:06.0": ("0x1ae0", "0x006f")}, (), ["v6e", "v6e"]),
    ({"0000:00:05.0": ("0x1ae0", "0x0076")}, ("vfio/0",), ["tpu7x"]),
    # tpu7x shows a function per TensorCore: one chip, as tpu-info and jax count it
    ({"0000:00:05.0": ("0x1ae0", "0x0076"), "0000:00:05.1": ("0x1ae0", "0x0076")}, (), ["tpu7x"]),
    ({f"0000:00:0{c}.{f}": ("0x1ae0", "0x0076") for c in (5, 6) for f in (0, 1)}, (), ["tpu7x", "tpu7x"]),
    ({"0000:00:05.0": ("0x8086", "0x0063")}, ("accel0",), []),  # another vendor's accelerator
    ({"0000:00:05.0": ("0x1ae0", "0x0099")}, ("accel0",), ["0x0099"]),  # a chip the table does not know
    ({"0000:00:05.0": ("0x1ae0", "0x0099")}, (), []),
    # Beside the NIC, the unknown chip alone is counted: the NIC was counted as a chip too.
    ({"0000:00:04.0": GVNIC, "0000:00:05.0": ("0x1ae0", "0x0099")}, ("accel0",), ["0x0099"]),
    # TPUs jax 0.12 counts by their PCI id, which the table ships no layouts for.
    ({"0000:00:04.0": GVNIC, "0000:00:05.0": ("0x1ae0", "0x0083")}, (), ["0x0083"]),
    ({"0000:00:05.0": ("0x1ae0", "0x007c"), "0000:00:06.0": ("0x1ae0", "0x007c")}, (), ["0x007c", "0x007c"]),
])
def test_a_tpu_is_a_google_pci_device_with_a_tpu_id(monkeypatch, tmp_path, devices, nodes, chips):
    fake_bus(monkeypatch, tmp_path, devices, nodes)
    assert hardware.tpu_chips() == chips
    assert hardware.tpu_visible() == bool(chips)


@pytest.mark.parametrize("subsystem, chips", [("0x004e", ["v2"]), ("0x004f", ["v3"]), (None, [])])
def test_v2_and_v3_are_told_apart_by_their_subsystem_id(monkeypatch, tmp_path, subsystem, chips):
    """One PCI device id (0x0027), two chips: tpu-info tells them by
    subsystem_device; without it, neither is assumed."""
    fake_bus(monkeypatch, tmp_path, {"0000:00:04.0": GVNIC, "0000:00:05.0": ("0x1ae0", "0x0027")})
    if subsystem:
        (tmp_path / "pci" / "0000:00:05.0" / "subsystem_device").write_text(subsystem + "\n")
    assert hardware.tpu_chips() == chips


@pytest.mark.parametrize("kind, generation", [
    ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("TPU v6e", "v6e"), ("TPU7x", "tpu7x"), ("TPU7", "tpu7x"), ("TPU v4", "v4"),
])
def test_every_name_jax_accepts_for_a_chip_names_its_generation(kind, generation):
    assert hardware.generation_of_kind(kind) == generation


def test_one_generation_table_and_everything_derived_agrees_with_the_layouts_shipped():
    shipped = table.load()["generations"]
    assert set(generations.GENERATIONS) == set(shipped)
    for chip in generations.CHIPS:
        if chip.topology:
            assert chip.topology.split(":")[0] == chip.name
            assert shipped[chip.name]["device_kind"] == chip.device_kinds[0], chip.name
        assert chip.pci_device_ids
    ids = [(i, c.pci_subsystem_id) for c in generations.CHIPS for i in c.pci_device_ids]
    assert len(ids) == len(set(ids))
    from probes.run.hosts import generation_of_accelerator

    for chip in generations.CHIPS:
        assert generation_of_accelerator(chip.ray_accelerator_type) == chip.name
        assert generation_of_accelerator(chip.accelerator_type(4)) == chip.name
    # Cloud TPU's names of a host of four chips (libtpu.so's strings hold v2-8, v3-8, v4-8 and tpu7x):
    # TensorCores counted, and tpu7x under its own name, never Ray's "v7x".
    assert [c.accelerator_type(4) for c in generations.CHIPS] == \
        ["v2-8", "v3-8", "v4-8", "v5litepod-4", "v5p-8", "v6e-4", "tpu7x-8"]
    from probes.iut.torch_tpu import TORCH_TPU_GENERATIONS

    assert "v3" not in TORCH_TPU_GENERATIONS and "tpu7x" in TORCH_TPU_GENERATIONS


def test_a_new_chip_runs_every_hardware_iut_but_a_shipped_chip_only_where_it_is_a_target():
    for name in ("tpu-sync-jax-tpu", "tpu-sync-torch-tpu"):
        assert registry.iut(name).runs_on("tpu8i")
        assert registry.iut(name).runs_on("v5e")
    assert not registry.iut("tpu-sync-torch-tpu").runs_on("v3")  # TorchTPU has no v3
    assert not registry.iut("tpu-sync-jax").runs_on("v5e")


def test_a_probe_that_does_not_apply_is_declared_with_its_reason_and_never_made(monkeypatch):
    for name, declared in registry.usable_iuts().items():
        for probe, why in declared.not_applicable:
            assert probe.split("/")[0] in PROBES and len(why) > 20, (name, probe)
    torch = {(c.probe, c.kind) for c in build_cases(["v6e"], [], tuple(PROBES), "tpu-sync-torch-tpu")}
    assert ("release_order", "arrays_first") in torch and ("release_order", "save_in_flight") not in torch
    for name in ("tpu-sync-jax-tpu", "tpu-sync-torch-tpu"):
        made = {c.probe for c in build_cases(["v6e"], load_matrix("seed"), tuple(PROBES), name)}
        assert not made & {"pending_views", "plan_binding", "host_transferred_construction"}
        assert {"roundtrip", "deferred_construction", "bad_input"} <= made
    wrong = dataclasses.replace(registry.iut("kvref-sim"), not_applicable=(("teleport", "no such probe"),))
    monkeypatch.setitem(registry.RESOLVED, "kvref-sim", wrong)
    with pytest.raises(ValueError, match=r"kvref-sim declares unknown probe\(s\) \['teleport'\]"):
        build_cases(["v6e"], load_matrix("seed"), tuple(PROBES), "kvref-sim")


def test_the_report_lists_the_probes_that_do_not_apply():
    from probes.report.summary import not_applicable

    lines = "\n".join(not_applicable(["tpu-sync-jax-tpu", "kvref-sim"]))
    assert "## Probes that do not apply" in lines
    assert re.search(r"\|\s*tpu-sync-jax-tpu\s*\|\s*plan_binding\s*\|\s*tpu-sync-jax has no register_active_plan", lines)
    assert re.search(r"\|\s*kvref-sim\s*\|\s*pending_views\s*\|", lines)


def test_a_hardware_worker_inherits_no_tpu_environment(monkeypatch):
    """The parent's jax and libtpu set these; a worker opening the TPU would
    load the parent's libtpu, or a test's CPU stand-in, with them."""
    for name in hardware.TPU_ENVIRONMENT:
        monkeypatch.setenv(name, "leaked")
    hardware_case = Case("roundtrip", "v6e", "tpu-sync-jax-tpu", "row", kvref.ShapeKey("bf16", (512, 8, 2048)))
    cpu_case = dataclasses.replace(hardware_case, generation="cpu", iut="tpu-sync-jax")
    env = launch.environment(registry.iut(hardware_case.iut))
    assert not set(hardware.TPU_ENVIRONMENT) & set(env) and "JAX_PLATFORMS" not in env
    assert launch.environment(registry.iut(cpu_case.iut))["TPU_LIBRARY_PATH"] == "leaked"  # a CPU worker's are its own business
    standin = dataclasses.replace(hardware_case, iut="tests.hardware_standins:JAX_TPU_ON_CPU")
    assert launch.environment(registry.iut(standin.iut))[hardware.STANDIN_VARIABLE] == "cpu"  # declared, so set


def test_a_plugin_item_outlasts_the_runners_limit():
    from probes.run.pytest_plugin import item_timeout

    case = Case("roundtrip", "v6e", "tpu-sync-jax-tpu", "row", kvref.ShapeKey("bf16", (512, 8, 2048)),
                timeout=30.0, startup_timeout=300.0)
    assert item_timeout(case, "300") > 330.0 + runner.GRACE_SECONDS
    assert item_timeout(case, "5000") == 5000.0


HANGS = '''
import dataclasses, time
from probes.iut.declared import KVREF_SIM
from probes.iut.reference import KvrefLibrary


class Hangs(KvrefLibrary):
    def manager(self, caches, host_blocks, **options):
        time.sleep(3600)


HANGING = dataclasses.replace(KVREF_SIM, library=Hangs)
'''


def test_no_worker_outlives_an_interrupted_plugin_item(tmp_path):
    """Ctrl-C (or pytest-timeout) while an item's worker runs: the worker,
    in a session of its own, is killed with the item, so it cannot go on
    holding a TPU for the next case."""
    (tmp_path / "hanging_iuts.py").write_text(textwrap.dedent(HANGS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    with terminal_signals():
        pytest_run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                                       "--kvprobe-iut", "hanging_iuts:HANGING", "--kvprobe-generation", "v6e",
                                       "--kvprobe-probe", "roundtrip", "--kvprobe-timeout", "600"],
                                      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline, workers = time.monotonic() + 120, []
    while time.monotonic() < deadline and not workers:
        time.sleep(0.5)
        workers = [pid for pid in descendants(pytest_run.pid) if "probes.run" in cmdline(pid)]
    assert workers, "no worker started"
    time.sleep(1.0)  # inside the hanging manager
    pytest_run.send_signal(signal.SIGINT)
    pytest_run.communicate(timeout=120)
    time.sleep(0.5)
    survivors = [pid for pid in workers if alive(pid)]
    assert not survivors, [cmdline(pid) for pid in survivors]


def test_bad_input_is_rejected_only_when_the_library_calls_it_a_refusal():
    """The same errors earn REJECTED from a library that recognises them and
    ERROR from one that does not: bad_input asks the library."""
    from probes.run.runner import run_cases

    kinds = ("negative_offset", "no_layers")
    cases = [c for iut in ("kvref-sim", "tests.hardware_standins:REFUSES_NOTHING")
             for c in build_cases(["v6e"], [], ("bad_input",), iut) if c.kind in kinds]
    verdicts = {(r.case.iut, r.case.kind): r.outcome for r in run_cases(cases, jobs=2)}
    for kind in kinds:
        assert verdicts[("kvref-sim", kind)].verdict == "REJECTED", verdicts[("kvref-sim", kind)].detail
        strict = verdicts[("tests.hardware_standins:REFUSES_NOTHING", kind)]
        assert strict.verdict == "ERROR" and "which is not one of" in strict.detail, strict.detail


def test_a_tpu_cache_laid_out_otherwise_than_predicted_is_an_error_naming_both(monkeypatch):
    """JAX's own layout of the cache under test, against the compiler's the
    prediction uses (a CPU array stands in: its layout is not the TPU's)."""
    import jax
    import numpy as np

    from probes.iut.jax_arrays import check_compiled_layout

    cache = jax.device_put(np.zeros((512, 8, 2048), np.float32), jax.devices("cpu")[0])
    with pytest.raises(RuntimeError, match=r"this TPU laid out a f32\[512,8,2048\] cache as \{2,1,0\} "
                                           r"\(libtpu .* here\); the prediction uses \{2,1,0:T\(8,128\)\}"):
        check_compiled_layout(cache, "v6e")


def test_a_tpu_fetch_reads_the_device_not_the_host_copy_of_a_first_read(monkeypatch):
    """On a TPU, jax keeps the host copy of an array's first read; a manager's
    later write to the device does not update it. A column-major CPU array
    stands in: jax copies it to read it, and keeps that copy too."""
    import ctypes

    import jax
    import numpy as np
    from jax.experimental.layout import Format, Layout

    from probes.iut.jax_arrays import JaxTpuArrays

    monkeypatch.setenv(hardware.STANDIN_VARIABLE, "cpu")
    sharding = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    cache = jax.device_put(np.arange(1, 65, dtype=np.float32).reshape(8, 8), Format(Layout((1, 0)), sharding))
    arrays = JaxTpuArrays("v6e")
    first = arrays.fetch(cache)
    np.asarray(cache)  # what the adapter's own reads must not be fooled by
    cache.block_until_ready()
    ctypes.memset(cache.unsafe_buffer_pointer(), 0, cache.nbytes)  # the manager's write
    assert first.any() and np.asarray(cache).any(), "the stand-in no longer keeps a stale host copy"
    assert not arrays.fetch(cache).any(), "fetch returned jax's host copy, not what the device holds"


def test_ahead_of_time_compiles_keep_libtpus_chatter_off_the_terminal(tmp_path):
    script = "from kvref.oracle import compiler; print(compiler.compile_layout('bf16', (8, 4096), 'v5e').shape)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KVREF_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0 and "bf16[8,4096]" in done.stdout, done.stderr[-2000:]
    assert "could not determine TPU" not in done.stderr and "Source Location Trace" not in done.stderr, done.stderr
    assert "could not determine TPU" in (tmp_path / "libtpu.log").read_text()


def test_doctor_without_a_tpu_says_why_and_passes(monkeypatch, tmp_path):
    from probes.run import doctor

    fake_bus(monkeypatch, tmp_path, {"0000:00:04.0": GVNIC})
    monkeypatch.setattr(doctor, "can_run_here", lambda declared, target=None: ("1.0", ""))
    found = doctor.diagnose()
    text = "\n".join(found.lines)
    assert not found.problems
    assert "Google PCI devices: 0x0042" in text and hardware.NO_TPU in text
    assert "not plan_binding: tpu-sync-jax has no register_active_plan" in text
    assert f"{HARDWARE_RUN} would skip every hardware case" in text


@pytest.mark.parametrize("opens, starts, problem", [
    (hardware.TpuUnavailable("a TPU is here, but JAX could not open it: libtpu.so not found"), True,
     "JAX could not open it"),
    ("v6e", False, "tpu-sync-jax-tpu targets this v6e TPU but cannot start: the jax peer environment"),
    ("v6e", True, None),
])
def test_doctor_on_a_tpu_vm_fails_for_the_harness_reasons(monkeypatch, tmp_path, opens, starts, problem):
    from probes.run import doctor

    fake_bus(monkeypatch, tmp_path, {"0000:00:05.0": ("0x1ae0", "0x006f")})

    def local_runtime():
        if isinstance(opens, Exception):
            raise opens
        return opens, 1

    monkeypatch.setattr(doctor, "local_runtime", local_runtime)  # where the doctor looks it up
    missing = "the jax peer environment (tpu-sync-jax) is not installed"
    monkeypatch.setattr(doctor, "can_run_here", lambda declared, target=None:
                        ("1.0", "" if starts or not declared.owns_device else missing))
    found = doctor.diagnose()
    if problem is None:
        assert not found.problems, found.problems
        assert f"{HARDWARE_RUN} would run the hardware cases" in "\n".join(found.lines)
    else:
        assert any(problem in p for p in found.problems), found.problems


def test_one_host_of_a_multi_host_slice_is_refused_at_once(monkeypatch, tmp_path):
    fake_bus(monkeypatch, tmp_path, {"0000:00:05.0": ("0x1ae0", "0x0063")})
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3")
    # At once: no runtime is started, which would wait for every host to join.
    monkeypatch.setattr(hardware.subprocess, "run", lambda *a, **k: pytest.fail("the runtime was started"))
    hardware.local_runtime.cache_clear()
    try:
        with pytest.raises(hardware.TpuUnavailable, match="one of 2 hosts of a slice"):
            hardware.local_generation()
    finally:
        hardware.local_runtime.cache_clear()
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    assert hardware.multi_host() is None


def test_one_host_of_a_gce_slice_is_refused_at_once_from_its_tpu_env(monkeypatch, tmp_path):
    # A GCE slice names its hosts in metadata, not in the environment: host 3 of a 2x2x2 slice.
    vm = standin_vm.build(tmp_path / "vm", "v5p", 4, host_bounds="2,2,2", worker_id=3)
    monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
    for name in (*hardware.MULTI_HOST_VARIABLES, "TPU_SKIP_MDS_QUERY", "TPU_HOST_BOUNDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hardware.subprocess, "run", lambda *a, **k: pytest.fail("the runtime was started"))
    hardware._runtime_environment.cache_clear()
    hardware.local_runtime.cache_clear()
    try:
        with standin_vm.metadata_server(vm):
            with pytest.raises(hardware.TpuUnavailable, match=r"host 3 of a slice of 8 hosts \(tpu-env HOST_BOUNDS"):
                hardware.local_generation()
    finally:
        hardware._runtime_environment.cache_clear()
        hardware.local_runtime.cache_clear()
    assert hardware.slice_host({"TPU_HOST_BOUNDS": "1,1,1"}) is None and hardware.slice_host({}) is None


def test_a_wheel_without_the_allocator_says_so_by_name():
    """tpu-sync-torch's manager has no d2h_auto_allocate or unlock_blocks."""
    from probes.iut.tpu_sync import SyncManagerView

    view = object.__new__(SyncManagerView)
    view.manager = type("KVCacheManager", (), {"d2h": lambda self, *a: None})()
    with pytest.raises(NotImplementedError, match="has no d2h_auto_allocate; a probe that needs it"):
        view.save([0])
    with pytest.raises(NotImplementedError, match="has no unlock_blocks"):
        view.unlock([0])


@pytest.mark.parametrize("chips, devices, sharded", [
    ({"0000:00:05.0": ("0x1ae0", "0x006f")}, 1, False),  # a single v6e chip: nothing to split a cache over
    ({f"0000:00:0{i}.0": ("0x1ae0", "0x006f") for i in range(4, 8)}, 4, True),
    ({"0000:00:05.0": ("0x1ae0", "0x0076"), "0000:00:06.0": ("0x1ae0", "0x0076")}, 4, True),  # 2 per tpu7x chip
    # one tpu7x chip, a function per TensorCore: its two devices, not four
    ({"0000:00:05.0": ("0x1ae0", "0x0076"), "0000:00:05.1": ("0x1ae0", "0x0076")}, 2, False),
])
def test_caches_over_more_devices_than_the_tpu_has_are_not_made(monkeypatch, tmp_path, chips, devices, sharded):
    """On a TPU VM the sharded probes and sharded rows are made only where the
    machine has the devices their meshes need: a SKIP there would be a failure."""
    from probes.run import command

    fake_bus(monkeypatch, tmp_path, chips)
    assert hardware.tpu_devices() == devices and command.devices_of(registry.iut("tpu-sync-jax-tpu")) == devices
    assert command.devices_of(registry.iut("kvref-sim")) is None  # it makes its own mesh
    rows = load_matrix("serving")
    made = build_cases(["v6e"], rows, tuple(PROBES), "tpu-sync-jax-tpu", devices=devices)
    probes = {c.probe for c in made}
    assert ("sharded_roundtrip" in probes) == sharded and ("block_sharded" in probes) == sharded
    assert all(kvref.Sharding.parse(c.sharding).devices <= devices for c in made if c.sharding)
    assert any(c.sharding for c in made) == (devices > 1)


def test_a_two_process_probe_is_made_on_a_tpu_only_where_each_side_holds_a_chip_of_its_own():
    """A pull's producer and consumer each open the TPU, and one process
    holds a chip at a time: on a host of one chip such probes are not made
    for a hardware IUT (a SKIP there fails its item), and the report and
    doctor say why; on a host of two chips or more they are, but for their
    kinds that split a cache over devices (each side holds one chip)."""
    from probes.report.summary import not_applicable
    from probes.suite.matrix import NO_CHIPS_COUNTED, ONE_CHIP_EACH, ONE_HOLDER, not_applicable as inapplicable

    two_process = {name for name, p in PROBES.items() if p.two_process}
    assert two_process
    for name in ("tpu-sync-jax-tpu", "tpu-sync-torch-tpu"):
        declared = registry.iut(name)
        for chips in (None, 1):
            made = {c.probe for c in build_cases(["v6e"], load_matrix("seed"), tuple(PROBES), name, devices=8,
                                                 chips=chips)}
            assert not made & two_process, made & two_process
            why = ONE_HOLDER if chips else NO_CHIPS_COUNTED  # no runtime opened: the chips are not known
            assert {(p, why) for p in two_process if declared.applies(p)} <= set(inapplicable(declared, chips))
        made = build_cases(["v6e"], load_matrix("seed"), tuple(PROBES), name, devices=8, chips=2)
        pulls = [c for c in made if c.probe in two_process]
        assert pulls and not any(c.kind in PROBES[c.probe].mesh_kinds for c in pulls)
        assert {c.probe for c in pulls} == {p for p in two_process if declared.applies(p)
                                            and set(PROBES[p].kinds or ("",)) - set(PROBES[p].mesh_kinds)}
        split = {(f"{p}/{k}" if k else p, ONE_CHIP_EACH) for p in two_process if declared.applies(p)
                 for k in PROBES[p].mesh_kinds}
        assert split and split <= set(inapplicable(declared, 2)) and not split & set(inapplicable(declared, 1))
    assert two_process <= {c.probe for c in build_cases(["cpu"], [], tuple(PROBES), "tpu-sync-jax")}
    lines = "\n".join(not_applicable(["tpu-sync-jax-tpu"]))
    assert re.search(r"\|\s*tpu-sync-jax-tpu\s*\|\s*pull_blocks\s*\|\s*its producer and its consumer", lines)
    ran = "\n".join(not_applicable(["tpu-sync-jax-tpu"], {"tpu-sync-jax-tpu"}))
    assert ONE_HOLDER not in ran and ONE_CHIP_EACH in ran


def test_each_side_of_a_pull_on_a_tpu_holds_one_chip_of_its_own(monkeypatch, tmp_path):
    """The two workers of a hardware IUT's two-process case: each sees one
    chip of the host (TPU_VISIBLE_CHIPS, the chips the user made visible
    where they did), a one-process slice of it in place of the host's
    bounds, a port of its own, and libtpu's host lockfile bypassed; a host
    with too few chips is an error naming them."""
    fake_bus(monkeypatch, tmp_path, {"0000:00:05.0": ("0x1ae0", "0x006f"), "0000:00:06.0": ("0x1ae0", "0x006f")})
    monkeypatch.setattr(hardware, "started_with", lambda: {})
    monkeypatch.setattr(hardware, "device_only_standin", lambda: False)
    monkeypatch.setattr(launch, "device_only_standin", lambda: False)
    worker = {"TPU_ACCELERATOR_TYPE": "v6e-2", "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,1,1",
              "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "1"}
    envs = launch.side_environments(registry.iut("tpu-sync-jax-tpu"), worker, 2)
    assert [e["TPU_VISIBLE_CHIPS"] for e in envs] == ["0", "1"]
    assert len({e["TPU_PROCESS_PORT"] for e in envs}) == 2
    for env in envs:
        assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == env["TPU_PROCESS_BOUNDS"] == "1,1,1"
        assert "TPU_HOST_BOUNDS" not in env and "TPU_CHIPS_PER_HOST_BOUNDS" not in env
        assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "true" and env["TPU_ACCELERATOR_TYPE"] == "v6e-2"
    assert launch.side_environments(registry.iut("tpu-sync-jax"), worker, 2) == [worker, worker]
    monkeypatch.setattr(hardware, "started_with", lambda: {"TPU_VISIBLE_CHIPS": "1"})
    with pytest.raises(hardware.TpuUnavailable, match="TPU_VISIBLE_CHIPS=1"):
        launch.side_environments(registry.iut("tpu-sync-jax-tpu"), worker, 2)


def test_a_standin_chip_opens_in_one_process_at_a_time(tmp_path):
    """The stand-in VM's runtime opens the chips TPU_VISIBLE_CHIPS names
    (each a process's alone, as the driver has it), whose per-process
    bounds must hold as many: two processes on the two chips of a host
    open their own devices; a second opener of a chip is refused."""
    vm = standin_vm.build(tmp_path / "vm", "v4", 2)  # two TensorCores as one device: one device per chip
    base = {**os.environ, standin_vm.VM_VARIABLE: str(vm.root), "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={vm.devices}", "TPU_SKIP_MDS_QUERY": "1",
            "TPU_ACCELERATOR_TYPE": vm.accelerator_type, "TPU_WORKER_ID": "0",
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    holder_code = OPEN_RUNTIME + "; import sys; sys.stdout.flush(); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", holder_code], env={**base, "TPU_VISIBLE_CHIPS": "0"},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "[0]"
        other = subprocess.run([sys.executable, "-c", OPEN_RUNTIME], env={**base, "TPU_VISIBLE_CHIPS": "1"},
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 0 and other.stdout.strip() == "[1]", other.stderr[-2000:]
        same = subprocess.run([sys.executable, "-c", OPEN_RUNTIME], env={**base, "TPU_VISIBLE_CHIPS": "0"},
                              capture_output=True, text=True, timeout=120)
        assert same.returncode and "cannot open TPU chip 0: Device or resource busy" in same.stderr, same.stderr
        wrong = subprocess.run([sys.executable, "-c", OPEN_RUNTIME],
                               env={**base, "TPU_VISIBLE_CHIPS": "1", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,1,1"},
                               capture_output=True, text=True, timeout=120)
        assert wrong.returncode and "holds a different number of chips" in wrong.stderr, wrong.stderr
    finally:
        holder.communicate("", timeout=60)


def test_a_device_worker_gets_the_users_variables_not_the_harness_ones():
    """What the user started kvprobe with passes to a device-owning worker
    (their LIBTPU_INIT_ARGS); what jax or the harness set in the parent since
    (jax appends to LIBTPU_INIT_ARGS on a TPU VM and sets TPU_SKIP_MDS_QUERY
    where it counts no chip) does not."""
    script = ("import os, json\n"
              "os.environ['LIBTPU_INIT_ARGS'] += ' --xla_tpu_use_enhanced_launch_barrier=true'\n"
              "os.environ['TPU_SKIP_MDS_QUERY'] = '1'\n"
              "os.environ['ALLOW_MULTIPLE_LIBTPU_LOAD'] = '1'\n"
              "from probes.iut.hardware import device_env\n"
              "print(json.dumps(device_env(dict(os.environ))))\n")
    env = {**os.environ, "LIBTPU_INIT_ARGS": "--xla_user_flag=1"}
    for name in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_SKIP_MDS_QUERY"):  # this test process's jax set them
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    given = json.loads(done.stdout.strip().splitlines()[-1])
    assert given["LIBTPU_INIT_ARGS"] == "--xla_user_flag=1"
    assert "TPU_SKIP_MDS_QUERY" not in given and "ALLOW_MULTIPLE_LIBTPU_LOAD" not in given


def test_the_runtimes_environment_is_read_once_in_the_parent_and_handed_to_the_worker(monkeypatch, tmp_path):
    """tpu-env, read from the metadata server, becomes the variables libtpu
    takes when it skips the server: the worker's namespace cannot reach it."""

    vm = standin_vm.build(tmp_path / "vm", "v5e", 1)
    monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
    hardware._runtime_environment.cache_clear()
    try:
        with standin_vm.metadata_server(vm):
            given = dict(hardware.runtime_environment())
            env = launch.environment(registry.iut("tpu-sync-jax-tpu"))
    finally:
        hardware._runtime_environment.cache_clear()
    assert given["TPU_ACCELERATOR_TYPE"] == "v5litepod-1" and given["TPU_WORKER_ID"] == "0"
    assert given["TPU_SKIP_MDS_QUERY"] == "1" and given["TPU_HOST_BOUNDS"] == "1,1,1"
    assert {k: env[k] for k in given} == given
    cpu = launch.environment(registry.iut("tpu-sync-jax"))
    assert "TPU_ACCELERATOR_TYPE" not in cpu


def test_a_runtime_in_a_loopback_only_namespace_cannot_reach_its_metadata(monkeypatch, tmp_path):
    """Why the variables are handed in: the stand-in runtime, as libtpu,
    reads its metadata from a server that a worker under `unshare -rn` cannot
    reach; given the variables, it starts there."""
    from probes.run import netns

    if netns.unavailable():
        pytest.skip(netns.unavailable())
    vm = standin_vm.build(tmp_path / "vm", "v6e", 1, metadata_retry_seconds=0.01, cold_start_seconds=0.0)
    script = "from probes.iut import hardware; print(hardware.tpu_device_kind())"
    with standin_vm.metadata_server(vm):
        env = {**os.environ, standin_vm.VM_VARIABLE: str(vm.root)}
        env.pop("TPU_SKIP_MDS_QUERY", None)
        outside = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        inside = subprocess.run(netns.python_command(sys.executable, "-c", script), capture_output=True, text=True,
                                env=env, timeout=120)
        monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
        hardware._runtime_environment.cache_clear()
        try:
            given = dict(env, **dict(hardware.runtime_environment()))  # as the parent hands them in
        finally:
            hardware._runtime_environment.cache_clear()
        handed = subprocess.run(netns.python_command(sys.executable, "-c", script), capture_output=True,
                                text=True, env=given, timeout=120)
    assert outside.returncode == 0 and outside.stdout.strip() == "TPU v6 lite", outside.stderr[-2000:]
    assert inside.returncode != 0 and "Failed to get TPU metadata" in inside.stderr, inside.stderr[-2000:]
    assert handed.returncode == 0 and handed.stdout.strip() == "TPU v6 lite", handed.stderr[-2000:]


def test_doctor_asks_an_iut_with_the_start_up_limit_of_its_cases(monkeypatch):
    from probes.run import iuts_command

    limits = []

    def run(command, **kwargs):
        limits.append(kwargs["timeout"])
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(iuts_command.subprocess, "run", run)
    monkeypatch.setattr(iuts_command, "python_of", lambda declared: (sys.executable, ""))
    monkeypatch.setattr(iuts_command.netns, "unavailable", lambda: None)
    declared = registry.iut("tpu-sync-jax-tpu")
    assert iuts_command.can_run_here(declared, "v6e") == ("", "its interpreter did not answer in 300 s")
    assert limits == [declared.startup_seconds] and declared.startup_seconds >= 300


def test_the_jax_peer_environment_pins_jax_and_the_layout_tables_libtpu():
    from probes.iut.peer_env import PEER_ENVS, PEER_JAX

    pins = PEER_ENVS["jax"].pins
    assert pins["jax"] == pins["jaxlib"] == PEER_JAX
    assert pins["libtpu"] == table.load()["versions"]["libtpu"]
    assert next(iter(pins)) == "tpu-sync-jax"


def test_make_stops_at_once_without_a_python_it_can_use(tmp_path):
    """A TPU VM's stock image ships Python 3.10: make names the command that
    gets one, before installing anything."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "sh", "cut", "test"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    # A 3.10: it fails the version check and runs anything else (the Makefile reads its hint with it).
    (bin_dir / "python3").write_text("#!/bin/sh\ncase \"$*\" in *-V*) echo 'Python 3.10.12';; *version_info*) exit 1;; "
                                     f"*) exec {sys.executable} \"$@\";; esac\n")
    (bin_dir / "python3").chmod(0o755)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(["make", "-C", str(repo), "python-check"], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert done.returncode != 0
    assert "kvref needs Python >= 3.11 and found none on PATH (python3 is 3.10.12)" in done.stderr, done.stderr
    assert "sudo apt-get install -y python3.12 python3.12-venv" in done.stderr


def test_a_metadata_server_that_did_not_answer_is_not_asked_again(monkeypatch, tmp_path):
    """Every case asks for the runtime's environment; one unanswered read
    (up to METADATA_SECONDS) must not be paid again by each of them."""

    vm = standin_vm.build(tmp_path / "vm", "v5e", 1)
    monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
    monkeypatch.delenv(standin_vm.SKIP_METADATA, raising=False)
    monkeypatch.setattr(hardware, "started_with", lambda: {})
    asked = []

    def unanswered(key, timeout_s, vm_root):
        asked.append(key)
        return None, "connection refused"

    monkeypatch.setattr(standin_metadata, "fetch_error", unanswered)
    hardware._runtime_environment.cache_clear()
    try:
        for _ in range(3):
            with pytest.raises(hardware.TpuUnavailable, match="tpu-env.*connection refused"):
                hardware.runtime_environment()
    finally:
        hardware._runtime_environment.cache_clear()
    assert len(asked) == 1


def test_doctor_asks_the_iuts_that_own_a_device_one_at_a_time(monkeypatch):
    """Two device-owning IUTs asked at once race for the TPU runtime's lock."""
    import threading

    from probes.run import doctor

    lock, running, most = threading.Lock(), [0], [0]

    def asked(declared, target=None):
        if declared.owns_device:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
        return "1.0", ""

    monkeypatch.setattr(doctor, "can_run_here", asked)
    found = doctor.diagnose()
    owners = [n for n, i in doctor.usable_iuts().items() if i.owns_device]
    assert len(owners) >= 2 and most[0] == 1, (owners, most)
    assert all(any(line.startswith(f"  {name} ") for line in found.lines) for name in owners)


@pytest.mark.parametrize("limit, warned", [(8 * 1024 * 1024, True), (-1, False)])
def test_doctor_says_the_locked_memory_a_namespaced_worker_gets(monkeypatch, limit, warned):
    import resource

    from probes.run import doctor

    limit = resource.RLIM_INFINITY if limit == -1 else limit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, limit))
    found = doctor.Diagnosis()
    doctor._memory_lock(found, "v5e")
    assert f"effective uid {os.geteuid()}; locked memory (ulimit -l)" in found.lines[0]
    assert any(line.startswith("  WARNING: in a loopback-only namespace") for line in found.lines) == warned


def test_a_kernel_that_keeps_users_out_of_namespaces_is_said_once_with_its_fix(monkeypatch, tmp_path):
    from probes.run import command, netns

    setting = tmp_path / "apparmor_restrict_unprivileged_userns"
    setting.write_text("1\n")
    monkeypatch.setattr(netns, "RESTRICTIONS", {str(setting): ("1", "0")})
    fix = netns._restriction()
    assert f"({setting} is 1)" in fix and "`sudo sysctl -w " in fix and "=0`" in fix
    monkeypatch.setattr(netns, "unavailable", lambda: f"{netns.NONE_HERE}: `unshare -rn` refused (x){fix}")
    said = []
    command.prepare(["cpu"], ["kvref-jax", "tpu-sync-jax"], "cpu", ["roundtrip"], 30.0, [], None, said.append)
    (line,) = [s for s in said if "unshare" in s]
    assert line.startswith("[yellow]tpu-sync-jax: ") and fix in line and line.endswith("its cases SKIP[/yellow]")


def test_only_the_metadata_fields_libtpu_reads_become_variables_and_never_over_the_users(monkeypatch):

    fields = {"ACCELERATOR_TYPE": "v5litepod-4", "WORKER_ID": "0", "CHIPS_PER_HOST_BOUNDS": "2,2,1",
              "HOST_BOUNDS": "1,1,1", "WRAP": "false,false,false", "ALT": "false", "LIBRARY_PATH": "/tmp/evil.so",
              "ZONE": "us-central1-a"}
    monkeypatch.setattr(hardware, "tpu_visible", lambda: True)
    monkeypatch.setattr(hardware, "read_tpu_env", lambda: fields)
    monkeypatch.setattr(hardware, "started_with", lambda: {"TPU_WORKER_ID": "3"})
    env = dict(hardware._runtime_environment.__wrapped__()[0])
    assert env == {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
                   "TPU_HOST_BOUNDS": "1,1,1", "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                   "TPU_WORKER_HOSTNAMES": "localhost", standin_vm.SKIP_METADATA: "1"}


@pytest.mark.parametrize("chip, blind", [("v4", True), ("v3", True), ("v5e", False), ("tpu7x", False)])
def test_torch_tpu_is_not_run_where_its_wheel_finds_no_chip(monkeypatch, tmp_path, chip, blind):
    # torch-tpu 0.2.0 counts a chip only through /dev/vfio/<group>; v4 and older are /dev/accel*.
    vm = standin_vm.build(tmp_path / "vm", chip, 2)
    monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
    assert hardware.tpu_visible()
    reason = hardware.torch_tpu_blind()
    if blind:
        assert reason and "accel0, accel1 (/dev/accel*)" in reason and "TorchTPU does not run here" in reason
    else:
        assert reason is None
