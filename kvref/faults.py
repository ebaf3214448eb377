"""Fault models: each switches the reference manager back to one old bug."""

from __future__ import annotations

import os

FAULTS: dict[str, str] = {
    "no_materialize_before_await":
        "unpack awaits a buffer without materializing it: construction over deferred "
        "tensors hangs, holding the GIL",
    "legacy_slice_formula":
        "slice size from the old formula, with no addressability check",
    "str_only_plan_binding":
        "the plan binding takes std::string, so it refuses the bytes it is given",
    "allow_mixed_slices":
        "host allocation and host block offsets all come from layer 0's slice",
    "no_await_before_transfer":
        "unpack neither materializes nor awaits: transfers race host->device copies",
    "no_host_budget":
        "the host pool is allocated without checking it against a budget (host OOM)",
}

ENV_VAR = "KVREF_FAULTS"


def parse_faults(faults=(), environ=None) -> frozenset[str]:
    """The faults named in `faults` plus those in $KVREF_FAULTS (comma-separated)."""
    if isinstance(faults, str):
        faults = [faults]
    environ = os.environ if environ is None else environ
    names = [f.strip() for f in faults] + [
        f.strip() for f in environ.get(ENV_VAR, "").split(",") if f.strip()]
    unknown = sorted(set(names) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault model(s) {unknown}; expected any of {sorted(FAULTS)}")
    return frozenset(names)
