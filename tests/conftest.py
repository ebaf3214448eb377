import os
import shutil
import tempfile

import pytest

from tests.hardware_gate import no_hardware_case_ran

HARDWARE_OUTCOMES: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)  # before the kvprobe plugin reads its options
def pytest_configure(config):
    # `pytest -m tpu`: every probe on the seed matrix, on this TPU, for every
    # IUT that owns real hardware, through the kvprobe plugin like any team's CI.
    if "tpu" in (config.getoption("markexpr") or "") and not config.getoption("kvprobe_iut"):
        from probes.iut.registry import usable_iuts
        from probes.run.options import OPTIONS

        config.option.kvprobe_iut = ",".join(n for n, i in usable_iuts().items() if i.owns_device)
        # The seed matrix and every probe, unless the run asks for others.
        for name, value in (("matrix", "seed"), ("probe", "all")):
            if config.getoption(f"kvprobe_{name}") == OPTIONS[name].default:
                setattr(config.option, f"kvprobe_{name}", value)
    # This process never opens a TPU: JAX arrays in the tests live on the CPU
    # (the TPU compiler is used ahead of time through explicit topologies,
    # which this does not affect), and hardware cases run in workers that the
    # runner starts without JAX_PLATFORMS (probes.run.runner).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # Report pictures drawn by the tests' runs are kept in a store of the
    # session's own, not the user's (probes.report.drawn).
    from probes.report import drawn

    os.environ[drawn.PICTURES_VARIABLE] = tempfile.mkdtemp(prefix="kvprobe-pictures-")


# Modules started first. `make test` hands a module at a time to each of its
# workers (--dist loadfile), in this order. test_ray starts its cluster from
# the worker process itself (ray.cluster_utils), so it goes while that process
# has run nothing else: late in a worker that had run hundreds of tests, its
# raylets once failed to come up five times in a row. Then the modules that
# take a minute or more, so the short ones fill in beside them instead of one
# long module running alone at the end.
FIRST = ("test_ray.py", "test_engine.py", "test_peer.py", "test_outside_iuts.py", "test_wheel.py", "test_xla.py", "test_tpu_vm_rehearsal.py",
         "test_contract_sequences.py", "test_probe_teeth.py", "test_hardware_adapters.py", "test_real_connectors.py")


# Each of these modules takes a minute or more of a worker (its fixtures' runs, environments, clusters, engines):
# marked slow, so that `make test-quick` (pytest -m "not slow") leaves them to the whole suite.
SLOW = (*FIRST, "test_contract_restarts.py", "test_contract_long.py", "test_exit_codes.py", "test_reports.py",
        "test_probe_suite.py", "test_earned_verdicts.py", "test_zygote.py", "test_cli_misuse.py", "test_under_load.py")


# Modules started last: test_under_load runs two CPU-bound loops beside its cases, which the other
# worker's modules would share.
LAST = ("test_under_load.py",)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)} | {name: len(FIRST) + 1 + i for i, name in enumerate(LAST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each module keeps its order
    for item in items:
        if item.path.name in SLOW:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report):
    if "tpu" in report.keywords and (report.when == "call" or report.outcome != "passed"):
        HARDWARE_OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    from probes.report import drawn

    shutil.rmtree(os.environ.get(drawn.PICTURES_VARIABLE, ""), ignore_errors=True)
    from probes.iut.hardware import tpu_visible

    reason = no_hardware_case_ran(tpu_visible(), list(HARDWARE_OUTCOMES.values()))
    if reason:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(f"FAILED: {reason}", red=True)
        session.exitstatus = 1
