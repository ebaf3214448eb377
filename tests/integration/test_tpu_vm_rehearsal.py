"""`make tpu-test` rehearsed: `pytest -m tpu` and `kvprobe doctor` run, as a
user runs them, on stand-in TPU VMs (probes.iut.standin_vm: the PCI functions
each chip shows, the device kinds jax 0.12 reports, a runtime that starts
only with its metadata or the variables that stand for it, one opener at a
time, a slow first start). The hardware IUT's own code runs end to end; its
devices are the CPU's, so what only a real TPU VM can show is the TPU
itself: its layouts, its DMA and its speed.

A rehearsal passes when every item passes except the library's own
findings: the probes where tpu-sync-jax disagrees with the prediction on
the same kind of arrays in the committed CPU baseline (reports/cpu)."""

from __future__ import annotations

import fcntl

import pandas as pd
import pytest

from probes.iut import standin_vm
from probes.iut.peer_env import PEER_ENVS
from probes.report.results import disagreements
from probes.suite.matrix import makes
from probes.suite.registry import PROBES, Scope
from probes.iut.registry import iut
from probes.run.doctor import HARDWARE_RUN
from tests.peer_python import peer_python_or_skip
from tests.tpu_vm import REHEARSAL_MATRIX, REPO, kvprobe, pytest_tpu, standin

pytestmark = [pytest.mark.peer, pytest.mark.timeout(1800)]
JAX_TPU = "tpu-sync-jax-tpu"


@pytest.fixture(autouse=True)
def jax_peer():
    peer_python_or_skip(PEER_ENVS["jax"])


def library_findings() -> set[tuple[str, str]]:
    """(how the manager is built, probe) where tpu-sync-jax on JAX CPU arrays
    earns a verdict the reference does not predict, in the committed baseline."""
    baseline = pd.read_csv(REPO / "reports" / "cpu" / "baseline.csv", keep_default_na=False)
    wrong = disagreements(baseline[baseline["iut"] == "tpu-sync-jax"])
    return set(zip(wrong["iut_options"], wrong["probe"]))


LIBRARY_CRASHES = ("killed by SIGSEGV", "killed by SIGBUS", "killed by SIGABRT")  # the harness kills by SIGKILL alone


def check_walk(vm, frame: pd.DataFrame) -> None:
    """Every jax item ran on the VM's stand-in device and agreed with the
    prediction, but for the library's own findings."""
    ran = frame[frame["iut"] == JAX_TPU]
    assert len(ran), "no hardware case ran"
    errors = vm.root / "tmp" / "runtime-errors.log"  # what the runtime logged about the environment it was given
    assert not errors.exists(), errors.read_text()[-2000:]
    unread = vm.root / "tmp" / standin_vm.UNREAD  # every worker's environment was read by the real libtpu
    assert not unread.exists() and list((vm.root / "tmp").glob("libtpu-reading-*.json")), \
        unread.read_text()[-2000:] if unread.exists() else "no reading"
    assert (ran["verdict"] != "SKIP").all(), ran[ran["verdict"] == "SKIP"][["case_id"]].to_string()
    assert ran["device_kind"].str.startswith(f"{vm.device_kind} (standing in for a TPU)").all(), \
        set(ran["device_kind"])
    assert (ran["generation"] == vm.chip).all()
    assert (ran["host_generation"] == vm.chip).all(), set(ran["host_generation"])  # read from its tpu-env
    findings = library_findings()
    wrong = disagreements(ran)
    # The library's own: what the CPU run found, and a worker the library's code killed by a signal
    # (tpu-sync-jax segfaults now and then with transfers in flight on a loaded machine).
    harness = [(o, p, v, d[:600]) for o, p, v, d in zip(wrong["iut_options"], wrong["probe"], wrong["verdict"],
                                                        wrong["detail"])
               if (o, p) not in findings and not d.startswith(LIBRARY_CRASHES)]
    assert not harness, harness


