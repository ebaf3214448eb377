"""The verdicts a probe case can earn, what the reference predicts of one,
and the outcome a worker reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """A case's verdict; its text (`PASS`) is what results tables hold."""

    PASS = "PASS"  # did the right thing
    REJECTED = "REJECTED"  # refused cleanly, as expected for the input
    CORRUPT = "CORRUPT"  # bytes came back wrong
    HANG = "HANG"  # the watchdog fired; stacks kept
    CRASH = "CRASH"  # killed by a signal, or a non-zero exit after the probe reported
    ERROR = "ERROR"  # any other failure
    SKIP = "SKIP"  # not applicable here, with a reason

    @classmethod
    def _missing_(cls, value):  # Verdict(text) refuses any other text, naming the verdicts
        raise ValueError(f"verdict {value!r}; expected one of {', '.join(cls)}")


# The names probes write their outcomes with (`Outcome(PASS, ...)`).
PASS, REJECTED, CORRUPT, HANG = Verdict.PASS, Verdict.REJECTED, Verdict.CORRUPT, Verdict.HANG
CRASH, ERROR, SKIP = Verdict.CRASH, Verdict.ERROR, Verdict.SKIP
# What faulthandler's watchdog (dump_traceback_later) writes first when it fires.
WATCHDOG_FIRED = "Timeout ("


@dataclass(frozen=True)
class Prediction:
    """The verdicts a correct manager may earn on a case, the reference's
    first. Its one text form, in results tables and messages, is
    `PASS|REJECTED` (`str`; read back with `parse`)."""
    verdicts: tuple[Verdict, ...]

    SEPARATOR = "|"

    def __post_init__(self):
        verdicts = tuple(Verdict(v) for v in self.verdicts)
        if not verdicts or len(set(verdicts)) != len(verdicts):
            raise ValueError(f"a prediction names one or more verdicts, each once; got {self.verdicts!r}")
        object.__setattr__(self, "verdicts", verdicts)

    @classmethod
    def parse(cls, text: str) -> Prediction:
        return cls(tuple(text.split(cls.SEPARATOR)))

    def __str__(self) -> str:
        return self.SEPARATOR.join(self.verdicts)

    def admits(self, verdict: str) -> bool:
        """Whether a correct manager may earn `verdict`."""
        return verdict in self.verdicts

    def admitting(self, verdict: str) -> Prediction:
        """This prediction, with `verdict` admitted too (after the others)."""
        return self if self.admits(verdict) else Prediction((*self.verdicts, verdict))


@dataclass
class Outcome:
    verdict: Verdict  # text naming a verdict is taken, and checked, here
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
        self.verdict = Verdict(self.verdict)

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
    worst = min(outcomes.values(), key=lambda o: SEVERITY.index(o.verdict))
    last = list(outcomes.values())[-1]
    detail = "; ".join(f"{role}: {o.verdict} {o.detail.strip()}" for role, o in outcomes.items())
    return Outcome(worst.verdict, detail, host_bytes=last.host_bytes, bytes_moved=last.bytes_moved,
                   seconds=last.seconds, baseline_gbps=last.baseline_gbps, iut_version=last.iut_version or worst.iut_version,
                   backend=last.backend or worst.backend, device_kind=last.device_kind or worst.device_kind)


def nothing_in_flight(overlapped: list, why: str) -> str:
    """The detail of the ERROR of a probe that could not see the overlap its
    property needs: `overlapped` holds, per round, whether it was seen (None:
    the library cannot say without waiting)."""
    if None in overlapped:
        return ("nothing in flight confirmed: this library's transfer future cannot say whether it is "
                "done without waiting (no done()), so the overlap the property needs went unseen")
    return f"nothing in flight: {why}, in each of {len(overlapped)} round(s); the property was not exercised"
