"""Registering a transfer plan, the StartTransferRequest, in every form a
caller hands it over, and reading it back."""

from __future__ import annotations

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

# uuid -> (the uuid its request names, src block, dst block): each plan
# distinct, so a read-back that returns the wrong plan, or a constant, is
# seen; p5 names a local block (its sender's source) no cache has, p6 names
# another uuid.
PLANS = {"p0": ("p0", 1, 2), "p1": ("p1", 3, 0), "p2": ("p2", 2, 1), "p3": ("p3", 0, 3),
         "p4": ("p4", 0, 1), "p5": ("p5", 10**6, 0), "p6": ("other", 1, 3)}


def plan_binding(case: Case, iut: Adapter) -> Outcome:
    """Plans as bytes and as the message, as sender and as receiver, are
    accepted and read back as sent, every field; str is refused with
    TypeError, and malformed bytes, a block id no cache has and a request
    naming another uuid with the library's clean refusal; none of those
    leaves anything registered."""
    cache, _ = iut.make_cache(case.shape, case.seed)
    manager = iut.manager([cache], 4)
    try:
        plans = {uuid: iut.plan_request(named, src, dst) for uuid, (named, src, dst) in PLANS.items()}
    except NotImplementedError as e:
        return Outcome(SKIP, str(e))
    refusal = "a clean refusal"
    checks = [  # label, uuid, payload, is_sender, the refusal it must get (None: accepted)
        ("bytes", "p0", plans["p0"].SerializeToString(), True, None),
        ("message", "p1", plans["p1"], True, None),
        ("receiver's", "p4", plans["p4"].SerializeToString(), False, None),
        ("str", "p2", plans["p2"].SerializeToString().decode("latin-1"), True, "TypeError"),
        ("malformed bytes", "p3", b"\xff\xff\xff", True, refusal),
        ("out-of-range block", "p5", plans["p5"].SerializeToString(), True, refusal),
        ("another uuid's", "p6", plans["p6"].SerializeToString(), True, refusal),
    ]
    for label, uuid, payload, is_sender, expected in checks:
        try:
            manager.register_active_plan(uuid, payload, is_sender=is_sender)
        except NotImplementedError as e:
            return Outcome(SKIP, str(e))
        except Exception as e:  # compared with what this input should get
            right = isinstance(e, TypeError) if expected == "TypeError" else iut.refuses(e)
            if expected is None or not right:
                return Outcome(ERROR, f"{label} plan: {first_line(e)}")
            continue
        if expected is not None:
            return Outcome(ERROR, f"{label} plan was accepted; expected {expected}")
    for label, uuid, _, is_sender, expected in checks:
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
        want = iut.library.plan_fields(plans[uuid], is_sender=is_sender)
        got = read_fields(got, want)
        if got != want:
            return Outcome(CORRUPT, f"{label} plan {uuid} reads back as {got}; registered {want}")
    return Outcome(PASS, "bytes and message, sender and receiver, registered and read back as sent; "
                   "str, malformed, out-of-range and mismatched plans refused, leaving nothing registered")


def read_fields(plan, names) -> dict:
    """A plan's fields by name, whether the manager gives a mapping or an
    object with attributes (kvref.Plan); a missing one reads as absent."""
    if hasattr(plan, "keys"):
        return {name: plan[name] for name in names if name in plan}
    return {name: getattr(plan, name) for name in names if hasattr(plan, name)}
