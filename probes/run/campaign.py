"""A contract campaign (`kvprobe fuzz`): lanes of workers drawing contract
sequences, each finding written once, and the campaign going on past it.

Each lane (a way of building the manager, and a worker number) runs workers
for its time: a worker that a crash or a hang ended is followed by another,
handed every failure known so far (probes.suite.contract_known), so it
steers away from what is known instead of finding it again. Every failure is
keyed by where it arises; a new key is shrunk once (a crash or a hang by
replays, each in a worker of its own; anything else by its worker) and
written as data at once (probes.run.findings), with its key and the pattern
later draws avoid. `--known DIR` starts a campaign knowing the findings of
an earlier one."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from probes.run.findings import add_option_set, read_finding, write_finding
from probes.run.runner import CaseResult, kill_live, run_case
from probes.suite.contract_known import Key, Known, Pattern, key_of
from probes.suite.contract_sequences import HELD, findings_in, sequence_in, shorter
from probes.suite.verdicts import CRASH, HANG, PASS

MAX_SHRINK_RUNS = 40  # replays that shrink one crash or hang
MIN_SHRINK_SECONDS = 60.0  # a crash found as its lane's time runs out is still shrunk, for at most this long
REPLAY_SECONDS = 60.0  # one replay of a shrinking crash or hang, at most (a sequence of 40 steps takes seconds)
FOUND_AT = re.compile(r"^step (\d+) ")


@dataclass
class Campaign:
    """What a campaign found and knows, shared by its lanes."""

    directory: Path  # where its findings are written
    known: Known = field(default_factory=Known)
    written: list[Path] = field(default_factory=list)
    workers: list[CaseResult] = field(default_factory=list)
    held: dict[str, int] = field(default_factory=dict)  # rule -> steps held to the model, over every worker
    known_before: int = 0  # keys it started with (--known)
    steered: int = 0  # draws its workers steered away from known patterns
    paths: dict[str, Path] = field(default_factory=dict)  # a key's text -> the finding this campaign wrote of it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, result: CaseResult, shrink_until: float) -> None:
        """A worker's result: its steps tallied, every new finding written (a
        crash or a hang shrunk first, until `shrink_until`), every known one counted."""
        with self.lock:
            self.workers.append(result)
            rules, steered = held_in(result.stderr)
            for rule, count in rules.items():
                self.held[rule] = self.held.get(rule, 0) + count
            self.steered += steered
        for verdict, headline, sequence, key, pattern in self._said(result):
            if self._new(key, pattern, result):
                self._write(result, verdict, headline, sequence, key, pattern)
        verdict = result.outcome.verdict
        if verdict not in (CRASH, HANG):
            return
        began = sequence_in(result.stderr)
        key = key_of(verdict, result.outcome.detail, began, None, result.stderr)
        last = Pattern.of({**began, "steps": began["steps"][-1:]}, rules_only=True) \
            if began and began["steps"] else None
        if not self._new(key, last, result):  # known at once: a lane meeting it while it shrinks steers away
            return
        shrunk, sequence = finished(result, began, shrink_until)
        pattern = Pattern.of(sequence, rules_only=True) if sequence else last
        with self.lock:
            if last in self.known.patterns and pattern != last:
                self.known.patterns[self.known.patterns.index(last)] = pattern
        self._write(shrunk, verdict, shrunk.outcome.detail, sequence, key, pattern)

    def _new(self, key: Key, pattern: Pattern | None, result: CaseResult) -> bool:
        """Whether `key` is new (it is known from now on); a known one met under
        another way of building the manager adds that way to its finding."""
        with self.lock:
            if self.known.add(key, pattern):
                return True
            path = self.paths.get(self.known.find(key).text())
            if path is not None:
                add_option_set(path, result.case)
            return False

    def _said(self, result: CaseResult):
        """Each finding the worker shrank itself: (verdict, headline, sequence, key, pattern)."""
        headlines = set()
        for verdict, headline, sequence, said in findings_in(result.outcome.detail, result.outcome.verdict,
                                                             result.stderr, keyed=True):
            if verdict in (CRASH, HANG, PASS) or headline in headlines:  # said on its output and in its detail
                continue
            headlines.add(headline)
            if said:
                yield verdict, headline, sequence, Key.from_json(said["key"]), \
                    Pattern.from_json(said["pattern"]) if said.get("pattern") else None
                continue
            at = FOUND_AT.match(headline)
            index = int(at.group(1)) if at else None
            yield verdict, headline, sequence, key_of(verdict, headline, sequence, index), \
                Pattern.of(sequence, index) if sequence else None

    def _write(self, result: CaseResult, verdict: str, headline: str, sequence: dict | None, key: Key,
               pattern: Pattern | None) -> None:
        case = replace(result.case, calls=sequence) if sequence else result.case
        extra = {"key": key.to_json(), "pattern": pattern.to_json() if pattern else None}
        with self.lock:
            path = write_finding(case, verdict, headline, result.outcome.iut_version, result.case.case_id,
                                 self.directory, extra)
            if path not in self.written:
                self.written.append(path)
            self.paths[key.text()] = path

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.workers:
            counts[r.outcome.verdict] = counts.get(r.outcome.verdict, 0) + 1
        new = len(self.known.keys) - self.known_before
        lines = [f"{len(self.workers)} workers: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())),
                 f"  {new} distinct findings new to this campaign, {self.known_before} known before it; "
                 f"known ones met again {sum(self.known.repeats.values())} times; {self.steered} draws "
                 "steered away from known patterns",
                 "  steps held to the model per rule: " + (", ".join(f"{rule} {n}" for rule, n in
                                                                  sorted(self.held.items())) or "none")]
        for text, times in sorted(self.known.repeats.items()):
            lines.append(f"  known, met again {times}x: {text[:200]}")
        for path in self.written:
            finding = read_finding(path, "contract")
            steps = len(finding["case"]["calls"].get("steps", ())) or "?"
            lines.append(f"  {finding['verdict']} in {steps} step(s): {finding['detail'][:200]}\n    -> {path}")
        return "\n".join(lines)


def known_in(directory: Path) -> Known:
    """The contract findings kept in `directory` as known failures (their keys and patterns)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--known {directory}: not a folder of findings")
    known = Known()
    for path in sorted(directory.glob("contract-*.json")):
        finding = read_finding(path, "contract")
        sequence = finding["case"].get("calls")
        if finding.get("key"):
            key = Key.from_json(finding["key"])
        else:  # kept before findings carried their key
            at = FOUND_AT.match(finding["detail"])
            key = key_of(finding["verdict"], finding["detail"], sequence, int(at.group(1)) if at else None)
        pattern = Pattern.from_json(finding["pattern"]) if finding.get("pattern") else \
            Pattern.of(sequence) if isinstance(sequence, dict) and sequence.get("steps") else None
        known.add(key, pattern)
    return known


