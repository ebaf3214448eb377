"""Registering a transfer plan, the StartTransferRequest, in every form a
caller hands it over, and reading it back."""

from __future__ import annotations

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

# uuid -> (src block, dst block): each plan distinct, so a read-back that
# returns the wrong plan, or a constant, is seen.
PLANS = {"p0": (1, 2), "p1": (3, 0), "p2": (2, 1), "p3": (0, 3)}


def plan_binding(case: Case, iut: Adapter) -> Outcome:
    """Plans as bytes and as the message are accepted and read back as sent;
    str is refused with TypeError and malformed bytes with the library's
    clean refusal, and neither leaves anything registered."""
    cache, _ = iut.make_cache(case.shape, case.seed)
    manager = iut.manager([cache], 4)
    try:
        plans = {uuid: iut.plan_request(uuid, src, dst) for uuid, (src, dst) in PLANS.items()}
    except NotImplementedError as e:
        return Outcome(SKIP, str(e))
    checks = [  # label, uuid, payload, the refusal it must get (None: accepted)
        ("bytes", "p0", plans["p0"].SerializeToString(), None),
        ("message", "p1", plans["p1"], None),
        ("str", "p2", plans["p2"].SerializeToString().decode("latin-1"), "TypeError"),
        ("malformed bytes", "p3", b"\xff\xff\xff", "a clean refusal"),
    ]
    for label, uuid, payload, expected in checks:
        try:
            manager.register_active_plan(uuid, payload, is_sender=True)
        except NotImplementedError as e:
            return Outcome(SKIP, str(e))
        except Exception as e:  # compared with what this input should get
            right = isinstance(e, TypeError) if expected == "TypeError" else iut.refuses(e)
            if expected is None or not right:
                return Outcome(ERROR, f"{label} plan: {first_line(e)}")
            continue
        if expected is not None:
            return Outcome(ERROR, f"{label} plan was accepted; expected {expected}")
    for label, uuid, _, expected in checks:
        try:
            got = manager.active_plan(uuid)
        except NotImplementedError as e:
            return Outcome(SKIP, f"bytes and message registered, str and malformed refused, but "
                           f"{e}, so what was registered is not verified")
        except (KeyError, ValueError, LookupError) as e:
            if expected is None:
                return Outcome(CORRUPT, f"{label} plan {uuid} was accepted but is not registered: "
                               f"{first_line(e)}")
            continue
        if expected is not None:
            return Outcome(CORRUPT, f"{label} plan {uuid} was refused but is registered: {got}")
        want = iut.library.plan_fields(plans[uuid], is_sender=True)
        if got != want:
            return Outcome(CORRUPT, f"{label} plan {uuid} reads back as {got}; registered {want}")
    return Outcome(PASS, "bytes and message registered and read back as sent; str and malformed "
                   "refused, leaving nothing registered")
