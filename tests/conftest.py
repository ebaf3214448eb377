import os

from tests.hardware_gate import no_hardware_case_ran

HARDWARE_OUTCOMES: dict[str, str] = {}


def pytest_configure(config):
    # This process never opens a TPU: JAX arrays in the tests live on the CPU
    # (the TPU compiler is used ahead of time through explicit topologies,
    # which this does not affect), and hardware cases run in workers that the
    # runner starts without JAX_PLATFORMS (probes.run.runner).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_runtest_logreport(report):
    if "tpu" in report.keywords and (report.when == "call" or report.outcome != "passed"):
        HARDWARE_OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    from probes.iut.hardware import tpu_visible

    reason = no_hardware_case_ran(tpu_visible(), list(HARDWARE_OUTCOMES.values()))
    if reason:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(f"FAILED: {reason}", red=True)
        session.exitstatus = 1
