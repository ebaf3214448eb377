"""What a worker does with one case: build the adapter, let it say why it
cannot run here, then run the probe and describe the IUT in the outcome."""

from __future__ import annotations

import resource
import time
import traceback

from probes.iut import adapter_for
from probes.suite.cases import Case
from probes.suite.host_budget import address_space_bytes
from probes.suite.registry import probe
from probes.suite.verdicts import ERROR, SKIP, Outcome


def run_case_here(text: str, on_probe_start=lambda timeout, described=None: None) -> Outcome:
    """One case, here. `on_probe_start(timeout, described)` once start-up is
    over, with what the outcome will say of the IUT (`described`), told before
    the probe runs so that a worker that crashes or hangs in it keeps it."""
    case = Case.from_json(text)
    iut = adapter_for(case.iut, case.generation, case.faults, dict(case.iut_options))
    try:
        reason = iut.skip_reason()
    except Exception as e:  # the IUT is here but could not start: never a skip
        return Outcome(ERROR, f"{case.iut} could not start: {type(e).__name__}: {e}")
    if reason:
        return Outcome(SKIP, reason)
    declared = probe(case.probe)
    if declared.address_space_headroom:
        # On top of what is mapped now: a TPU runtime already loaded maps a lot.
        limit = address_space_bytes() + declared.address_space_headroom
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    on_probe_start(case.timeout, described(iut))
    start = time.perf_counter()
    try:
        outcome = declared.run(case, iut)
    except Exception as e:  # the IUT failed in a way no probe expected
        outcome = Outcome(ERROR, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    if outcome.seconds is None:
        outcome.seconds = time.perf_counter() - start
    outcome.iut_version, outcome.backend, outcome.device_kind = iut.version, iut.backend, iut.device_kind
    return outcome


def described(iut) -> dict:
    """The IUT as an outcome names it: its version, backend and device kind
    (asking for the device kind may open the device: start-up's work, under
    the address-space limit the probe runs with). Empty where asking fails:
    the probe then meets the same failure and reports it."""
    try:
        return {"iut_version": iut.version, "backend": iut.backend, "device_kind": iut.device_kind}
    except Exception:  # the probe meets it too, and the outcome says what it was
        return {}
