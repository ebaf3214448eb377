"""The stand-in VM's runtime starts as libtpu 0.0.52 does where the harness
depends on it (probes.iut.standin_vm, standin_metadata): where it reads its
metadata and how long it tries, what it takes from the environment under
TPU_SKIP_MDS_QUERY and what it defaults, and one host of a slice waiting
for the others. Each is a runtime opened in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvref.generations import CHIPS
from probes.iut import hardware, libtpu_reading, standin_metadata, standin_vm
from probes.iut.peer_env import PEER_ENVS
from tests import tpu_vm

# jax 0.12 and libtpu 0.0.52, as a TPU VM's worker has them; else this one's jax and the same libtpu.
PEER_JAX = str(PEER_ENVS["jax"].python() or sys.executable)
# What a shell on a VM has not, nor the runtime variables each case gives its runtime itself.
NOT_GIVEN = (*tpu_vm.NOT_ON_A_VM, *standin_vm.RUNTIME_VARIABLES, standin_vm.WORKER_HOSTNAMES, "GCE_METADATA_HOST")


def open_runtime(vm, **variables) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in NOT_GIVEN}
    env.update({standin_vm.VM_VARIABLE: str(vm.root), "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={vm.devices}", **variables})
    return subprocess.run([sys.executable, "-c", tpu_vm.OPEN_RUNTIME], env=env, capture_output=True, text=True, timeout=300)


def errors_logged(vm) -> str:
    log = vm.root / "tmp" / "runtime-errors.log"
    return log.read_text() if log.exists() else ""


def test_the_runtime_asks_its_own_vms_server_whatever_gce_metadata_host_says(monkeypatch, tmp_path):
    """libtpu reads metadata.google.internal, and GCE_METADATA_HOST does not
    move it: a VM whose server is down does not start because another
    server answers where that variable points, nor does kvprobe read that
    one. It tries each key 30 times, then says what it could not determine."""
    down = standin_vm.build(tmp_path / "down", "v5e", 1, metadata_retry_seconds=0.01, cold_start_seconds=0.0)
    other = standin_vm.build(tmp_path / "other", "v5e", 1)
    with standin_vm.metadata_server(other) as elsewhere:
        failed = open_runtime(down, GCE_METADATA_HOST=elsewhere.host)
        monkeypatch.setenv(standin_vm.VM_VARIABLE, str(down.root))
        monkeypatch.setenv("GCE_METADATA_HOST", elsewhere.host)
        with pytest.raises(hardware.TpuUnavailable, match="tpu-env.*could not be read"):
            hardware.read_tpu_env()
    assert failed.returncode != 0, failed.stdout
    tries = [line for line in failed.stderr.splitlines() if line.startswith("Failed to get TPU metadata (tpu-env)")]
    assert len(tries) == standin_metadata.TRIES, failed.stderr[-2000:]
    assert standin_metadata.could_not_determine("accelerator-type") in failed.stderr, failed.stderr[-2000:]
    with standin_vm.metadata_server(down):
        started = open_runtime(down, GCE_METADATA_HOST="127.0.0.1:9")
    assert started.returncode == 0 and started.stdout.strip() == "[0]", started.stderr[-2000:]
    assert not errors_logged(down)


def test_under_the_skip_flag_it_needs_the_type_and_defaults_the_rest(tmp_path):
    """TPU_SKIP_MDS_QUERY: the type alone, with the one-host host list, starts
    it (worker 0, the host's bounds); without the host list it starts and
    logs libtpu's error about the worker hostname; without the type it does
    not start, saying what to set."""
    vm = standin_vm.build(tmp_path / "vm", "v6e", 1, cold_start_seconds=0.0)
    skip = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": vm.accelerator_type}
    alone = open_runtime(vm, **skip, TPU_WORKER_HOSTNAMES="localhost")
    assert alone.returncode == 0 and alone.stdout.strip() == "[0]", alone.stderr[-2000:]
    assert not errors_logged(vm)
    unnamed = open_runtime(vm, **skip)
    assert unnamed.returncode == 0, unnamed.stderr[-2000:]
    assert "unexpected worker hostname" in errors_logged(vm) and "TPU_WORKER_HOSTNAMES" in errors_logged(vm)
    untyped = open_runtime(vm, TPU_SKIP_MDS_QUERY="1", TPU_WORKER_HOSTNAMES="localhost")
    assert untyped.returncode != 0 and "please set env var `TPU_ACCELERATOR_TYPE`" in untyped.stderr, \
        untyped.stderr[-2000:]


def test_one_host_of_a_slice_waits_for_the_others_and_kvprobe_never_starts_it(monkeypatch, tmp_path):
    """Host 3 of a v5p slice of 2x2x2 hosts: its metadata names the slice's
    type and its eight hosts; its runtime, started as a worker would start
    it, waits for them and fails; kvprobe refuses the host before starting
    one, for a case's worker as for its own question."""
    vm = standin_vm.build(tmp_path / "vm", "v5p", 4, host_bounds="2,2,2", worker_id=3, slice_join_seconds=0.5,
                          cold_start_seconds=0.0)
    answers = vm.metadata()
    assert answers["accelerator-type"] == "v5p-64" and answers["agent-worker-number"] == "3"
    assert len(answers["worker-network-endpoints"].split(",")) == 8
    with standin_vm.metadata_server(vm):
        waited = open_runtime(vm)
        monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
        for name in ("TPU_SKIP_MDS_QUERY", *hardware.MULTI_HOST_VARIABLES):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(hardware, "started_with", lambda: {})
        hardware._runtime_environment.cache_clear()
        try:
            with pytest.raises(hardware.TpuUnavailable, match="host 3 of a slice of 8 hosts"):
                hardware.device_env({})
        finally:
            hardware._runtime_environment.cache_clear()
    assert waited.returncode != 0 and "Waiting for the 7 other hosts of the slice" in waited.stderr
    assert "DEADLINE_EXCEEDED" in waited.stderr, waited.stderr[-2000:]
    # Given the slice's bounds and a one-host list (a worker under the skip flag), it says so and waits alike.
    listless = open_runtime(vm, TPU_SKIP_MDS_QUERY="1", TPU_ACCELERATOR_TYPE="v5p-64", TPU_HOST_BOUNDS="2,2,2",
                            TPU_WORKER_HOSTNAMES="localhost")
    assert listless.returncode != 0 and "DEADLINE_EXCEEDED" in listless.stderr, listless.stderr[-2000:]
    assert "a slice of 8 hosts" in errors_logged(vm)


def libtpu_or_skip(env: dict[str, str]) -> libtpu_reading.LibtpuReading:
    reading, why = libtpu_reading.read(env, PEER_JAX)
    if reading is None:
        pytest.skip(f"the real libtpu's reading cannot be had here: {why}")
    return reading


@pytest.mark.parametrize("chip", [c.name for c in CHIPS])
def test_the_real_libtpu_takes_every_environment_kvprobe_gives_a_worker(monkeypatch, tmp_path, chip):
    """A host of two chips of each generation: the environment kvprobe hands
    a worker that holds the host (tpu-env's fields as libtpu's variables),
    and each of two workers that hold a chip apiece, read by the real libtpu
    as far as it starts without a chip: no error, the type parsed, and the
    bounds, chips and port each was meant to have."""
    vm = standin_vm.build(tmp_path / "vm", chip, 2)
    monkeypatch.setenv(standin_vm.VM_VARIABLE, str(vm.root))
    monkeypatch.delenv("TPU_VISIBLE_CHIPS", raising=False)
    monkeypatch.setattr(hardware, "started_with", lambda: {})
    hardware._runtime_environment.cache_clear()
    try:
        with standin_vm.metadata_server(vm):
            whole = hardware.device_env({})
    finally:
        hardware._runtime_environment.cache_clear()
    read = libtpu_or_skip(whole)
    assert not read.errors and read.knows_the_type, (read.errors, read.flags)
    assert read.flags["deepsea_chips_per_host_bounds"] == vm.chips_per_host_bounds
    assert read.flags.get("deepsea_host_bounds", "1,1,1") == "1,1,1"
    for index in range(2):
        side = libtpu_or_skip(hardware.one_chip_environment(whole, index))
        assert not side.errors and side.knows_the_type, (side.errors, side.flags)
        assert side.flags["deepsea_hal_included_devs"] == str(index)
        assert side.flags["deepsea_chips_per_host_bounds"] == "1,1,1" == side.flags["deepsea_host_bounds"]
        assert side.flags["deepsea_slice_builder_worker_port"] == str(hardware.FIRST_PROCESS_PORT + index)


def test_a_type_or_host_list_libtpu_cannot_take_is_an_error_it_logs(tmp_path):
    """The teeth of the reading: a type libtpu's parser does not know (the
    `v7x-N` the stand-in once invented) and a worker without a host list."""
    unknown = libtpu_or_skip({"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v7x-2",
                              "TPU_WORKER_HOSTNAMES": "localhost"})
    assert not unknown.knows_the_type
    assert "Failed to find host bounds for accelerator type: v7x-2" in unknown.errors
    listless = libtpu_or_skip({"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "tpu7x-2"})
    assert listless.knows_the_type and any("unexpected worker hostname" in e for e in listless.errors)


class Hostile:
    """A metadata server on loopback that answers as `answer(connection)` does, one connection at a time."""

    def __init__(self, answer):
        import socket
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            try:
                connection.recv(4096)
                self.answer(connection)
            except OSError:  # the client cut it off, as it must
                pass
            finally:
                connection.close()

    def root(self, tmp_path):
        (tmp_path / standin_metadata.SERVER_FILE).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / standin_metadata.SERVER_FILE).write_text(f"127.0.0.1:{self.listener.getsockname()[1]}")
        return tmp_path


def _trickle(connection):
    import time

    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nv5e\n":  # bounded: the client cuts it at 1 s
        connection.sendall(bytes([byte]))
        time.sleep(0.2)


def _interim_without_end(connection):
    import time

    for _ in range(5000):  # about 10 s of them, bounded: the client cuts it at 1 s
        connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.002)


def _header_too_long(connection):
    connection.sendall(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")


@pytest.mark.parametrize("answer", [_trickle, _interim_without_end])
def test_a_metadata_answer_is_bounded_in_time_status_line_and_headers_too(tmp_path, answer):
    import time

    server = Hostile(answer)
    began = time.monotonic()
    text, error = standin_metadata.fetch_error("tpu-env", 1.0, server.root(tmp_path))
    server.listener.close()
    assert text is None and "did not come whole within 1 s" in error, error
    assert time.monotonic() - began < 5.0


def test_a_metadata_clients_own_error_is_one_line(tmp_path):
    server = Hostile(_header_too_long)
    text, error = standin_metadata.fetch_error("tpu-env", 5.0, server.root(tmp_path))
    server.listener.close()
    assert text is None and error.startswith("LineTooLong") and "\n" not in error, error


def test_a_tpu_env_value_no_environment_can_carry_is_refused():
    with pytest.raises(ValueError, match="'WORKER_ID' line holds a control character"):
        standin_metadata.parse_tpu_env("ACCELERATOR_TYPE: 'v5e-1'\nWORKER_ID: '0\x00'\n")