def one_kind_each(name: str, chips: int | None = None) -> list[str]:
    """Each probe that applies to the IUT on a host of `chips`, a robustness
    probe by its first kind that does: the path to the hardware is the same
    for every kind."""
    chosen = []
    for probe, p in PROBES.items():
        kinds = [k for k in p.kinds or ("",) if makes(iut(name), probe, k, chips)]
        if kinds and p.scope != Scope.FUZZ:
            chosen.append(f"{probe}/{kinds[0]}" if kinds[0] else probe)
    return chosen


def test_every_probe_on_a_standin_tpu7x_vm(tmp_path):
    """One tpu7x chip (two PCI functions, one per TensorCore), every probe
    that applies (one kind each), one small matrix, the library built its
    default way (the other ways change what the library does, not the path
    to it): green but for the library's findings."""
    with standin(tmp_path / "vm", "tpu7x", 1) as (vm, env):
        done, frame = pytest_tpu(env, tmp_path / "out", "--kvprobe-iut", JAX_TPU, "-k", "defaults",
                                 "--kvprobe-matrix", str(REHEARSAL_MATRIX),
                                 "--kvprobe-probe", ",".join(one_kind_each(JAX_TPU)))
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    check_walk(vm, frame)
    assert set(frame["iut_options"]) == {"defaults"}
    applicable = {name for name, p in PROBES.items() if p.scope != Scope.FUZZ and p.devices <= vm.devices
                  and any(makes(iut(JAX_TPU), name, kind) for kind in p.kinds or ("",))}
    assert set(frame["probe"]) == applicable, set(frame["probe"]) ^ applicable
    assert not any(PROBES[p].two_process for p in frame["probe"])
    # The chip's two TensorCores are two devices, never four: caches split over two at most.
    shards = [s for s in frame["sharding"] if s]
    assert all("=2" in s or "=1" in s for s in shards), shards


def test_pulls_run_between_the_two_chips_of_a_standin_host(tmp_path):
    """A host of two v5e chips: every two-process probe that applies (one
    kind each) runs its producer and its consumer each on a chip of its own
    (the stand-in refuses a second opener of a chip, and with no chip named
    each would open both): green but for the library's findings."""
    two_process = [p for p in one_kind_each(JAX_TPU, chips=2) if PROBES[p.partition("/")[0]].two_process]
    assert two_process
    with standin(tmp_path / "vm", "v5e", 2) as (vm, env):
        done, frame = pytest_tpu(env, tmp_path / "out", "--kvprobe-iut", JAX_TPU, "-k", "defaults",
                                 "--kvprobe-matrix", str(REHEARSAL_MATRIX), "--kvprobe-probe", ",".join(two_process))
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    check_walk(vm, frame)
    assert set(frame["probe"]) == {p.partition("/")[0] for p in two_process}, set(frame["probe"])
    assert "Device or resource busy" not in " ".join(frame["detail"])


# A chip TorchTPU does not target (v3), one of two TensorCores as one device
# (v4), one of a TensorCore each (v5e), and one the table does not know (v2);
# tpu7x, one PCI function per TensorCore, is walked by every probe above.
# Every chip's PCI ids and device kinds are checked without a walk
# (tests/integration/test_hardware_path.py).
@pytest.mark.parametrize("chip, known", [("v3", True), ("v4", True), ("v5e", True), ("v2", False)])
def test_make_tpu_test_walks_each_standin_vm(tmp_path, chip, known):
    """`pytest -m tpu` as `make tpu-test` runs it (both hardware IUTs, as the
    conftest picks them), one probe, one row: the jax items pass; the torch
    items, whose environment no stand-in has, fail naming it, except on v3,
    which TorchTPU does not target: there one item skips saying so. A chip
    the table does not know (v2, under an unknown PCI id) is found by its
    runtime's device kind and compiled for live. `kvprobe doctor` for the jax
    IUT says all is well."""
    with standin(tmp_path / "vm", chip, 1, known=known) as (vm, env):
        done, frame = pytest_tpu(env, tmp_path / "out", "--kvprobe-matrix", str(REHEARSAL_MATRIX),
                                 "--kvprobe-probe", "roundtrip")
        doctor = kvprobe(env, "doctor", "--iut", JAX_TPU)
    out = done.stdout + done.stderr
    assert "usage error" not in out.lower() and "INTERNALERROR" not in out, out[-3000:]
    check_walk(vm, frame)
    torch = frame[frame["iut"] == "tpu-sync-torch-tpu"]
    if chip == "v3":
        assert torch.empty and "tpu-sync-torch-tpu does not run on this v3 TPU" in out, out[-3000:]
        assert done.returncode == 0, out[-3000:]
    else:
        assert len(torch) and (torch["verdict"] == "SKIP").all(), torch[["case_id", "verdict"]]
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        assert failed and all("tpu-sync-torch-tpu" in line for line in failed), failed
        assert all("torch peer environment" in line for line in failed), failed
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    assert f"{HARDWARE_RUN} would run the hardware cases" in doctor.stdout