def held_in(stderr: str) -> tuple[dict[str, int], int]:
    """The steps a worker held per rule, and its draws steered away from
    known patterns, from its last tally line (an IUT's line that looks like
    one counts nothing)."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(HELD + " "):
            try:
                tally = json.loads(line[len(HELD) + 1:])
                rules, steered = dict(tally["rules"]), int(tally["steered"])
            except (ValueError, TypeError, KeyError, RecursionError):
                return {}, 0
            return {str(k): v for k, v in rules.items() if type(v) is int and v >= 0}, max(0, steered)
    return {}, 0


def finished(result: CaseResult, sequence: dict | None, until: float) -> tuple[CaseResult, dict | None]:
    """A crash or a hang, which ended its worker before it could shrink,
    shrunk here by replaying shorter sequences each in a worker of its own
    until the clock reads `until` (time.monotonic()): the last result that
    failed alike, and its sequence."""
    if sequence is None:
        return result, None
    best = result

    def fails_alike(candidate: dict) -> dict | None:
        nonlocal best
        # A replay of one short sequence that runs past REPLAY_SECONDS hangs: it is not waited for to the
        # drawing worker's timeout, nor past the time shrinking has.
        limit = max(10.0, min(REPLAY_SECONDS, until - time.monotonic()))
        tried = run_case(replace(result.case, calls=candidate, timeout=min(result.case.timeout, limit)))
        if tried.outcome.verdict != result.outcome.verdict:
            return None
        best = tried
        return candidate

    shrunk = shorter(sequence, fails_alike, until, max_replays=MAX_SHRINK_RUNS)
    return best, shrunk


def run_lanes(campaign: Campaign, lanes: list, make_case, seconds: float, jobs: int, stop_early) -> None:
    """Each lane's workers until its `seconds` pass: `make_case(lane, round,
    seconds_left, known)` is the next worker's case; a lane ends when its
    worker ran its time (`stop_early(result)` false) or its time is up."""
    stopping = threading.Event()

    def lane(which) -> None:
        ends, round_ = time.monotonic() + seconds, 0
        while not stopping.is_set():
            left = ends - time.monotonic()
            if round_ and left < min(10.0, seconds / 4):
                return
            with campaign.lock:
                known = campaign.known.to_json()
            result = run_case(make_case(which, round_, seconds if not round_ else left, known))
            campaign.take(result, max(ends, time.monotonic() + MIN_SHRINK_SECONDS))
            round_ += 1
            if not stop_early(result):
                return

    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="lane")
    futures = [pool.submit(lane, which) for which in lanes]
    try:
        for future in futures:
            future.result()
    except KeyboardInterrupt:
        stopping.set()  # no lane starts another worker; the running ones end now; what was found is written
        pool.shutdown(wait=False, cancel_futures=True)
        kill_live()
        raise
    pool.shutdown()
