"""The verdicts a probe case can earn, and the outcome a worker reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS = "PASS"  # did the right thing
REJECTED = "REJECTED"  # refused cleanly, as expected for the input
CORRUPT = "CORRUPT"  # bytes came back wrong
HANG = "HANG"  # the watchdog fired; stacks kept
CRASH = "CRASH"  # killed by a signal
ERROR = "ERROR"  # any other failure
SKIP = "SKIP"  # not applicable here, with a reason
VERDICTS = (PASS, REJECTED, CORRUPT, HANG, CRASH, ERROR, SKIP)


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
    iut_version: str = ""
    backend: str = ""
    device_kind: str = ""

    @property
    def gbps(self) -> float | None:
        if self.bytes_moved and self.seconds:
            return self.bytes_moved / self.seconds / 1e9
        return None

    def to_dict(self) -> dict:
        return asdict(self)
