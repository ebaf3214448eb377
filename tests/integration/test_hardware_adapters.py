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
from probes.suite.matrix import build_cases
from tests.probes.test_runner import fake_python

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
    (its module ships in the jax wheel too), and survives serialization.
    tpu_sync is imported in a loopback-only network namespace (probes.run.netns)."""
    import subprocess

    from probes.iut.peer_env import PEER_ENVS
    from probes.run import netns

    python = PEER_ENVS["jax"].python()
    if python is None:
        pytest.skip(PEER_ENVS["jax"].missing())
    if netns.unavailable():
        pytest.skip(netns.unavailable())
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
    done = subprocess.run(netns.python_command(str(python), "-c", script), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1", "2", "1"]


def test_a_tpu_run_with_nothing_run_fails():
    from tests.hardware_gate import no_hardware_case_ran

    assert no_hardware_case_ran(True, ["skipped"] * 3).startswith("a TPU is here, but none of the 3")
    assert no_hardware_case_ran(True, ["skipped", "passed"]) is None
    assert no_hardware_case_ran(False, ["skipped"] * 3) is None  # no TPU: skipping is right
    assert no_hardware_case_ran(True, []) is None  # no hardware test selected


def test_a_visible_tpu_that_does_not_start_is_an_error(monkeypatch):
    """Where the machine has a TPU, JAX failing to open it (busy, no runtime,
    fallen back to CPU) is raised, never "no TPU here"."""
    from probes.iut import hardware

    monkeypatch.setattr(hardware, "tpu_visible", lambda: True)
    monkeypatch.setattr(hardware, "ASK_RUNTIME", "raise SystemExit('TPU initialization failed: busy')")
    monkeypatch.setattr(hardware, "runtime_environment", lambda: ())
    hardware.local_runtime.cache_clear()
    try:
        with pytest.raises(hardware.TpuUnavailable, match="a TPU is here, but JAX could not open it: "
                           "TPU initialization failed: busy"):
            hardware.local_generation()
    finally:
        hardware.local_runtime.cache_clear()


def test_no_tpu_on_this_machine_is_one_clear_reason():
    from probes.iut import hardware

    assert not hardware.tpu_visible()
    assert hardware.local_generation() is None and hardware.local_tpu_generation() is None


def test_tpu_workers_do_not_inherit_the_parents_jax_platforms(monkeypatch):
    from probes.iut import environment, iut

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    hardware = Case("roundtrip", "tpu7x", iut="tpu-sync-jax-tpu", shape=ShapeKey("bf16", (512, 16, 2048)))
    assert "JAX_PLATFORMS" not in environment(iut(hardware.iut))
    assert environment(iut("kvref-jax"))["JAX_PLATFORMS"] == "cpu"


@pytest.mark.peer
@pytest.mark.timeout(1200)  # each probe twice, in watched workers
def test_jax_hardware_adapter_runs_here_with_a_cpu_standing_in(monkeypatch):
    """Every step of tpu-sync-jax-tpu's own code (deferred creation, scramble,
    serving step, the manager view, host reads) runs on JAX CPU devices in
    place of the TPU, and earns the verdicts tpu-sync-jax earns on the same
    arrays through the CPU adapter; only the device itself is left untested."""
    from probes.iut.peer_env import PEER_ENVS
    from probes.suite.matrix import MatrixRow
    from probes.suite.registry import DEFAULT_PROBES, PROBES

    from probes.iut.hardware import STANDIN_VARIABLE

    if PEER_ENVS["jax"].python() is None:
        pytest.skip(PEER_ENVS["jax"].missing())
    monkeypatch.setenv(STANDIN_VARIABLE, "cpu")  # the parent predicts from the stand-in's layouts
    standin_iut = "tests.hardware_standins:JAX_TPU_ON_CPU"  # its workers inherit no TPU variable
    row = [MatrixRow("addressable", ShapeKey("bf16", (512, 8, 2048)),
                     ("roundtrip", "deferred_construction", "host_transferred_construction"))]
    # Each part of the adapter: the main job's probes (creation, scramble, steps, donation, meshes),
    # saves and unlocks, and copies held in flight. Not repeated_construction: on a library that does not
    # report its pool, it judges the process's memory growth, which other processes' load moves.
    probes = tuple(p for p in (*DEFAULT_PROBES, "host_chunks", "unawaited_transfers") if p != "repeated_construction")
    # A two-process probe is SKIP on a device one process holds at a time (probes.run.runner).
    kept = lambda c: not c.iut_options and not PROBES[c.probe].two_process
    # Limits a loaded machine cannot reach: agreement must not depend on load.
    standin = [c for c in build_cases(["tpu7x"], row, probes, standin_iut, timeout=240) if kept(c)]
    cpu = {c.case_id.split("/", 1)[1]: c for c in build_cases(["cpu"], row, probes, "tpu-sync-jax", timeout=240)
           if kept(c)}
    ran = run_cases(standin + list(cpu.values()), jobs=2)
    by_iut = {(r.case.iut, r.case.case_id.split("/", 1)[1]): r.outcome for r in ran}
    for case in standin:
        key = case.case_id.split("/", 1)[1]
        outcome, reference = by_iut[(standin_iut, key)], by_iut[("tpu-sync-jax", key)]
        # The stand-in's own code ran, on the stand-in: a worker names its device before the probe
        # runs, so a case the library crashes or hangs in (a deferred cache) says so too.
        assert "standing in for a TPU" in outcome.device_kind, (key, outcome.verdict, outcome.detail[:500])
        assert outcome.verdict != "SKIP", outcome.detail  # only probes that apply were made
        # Agreeing with the prediction exactly where the CPU adapter does: which failure the library
        # earns on a deferred cache (SIGSEGV or corrupt rows) depends on timing, whether it fails does not.
        from probes.suite.predict import prediction

        assert prediction(case).admits(outcome.verdict) == prediction(cpu[key]).admits(reference.verdict), \
            (key, outcome.verdict, outcome.detail[:500], reference.verdict, reference.detail[:500])


@pytest.mark.parametrize("wheel, error, refusal", [
    ("jax", RuntimeError("absl::StatusOr not ok: INVALID_ARGUMENT: Copy range exceeds source device buffer "
                         "size; DispatchD2hChunks: Scheduled dispatch failed: "), True),
    ("jax", RuntimeError("absl::StatusOr not ok: OUT_OF_RANGE: Copy range exceeds destination host buffer size"),
     True),
    ("jax", RuntimeError("INVALID_ARGUMENT: Requested blocks (10) exceed total blocks (8)"), True),
    ("jax", RuntimeError("RESOURCE_EXHAUSTED: Insufficient available blocks. Requested: 1, Free: 0, "
                         "Evictable: 0"), True),
    ("jax", RuntimeError("absl::Status not ok: INVALID_ARGUMENT: Cannot unlock unallocated block ID: 7"), True),
    ("jax", RuntimeError("Layer 1 has major dimension 8 but layer 0 has 16; every layer must hold ..."), True),
    ("jax", RuntimeError("absl::StatusOr not ok: INTERNAL: DMA engine fault"), False),
    ("jax", RuntimeError("RESOURCE_EXHAUSTED: No free staging slots available"), False),  # the runtime's
    ("jax", RuntimeError("DmaMap failed in LocalCreateHostMemoryAllocator: INVALID_ARGUMENT: x"), False),
    ("jax", RuntimeError("a message with no status code"), False),
    ("jax", ValueError("vector::reserve"), False),  # an accident of the binding, not a check
    ("jax", ValueError("cannot create std::vector larger than max_size()"), False),
    ("jax", ValueError("jax.Array was deleted"), False),
    ("jax", AttributeError("'list' object has no attribute 'addressable_shards'"), False),
    # a call that reached no check: the binding's type error, not a refusal
    ("jax", TypeError("d2h(): incompatible function arguments. The following argument types are supported"), False),
    ("torch", TypeError("d2h(): incompatible function arguments. The following argument types are supported"), False),
    # both constructors' uncoded refusals of a cache they cannot split into blocks
    ("jax", RuntimeError("Layer 0 on-device size 6291456 is not a whole number of blocks at major dimension 5"), True),
    ("torch", RuntimeError("Layer 0 on-device size 6291456 is not a whole number of blocks at major dimension 5"),
     True),
    ("torch", RuntimeError("Layer 1 has major dimension 8 but layer 0 has 16; every layer must hold ..."), True),
    ("torch", RuntimeError("KVCacheManager init failed: Layer 1 has major dimension 8 but layer 0 has 16"), True),
    # runtime errors: a donated buffer, the DMA engine
    ("jax", RuntimeError("INVALID_ARGUMENT: Array has been deleted with shape=bf16[512,8,2048]."), False),
    ("jax", RuntimeError("Array has been deleted with shape=bf16[512,8,2048]."), False),
    ("torch", RuntimeError("KVCacheManager D2h failed: buffer was donated"), False),
    ("jax", ValueError("Must specify either (max_blocks, num_slots) or host_blocks_to_allocate."), True),
    ("torch", RuntimeError("KVCacheManager register_active_plan failed: invalid StartTransferRequest bytes"), True),
    ("torch", RuntimeError("KVCacheManager D2h failed: Copy range exceeds source device buffer size"), True),
    ("torch", RuntimeError("KVCacheManager H2d failed: copy offsets and sizes must be non-negative"), True),
    ("torch", RuntimeError("KVCacheManager D2h failed: DMA engine fault"), False),
    ("torch", RuntimeError("Async copy failed: x"), False),
    ("torch", TypeError("request must be bytes or a protobuf message"), True),
    ("torch", MemoryError(), False),
])
def test_tpu_sync_refusals(wheel, error, refusal):
    """Each wheel's refusals are recognised by what the wheel raises for bad
    input (the jax wheel's absl status codes, the torch wheel's wrapped check
    messages, their Python layers' own messages); any other error is a
    failure, as is a copy failing after it was accepted."""
    from probes.iut.tpu_sync import AsyncFailure, refuses

    assert refuses(error, wheel) is refusal
    assert not refuses(AsyncFailure("Await raised RuntimeError: Async copy failed: x"), wheel)


class FakeFuture:
    def __init__(self, raises=None, ok=None):
        self.raises, self._ok = raises, ok
        if ok is not None:  # tpu-sync-torch's future has ok() and error_message()
            self.ok = lambda: self._ok
            self.error_message = lambda: "copy 3 failed"

    def Await(self):
        if self.raises:
            raise self.raises


@pytest.mark.parametrize("future, message", [
    (FakeFuture(raises=RuntimeError("Async copy failed: x")), "Await raised RuntimeError: Async copy failed: x"),
    (FakeFuture(ok=False), "Await returned, but the future reports an error: copy 3 failed"),
    (FakeFuture(ok=True), None),
    (FakeFuture(), None),
])
def test_a_failed_copy_is_seen_whichever_way_the_future_says_it(future, message):
    from probes.iut.tpu_sync import AsyncFailure, SyncManagerView

    view = object.__new__(SyncManagerView)
    view.manager = type("M", (), {"d2h": lambda self, *a: future})()
    if message is None:
        view.start(True, [0], [0]).wait()
    else:
        with pytest.raises(AsyncFailure, match=message):
            view.start(True, [0], [0]).wait()


def test_each_layer_keeps_the_block_size_the_library_reports():
    from probes.iut.tpu_sync import layer_block_sizes

    class Impl:  # the jax wheel: block_bytes per block array, slice_byte_size of layer 0
        num_block_arrays, slice_byte_size = 2, 32768

        def block_bytes(self, i):
            return (32768, 65536)[i]

    assert layer_block_sizes(Impl(), 2) == (32768, 65536)
    older = type("Older", (), {"slice_byte_size": 4096})()  # no block_bytes: one size for all
    assert layer_block_sizes(older, 3) == (4096, 4096, 4096)


def test_every_probe_runs_on_the_hardware_matrix():
    """`pytest -m tpu` collects, through the kvprobe plugin, every probe that
    applies for each IUT on real hardware, and none that does not."""
    import subprocess

    from probes.iut.registry import iut as declared
    from probes.suite.matrix import makes
    from probes.suite.registry import PROBES

    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "tpu", "--collect-only", "-q", "-p",
                           "no:cacheprovider"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = [line for line in done.stdout.splitlines() if line.startswith("kvprobe/")]
    for iut in ("tpu-sync-jax-tpu", "tpu-sync-torch-tpu"):
        probes = {line.rsplit("::", 1)[1].split("/")[1] for line in collected if line.startswith(f"kvprobe/{iut}/")}
        applicable = {name for name, p in PROBES.items() if p.scope != "fuzz"
                      and any(makes(declared(iut), name, kind) for kind in p.kinds or ("",))}
        assert probes == applicable and {"pending_views", "plan_binding"} - applicable, iut


@pytest.fixture
def fake_torch_tpu(monkeypatch):
    """TorchTPU's sync and compile modules, standing in on CPU tensors."""
    import types

    state = {"materialized": False, "materializing": False, "layout": None}
    sync = types.SimpleNamespace(is_materialized=lambda t: state["materialized"],
                                 is_materializing=lambda t: state["materializing"])
    compile_module = types.SimpleNamespace(
        tpu_torch_compile=types.SimpleNamespace(get_device_layout_if_materialized=lambda t: state["layout"]))
    monkeypatch.setitem(sys.modules, "torch_tpu", types.ModuleType("torch_tpu"))
    monkeypatch.setitem(sys.modules, "torch_tpu._internal", types.SimpleNamespace(sync=sync))
    monkeypatch.setitem(sys.modules, "torch_tpu._internal.sync", sync)
    monkeypatch.setitem(sys.modules, "torch_tpu._internal.compile", compile_module)
    return state


def test_torch_pending_means_not_yet_launched(fake_torch_tpu):
    """is_materialized is False for a tensor already executing too; one that
    is materializing finishes on its own, so it is not pending."""
    from probes.iut.torch_tpu import TorchTpuArrays

    arrays, cache = TorchTpuArrays("v6e"), object()
    assert arrays.is_pending(cache)
    fake_torch_tpu["materializing"] = True
    assert not arrays.is_pending(cache)
    fake_torch_tpu.update(materializing=False, materialized=True)
    assert not arrays.is_pending(cache)


def test_torch_layout_is_checked_on_the_cache_under_test(fake_torch_tpu):
    torch = pytest.importorskip("torch")
    from probes.iut.torch_tpu import TorchTpuArrays

    arrays = TorchTpuArrays("v6e")
    cache = torch.zeros((512, 16, 2048), dtype=torch.bfloat16)
    fake_torch_tpu["layout"] = ([2, 1, 0], [[8, 128], [2, 1]], 0)  # the compiler's, on v6e
    assert arrays.fetch(cache).shape == (512, 16, 2048)
    fake_torch_tpu["layout"] = ([2, 0, 1], [[8, 128], [2, 1]], 0)
    with pytest.raises(RuntimeError, match=r"TorchTPU laid out a bf16\[512,16,2048\] cache as .*the "
                       r"compiler's layout, which the prediction uses, is \{2,1,0:T\(8,128\)\(2,1\)\}"):
        arrays.fetch(cache)
