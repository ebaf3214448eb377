"""What a contract campaign already knows, so that it explores past it.

Each failure is keyed by where it arises: its verdict, the step it broke at
(the step's rule and its choices: direction, whether it waits, how a model
step runs; never its numbers), its reason with numbers and lists taken out,
and for a crash or a hang the top frames of the stack it ended in. Each key
is shrunk once; its shrunk sequence's pattern (the caches' mode and the
signature of every step, in order) is then no longer drawn: a step that
would complete a known pattern is drawn again, or another rule's step is
drawn in its place. hypothesis's "multiple bugs" mode keys failures by where
they arise and keeps exploring; here a key also crosses processes (a crash
ends its worker, and the campaign's next worker is handed what is known) and
campaigns (`kvprobe fuzz --known DIR`)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field

FOUND = "kvprobe-contract-finding"  # the worker's output line of each finding of a `kvprobe fuzz` case
REDRAWS = 8  # draws of a step that would complete a known pattern, before another rule's step is drawn
FRAMES = 3  # a crash's or a hang's top frames in its key
# A stack frame as faulthandler prints it: `  File "path", line N in function`.
FRAME = re.compile(r'^\s+File "([^"]*)", line \d+ in (\S+)', re.M)
STACK_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+", re.M)


def signature(step: dict) -> str:
    """A step as its rule, the fields it names, and its discrete choices
    (flags, and words with no digit in them), without numbers, lists or ids."""
    choices = []
    for name in sorted(step):
        value = step[name]
        if name == "rule":
            continue
        if isinstance(value, bool) or value is None:
            choices.append(f"{name}={value}")
        elif isinstance(value, str) and not any(c.isdigit() for c in value):
            choices.append(f"{name}={value}")
        else:
            choices.append(name)
    return " ".join([str(step.get("rule", "?")), *choices])


def reason_of(detail: str) -> str:
    """A failure's first line after the step and the call it names, with
    numbers, lists and quotes taken out (what it says of why is kept)."""
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    first = first.split("}: ", 1)[-1] if first.startswith("step ") else first
    first = first.split(": ", 1)[-1] if re.match(r"^[\w ]+ [\[\d(]", first) else first  # `d2h [1] -> [2] ...: why`
    return re.sub(r"\{.*?\}|\[[^\]]*\]|-?\d+|True|False|'[^']*'|\"[^\"]*\"", "N", first)[:80]


def top_frames(stderr: str, count: int = FRAMES) -> tuple[str, ...]:
    """The innermost frames of the first stack faulthandler printed last
    (a crash's, or a hang's current thread), as `file:function`."""
    heads = list(STACK_HEAD.finditer(stderr))
    if not heads:
        return ()
    current = [h for h in heads if h.group(1) == "Current thread"]
    start = (current[-1] if current else heads[-1]).end()
    ends = [h.start() for h in heads if h.start() > start]
    block = stderr[start:ends[0] if ends else len(stderr)]
    return tuple(f"{path.rsplit('/', 1)[-1]}:{function}" for path, function in FRAME.findall(block)[:count])


@dataclass(frozen=True)
class Key:
    """Where a failure arises."""

    verdict: str
    step: str  # the signature of the step it broke at ("" before any step, or after the last)
    reason: str
    frames: tuple[str, ...] = ()

    def same_as(self, other: "Key") -> bool:
        """Keys match; frames count only where both have them (a finding kept
        as data before its frames were recorded has none)."""
        if (self.verdict, self.step) != (other.verdict, other.step):
            return False
        if self.frames and other.frames:
            return self.frames == other.frames
        return self.reason == other.reason

    def text(self) -> str:
        where = f" at `{self.step}`" if self.step else ""
        frames = f" in {' < '.join(self.frames)}" if self.frames else ""
        return f"{self.verdict}{where}: {self.reason}{frames}"

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "step": self.step, "reason": self.reason, "frames": list(self.frames)}

    @classmethod
    def from_json(cls, data: dict) -> "Key":
        return cls(str(data["verdict"]), str(data["step"]), str(data["reason"]),
                   tuple(str(f) for f in data.get("frames", ())))


def failing_step(sequence: dict | None, index: int | None = None) -> dict | None:
    """The step a failure arose at: the `index`th, or (None) the sequence's last."""
    steps = (sequence or {}).get("steps") or []
    if index is None:
        return steps[-1] if steps else None
    return steps[index] if 0 <= index < len(steps) else None


def key_of(verdict: str, detail: str, sequence: dict | None, index: int | None = None, stderr: str = "") -> Key:
    """Where a failure arises: the rule of the step it broke at, its reason,
    and for a crash or a hang the caches' mode (what takes a process down
    depends on whether its caches have landed) and the top frames."""
    step = failing_step(sequence, index)
    ended = verdict in ("CRASH", "HANG")
    frames = top_frames(stderr) if ended else ()
    mode = (sequence or {}).get("spec", {}).get("mode", "") if ended else ""
    where = f"{step.get('rule', '?')}{f' on {mode} caches' if mode else ''}" if step else ""
    return Key(str(verdict), where, reason_of(detail), frames)


