"""Registering a transfer plan, the StartTransferRequest, in every form a
caller hands it over."""

from __future__ import annotations

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.verdicts import ERROR, PASS, SKIP, Outcome


def plan_binding(case: Case, iut: Adapter) -> Outcome:
    """Plans as bytes and as the message are accepted; str and malformed bytes
    are refused with TypeError and ValueError."""
    cache, _ = iut.make_cache(case.shape, case.seed)
    manager = iut.manager([cache], 4)
    try:
        checks = [
            ("bytes", iut.plan_request("p0").SerializeToString(), None),
            ("message", iut.plan_request("p1"), None),
            ("str", iut.plan_request("p2").SerializeToString().decode("latin-1"), TypeError),
            ("malformed bytes", b"\xff\xff\xff", ValueError),
        ]
    except NotImplementedError as e:
        return Outcome(SKIP, str(e))
    for i, (label, payload, expected) in enumerate(checks):
        try:
            manager.register_active_plan(f"p{i}", payload, is_sender=True)
        except NotImplementedError as e:
            return Outcome(SKIP, str(e))
        except Exception as e:  # compared with what this input should raise
            if expected is None or not isinstance(e, expected):
                return Outcome(ERROR, f"{label} plan: {first_line(e)}")
            continue
        if expected is not None:
            return Outcome(ERROR, f"{label} plan was accepted; expected {expected.__name__}")
    return Outcome(PASS, "bytes and message accepted; str and malformed refused")