def test_make_tpu_test_on_one_host_of_a_standin_slice_stops_at_once_saying_why(tmp_path):
    """Host 1 of a v4 slice of two hosts (its tpu-env's HOST_BOUNDS, its
    metadata's worker endpoints): `pytest -m tpu` and the doctor both say
    the host is one of a slice, and neither starts its runtime, which would
    wait for the other host."""
    with standin(tmp_path / "vm", "v4", 4, host_bounds="1,1,2", worker_id=1) as (vm, env):
        done, frame = pytest_tpu(env, tmp_path / "out", "--kvprobe-matrix", str(REHEARSAL_MATRIX),
                                 "--kvprobe-probe", "roundtrip")
        doctor = kvprobe(env, "doctor", "--iut", JAX_TPU)
    why = "this TPU VM is host 1 of a slice of 2 hosts (tpu-env HOST_BOUNDS 1,1,2)"
    assert done.returncode != 0 and why in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    assert frame.empty
    assert doctor.returncode == 1 and f"PROBLEM: {why}" in doctor.stdout, doctor.stdout[-3000:]
    assert f"{JAX_TPU} (tpu-sync-jax ?): cannot start here: {why}" in doctor.stdout, doctor.stdout[-3000:]
    assert not (vm.root / "tmp" / "runtime-starts").exists()


def test_doctor_names_what_is_broken_on_a_standin_vm(tmp_path):
    """The same VM with one behaviour broken at a time: its metadata server
    down, another process holding the TPU, a bus showing more chips than the
    runtime opens. Each is one problem, named."""
    with standin(tmp_path / "down", "v5e", 1, metadata=False) as (vm, env):
        doctor = kvprobe(env, "doctor", "--iut", JAX_TPU)
    assert doctor.returncode == 1 and "tpu-env) could not be read from the metadata server" in doctor.stdout, \
        doctor.stdout[-2000:]

    with standin(tmp_path / "held", "v5e", 1) as (vm, env):
        with open(vm.lockfile, "a+") as held:
            fcntl.lockf(held, fcntl.LOCK_EX)  # as libtpu holds it: a POSIX record lock
            held.write("4242")
            held.flush()
            doctor = kvprobe(env, "doctor", "--iut", JAX_TPU)
            # libtpu's own bypass, set by the user, is honoured where it is (libtpu.so's text).
            bypassed = kvprobe({**env, "ALLOW_MULTIPLE_LIBTPU_LOAD": "true"}, "doctor", "--iut", JAX_TPU)
    assert doctor.returncode == 1 and "The TPU is already in use by process with pid 4242" in doctor.stdout, \
        doctor.stdout[-2000:]
    assert "already in use" not in bypassed.stdout, bypassed.stdout[-2000:]

    with standin(tmp_path / "odd", "tpu7x", 2, devices_per_chip=1) as (vm, env):
        doctor = kvprobe(env, "doctor", "--iut", JAX_TPU)
    assert doctor.returncode == 1, doctor.stdout[-2000:]
    assert "counted as 4 devices (2 chips), and the runtime opened 2" in doctor.stdout, doctor.stdout[-2000:]