@dataclass(frozen=True)
class Pattern:
    """A shrunk sequence as the draws see it: its caches' mode and its steps' signatures, in order."""

    mode: str
    steps: tuple[str, ...]

    @classmethod
    def of(cls, sequence: dict, upto: int | None = None, rules_only: bool = False) -> "Pattern":
        """The pattern of `sequence`'s steps up to the one at index `upto`, that
        one included; `rules_only`: each step by its rule alone, whatever its
        choices (a crash's: what takes the process down is the call, not how it was asked)."""
        steps = sequence.get("steps") or []
        if upto is not None and 0 <= upto < len(steps):
            steps = steps[:upto + 1]
        signed = tuple(str(s.get("rule", "?")) if rules_only else signature(s) for s in steps)
        return cls(str(sequence.get("spec", {}).get("mode", "")), signed)

    def completed_by(self, mode: str, drawn: list[str], candidate: str) -> bool:
        """Whether `candidate`, drawn after `drawn` on caches of `mode`, completes
        this pattern: it is the pattern's last step, and the rest occur before it
        in order (a step of the pattern that is a rule alone matches any step of it)."""
        if not self.steps or mode != self.mode or not _is(candidate, self.steps[-1]):
            return False
        wanted = iter(drawn)
        return all(any(_is(w, s) for w in wanted) for s in self.steps[:-1])

    def to_json(self) -> dict:
        return {"mode": self.mode, "steps": list(self.steps)}

    @classmethod
    def from_json(cls, data: dict) -> "Pattern":
        return cls(str(data["mode"]), tuple(str(s) for s in data["steps"]))


def _is(signed: str, pattern_step: str) -> bool:
    return signed == pattern_step or (" " not in pattern_step and signed.split(" ", 1)[0] == pattern_step)


@dataclass
class Known:
    """The failures known, their patterns, and how often a known one came again."""

    keys: list[Key] = field(default_factory=list)
    patterns: list[Pattern] = field(default_factory=list)
    repeats: dict[str, int] = field(default_factory=dict)  # a key's text -> times seen again
    steered: int = 0  # steps drawn again, or in another rule's place, away from a known pattern

    def find(self, key: Key) -> Key | None:
        return next((k for k in self.keys if k.same_as(key)), None)

    def add(self, key: Key, pattern: Pattern | None) -> bool:
        """Record `key`, and the pattern to steer away from (a known key met by
        another pattern adds that one too); False if the key was known (counted again)."""
        if pattern is not None and pattern.steps and pattern not in self.patterns:
            self.patterns.append(pattern)
        known = self.find(key)
        if known is not None:
            self.repeats[known.text()] = self.repeats.get(known.text(), 0) + 1
            return False
        self.keys.append(key)
        return True

    def draw(self, draw, mode: str, drawn: list[str], rules: tuple[str, ...], family) -> dict | None:
        """A step from `draw(only)` (only: the rules it may draw from; () for
        all) that completes no known pattern after the steps `drawn`; None
        where none can be drawn (the sequence then ends)."""
        step = draw(())
        for attempt in range(REDRAWS + 1):
            if not any(p.completed_by(mode, drawn, signature(step)) for p in self.patterns):
                return step
            self.steered += 1
            if attempt < REDRAWS:
                step = draw(())
        others = tuple(r for r in rules if r != family(step["rule"]))
        try:
            step = draw(others)
        except (ValueError, ZeroDivisionError):  # no other rule's precondition holds
            return None
        return None if any(p.completed_by(mode, drawn, signature(step)) for p in self.patterns) else step

    def to_json(self) -> dict:
        return {"keys": [k.to_json() for k in self.keys], "patterns": [p.to_json() for p in self.patterns]}

    @classmethod
    def from_json(cls, data: dict | None) -> "Known":
        data = data or {}
        return cls([Key.from_json(k) for k in data.get("keys", ())],
                   [Pattern.from_json(p) for p in data.get("patterns", ())])


def say_found(verdict: str, detail: str, sequence: dict, key: Key, pattern: Pattern | None) -> None:
    """A worker's finding on its output (FOUND), with where it arose and the
    pattern to steer away from: a crash later in the case keeps it."""
    line = {"verdict": str(verdict), "detail": detail.splitlines()[0] if detail else "", "sequence": sequence,
            "key": key.to_json(), "pattern": pattern.to_json() if pattern else None}
    print(f"{FOUND} {json.dumps(line)}", file=sys.stderr, flush=True)
