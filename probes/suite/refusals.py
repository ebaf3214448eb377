"""How probes read a manager's exceptions: the IUT's library says which are
clean refusals of the input (probes.iut.protocol.Library.refuses), and
details quote them in one line."""

from __future__ import annotations

from probes.iut.adapter import Adapter
from probes.suite.verdicts import REJECTED, Outcome


def refused(iut: Adapter, e: Exception, context: str = "", **fields) -> Outcome:
    """REJECTED for the library's clean refusal of the input; anything else
    propagates, and the worker records it as ERROR with its traceback."""
    if not iut.refuses(e):
        raise e
    return Outcome(REJECTED, f"{context}{first_line(e)}", **fields)


def first_line(e: BaseException) -> str:
    """The exception as `Type: first line of its message`, for one-line details."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
