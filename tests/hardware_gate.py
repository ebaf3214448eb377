"""The rule that fails a TPU run in which no hardware case ran."""

from __future__ import annotations


def no_hardware_case_ran(tpu_here: bool, outcomes: list[str]) -> str | None:
    """Why the session must fail, or None. `outcomes`: "passed", "failed" or
    "skipped" for each selected test marked tpu."""
    if not tpu_here or not outcomes:
        return None
    if all(o == "skipped" for o in outcomes):
        return (f"a TPU is here, but none of the {len(outcomes)} hardware tests ran: every one "
                "was skipped")
    return None
