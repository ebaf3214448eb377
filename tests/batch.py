"""What a module's selected tests read, run together (two at a time, unless the module says otherwise) before
the first of them: the cases of their parameters, in one run_cases call, so
that a case that waits (a hang's deadline, a pull's, a copy held in flight)
overlaps the others instead of holding up the tests after it. Each test
then reads its own results."""

from __future__ import annotations

from typing import Callable, Iterable

import pytest

from probes.run.runner import CaseResult, run_cases
from probes.suite.cases import Case

BATCH_SECONDS = 1800  # a module's cases in all, on a loaded machine


def selected(request: pytest.FixtureRequest, test: str) -> list[dict]:
    """The parameters of each selected item of `test` in the requesting module."""
    return [item.callspec.params if hasattr(item, "callspec") else {} for item in request.session.items
            if item.module is request.module and item.originalname == test]


def run_selected(request: pytest.FixtureRequest,
                 cases_of: dict[str, Callable[..., Iterable[Case]]]) -> dict[Case, CaseResult]:
    """Every case that `cases_of[test name](**its parameters)` names for a
    selected test of the requesting module, each run once, by case."""
    wanted = [c for test, making in cases_of.items() for params in selected(request, test) for c in making(**params)]
    cases = list(dict.fromkeys(wanted))
    return dict(zip(cases, run_cases(cases, jobs=2)))  # in input order
