"""The verdicts a probe case can earn, and the outcome a worker reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS = "PASS"  # did the right thing
REJECTED = "REJECTED"  # refused cleanly, as expected for the input
CORRUPT = "CORRUPT"  # bytes came back wrong
HANG = "HANG"  # the watchdog fired; stacks kept
CRASH = "CRASH"  # killed by a signal, or a non-zero exit after the probe reported
ERROR = "ERROR"  # any other failure
SKIP = "SKIP"  # not applicable here, with a reason
VERDICTS = (PASS, REJECTED, CORRUPT, HANG, CRASH, ERROR, SKIP)
# What faulthandler's watchdog (dump_traceback_later) writes first when it fires.
WATCHDOG_FIRED = "Timeout ("


def agrees(verdict: str, predicted: str) -> bool:
    """Whether a verdict is one of the predicted ones (`PASS|REJECTED`)."""
    return verdict in predicted.split("|")


@dataclass
class Outcome:
    verdict: str
    detail: str = ""
    host_bytes: int | None = None
    bytes_moved: int | None = None
    seconds: float | None = None
    pending_at_construction: bool | None = None  # the caches' contents were not there yet
    baseline_gbps: float | None = None  # a plain copy of the same bytes, timed beside it in the worker
    iut_version: str = ""
    backend: str = ""
    device_kind: str = ""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}; expected one of {', '.join(VERDICTS)}")

    @property
    def gbps(self) -> float | None:
        if self.bytes_moved and self.seconds:
            return self.bytes_moved / self.seconds / 1e9
        return None

    def to_dict(self) -> dict:
        return asdict(self)


# The verdict of a two-process case is its worse side's: a crash first, a pass last.
SEVERITY = (CRASH, HANG, CORRUPT, ERROR, REJECTED, SKIP, PASS)


def both_sides(outcomes: dict[str, Outcome]) -> Outcome:
    """One outcome from each role's (a two-process probe): the worse verdict,
    every side's detail, and the measurements the consumer made."""
    worst = min(outcomes.values(), key=lambda o: SEVERITY.index(o.verdict) if o.verdict in SEVERITY else 0)
    last = list(outcomes.values())[-1]
    detail = "; ".join(f"{role}: {o.verdict} {o.detail.strip()}" for role, o in outcomes.items())
    return Outcome(worst.verdict, detail, host_bytes=last.host_bytes, bytes_moved=last.bytes_moved,
                   seconds=last.seconds, baseline_gbps=last.baseline_gbps, iut_version=last.iut_version or worst.iut_version,
                   backend=last.backend or worst.backend, device_kind=last.device_kind or worst.device_kind)
