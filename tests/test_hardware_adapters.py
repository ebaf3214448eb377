"""The real-TPU adapters, as far as a machine without a TPU can take them: each
case reaches its worker and skips with the reason, hardware cases run one at a
time, and the bytes cross into torch tensors unchanged."""

import sys

import numpy as np
import pytest

import kvref
from kvref import ShapeKey, from_torch, to_torch, torch_dtype
from probes.iut.host_data import random_host
from probes.iut.registry import check_target
from probes.run.runner import owns_device, run_case, run_cases
from probes.suite.cases import Case
from tests.test_runner import fake_python

TORCH_CASE = Case("roundtrip", "tpu7x", iut="tpu-sync-torch-tpu", shape=ShapeKey("bf16", (512, 16, 2048)))


def test_torch_cases_skip_without_their_environment(monkeypatch):
    monkeypatch.setenv("KVPROBE_PEER_TORCH_PYTHON", "/nonexistent/python")
    result = run_case(TORCH_CASE)
    assert result.outcome.verdict == "SKIP"
    assert "kvprobe peer-env --lib torch" in result.outcome.detail


def test_torch_worker_names_what_is_missing(monkeypatch):
    """This interpreter has torch but not TorchTPU: the worker starts, and the
    adapter says what it lacks instead of failing."""
    monkeypatch.setenv("KVPROBE_PEER_TORCH_PYTHON", sys.executable)
    result = run_case(TORCH_CASE)
    assert result.outcome.verdict == "SKIP", result.outcome.detail
    assert "torch_tpu" in result.outcome.detail and "TPU VM" in result.outcome.detail


@pytest.mark.peer
def test_jax_hardware_worker_finds_no_tpu():
    from probes.iut.peer_env import PEER_ENVS

    if PEER_ENVS["jax"].python() is None:
        pytest.skip(PEER_ENVS["jax"].missing())
    case = Case("roundtrip", "tpu7x", iut="tpu-sync-jax-tpu", shape=ShapeKey("bf16", (512, 16, 2048)))
    result = run_case(case)
    assert result.outcome.verdict == "SKIP", result.outcome.detail
    assert "no TPU here" in result.outcome.detail


def test_torch_tpu_has_no_v3():
    with pytest.raises(ValueError, match="tpu-sync-torch-tpu runs on v4, .*not 'v3'"):
        check_target("tpu-sync-torch-tpu", "v3")
    check_target("tpu-sync-torch-tpu", "tpu7x")


def test_hardware_cases_run_one_at_a_time(tmp_path):
    log = tmp_path / "log"
    python = fake_python(tmp_path, f"echo start $(date +%s.%N) >> {log}; sleep 0.3; "
                                   f"echo end $(date +%s.%N) >> {log}")
    cases = [Case("roundtrip", "tpu7x", iut="tpu-sync-jax-tpu", shape=ShapeKey("bf16", (512, 16, 2048)),
                  name=str(i), timeout=5) for i in range(3)]
    assert owns_device(cases) and not owns_device([Case("plan_binding", "tpu7x")])
    run_cases(cases, jobs=3, python=python)
    events = [line.split() for line in log.read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end"] * 3  # never two workers at once


@pytest.mark.parametrize("dtype", [n for n, t in kvref.ELEMENT_TYPES.items()
                                   if not t.is_sub_byte and n != "pred"])
def test_bytes_cross_into_torch_unchanged(dtype):
    host = random_host(ShapeKey(dtype, (8, 3, 16)), seed=5)  # every bit pattern, NaN payloads included
    tensor = to_torch(host)
    assert tensor.dtype == torch_dtype(dtype) and tuple(tensor.shape) == host.shape
    back = from_torch(tensor)
    assert back.dtype == host.dtype and back.tobytes() == host.tobytes()
    # torch reads the same values from those bytes as NumPy does
    finite = random_host(ShapeKey(dtype, (8, 3, 16)), seed=6, finite=True)
    assert np.array_equal(to_torch(finite).to(torch_dtype("f64")).numpy(), finite.astype(np.float64))


def test_sub_byte_types_have_no_torch_tensor():
    with pytest.raises(ValueError, match="s4 has no torch dtype .* expected one of .*bf16"):
        to_torch(np.zeros((4, 4), kvref.element_type("s4").numpy))


@pytest.mark.peer
def test_torch_plan_is_the_library_message(tmp_path):
    """The plan the torch adapter registers is tpu-sync's own StartTransferRequest
    (its module ships in the jax wheel too), and survives serialization."""
    import subprocess

    from probes.iut.peer_env import PEER_ENVS

    python = PEER_ENVS["jax"].python()
    if python is None:
        pytest.skip(PEER_ENVS["jax"].missing())
    script = (
        "from tpu_sync.rpc import raiden_service_pb2 as rpc\n"
        "from kvref import Faults\n"
        "from probes.iut.tpu_sync import TpuSyncTorchLibrary, plan_number\n"
        "plan = TpuSyncTorchLibrary(Faults()).plan_request('p0', 1, 2)\n"
        "back = rpc.StartTransferRequest.FromString(plan.SerializeToString())\n"
        "entry = back.shard_push_schedules[0].entries[0]\n"
        "assert type(plan) is rpc.StartTransferRequest and back.is_sender\n"
        "assert back.uuid == plan_number('p0') and back.req_id == 'p0'\n"
        "print(entry.layer_idx, entry.src_block_id, entry.dst_block_id, entry.count)\n")
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1", "2", "1"]
