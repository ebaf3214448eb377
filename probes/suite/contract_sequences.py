"""Stateful random sequences over the contract (probes.suite.contract), run
in the case's worker: each step drawn from the model's state
(probes.suite.contract_draws), carried out on the IUT and the model
(probes.suite.contract_rules), and every host block the model knows
compared after it; device blocks at `check` steps and at the end. A
failing sequence is shrunk here, by replaying shorter ones on fresh caches
and a fresh manager, to the shortest that fails the same way.

Why not hypothesis's RuleBasedStateMachine: a finding here may be a crash
or a hang, which ends the process hypothesis shrinks in; so a sequence is
data (JSON, replayable on any IUT with `kvprobe fuzz --replay`), drawn by
a seeded generator, and shrunk by replay, in the worker for what leaves
it alive and by `kvprobe fuzz` across workers for what does not. A replayed
step whose precondition no longer holds (the save it names was dropped)
is passed over, as hypothesis passes over a rule whose bundle is empty."""

from __future__ import annotations

import json
import re
import sys
import time

import numpy as np

from probes.iut.adapter import Adapter
from probes.suite import contract_hosts, contract_pulls, contract_restarts, contract_rules as rules
from probes.suite.cases import Case
from probes.suite.contract_draws import DRAWS, Parts, addressable_shapes, draw_spec, draw_step, shapes_of
from probes.suite.contract_known import FOUND, Key, Known, Pattern, key_of, reason_of, say_found, signature
from probes.suite.contract_long import LONG_SPEC, long_run
from probes.suite.contract_rules import Broken, Session, Stop
from probes.suite.refusals import first_line
from probes.suite.verdicts import ERROR, PASS, SKIP, Outcome

STEPS = 40  # steps a drawn sequence takes
# Sequences a case draws: all of them, or it says it could not (never a PASS on fewer). A test suite's run of
# every probe on kvref-jax, beside the engine test, drew a sequence in about 4 s: 40 is what such a run reaches.
SEQUENCES = 40
# Drawing them, at most (and 0.6 of the case's timeout): at load 4 kvref-jax and kvref-compat draw about one
# sequence a second, kvref-sim 2.5.
BUDGET_SECONDS = 240.0
CASE_SECONDS = 400.0  # a case's timeout: its budget, shrinking, and its worker's start and exit
MAX_REPLAYS = 120  # shrinking: replays of shorter sequences
HELD = "kvprobe-contract-held"  # the worker's output line, after each sequence: steps held per rule, draws steered
PULL_RULES = contract_pulls.RULES | contract_restarts.RULES  # drawn as one family
RULES = rules.RULES | PULL_RULES | contract_hosts.RULES
AGAIN = 0.1  # of drawn steps, those that repeat the step before (again)
# The offload manager's rules a step may be repeated of: not a wait or a check (a judgment's end, a comparison),
# nor a rebuild; a pull's and a host's steps name the registrations and transfers they make.
REPEATABLE = rules.RULES.keys() - {"wait", "check", "rebuild"}


def contract_sequences(case: Case, iut: Adapter) -> Outcome:
    """Random sequences of the offload calls (transfers awaited and not,
    saves, loads, unlocks, the store) with model steps, stalls and failing
    copies between them, every step held to the contract's model; a
    failing sequence is shrunk and given as JSON. With case.calls, a
    sequence ({spec, seed, steps}) is replayed, {"sequences": N} are drawn
    for 0.4 of the case's timeout (`kvprobe fuzz`), or {"count": N} take the
    place of SEQUENCES; {"shrink_seconds": S} bounds shrinking a finding."""
    parts = Parts.of(iut)
    if case.calls is not None and "spec" in case.calls:
        spec = case.calls["spec"]
        unaddressable = shapes_of(iut, [s for s in (spec["shape"], spec.get("mixed")) if s], contiguous=False)
        if unaddressable:  # found on another device: its rows are not byte ranges here
            return Outcome(SKIP, f"the rows of the sequence's caches ({', '.join(unaddressable)}) are not byte "
                                 f"ranges on {iut.generation}: replay it on a target where they are")
        failure = run_sequence(iut, case.calls, parts)
        if failure is None:
            return Outcome(PASS, f"the sequence's {len(case.calls['steps'])} steps held to the model")
        return _outcome(failure, case.calls, case.calls)
    shapes = addressable_shapes(iut)
    if not shapes:
        return Outcome(SKIP, f"no sequence shape has rows that are byte ranges on {iut.generation}")
    if case.calls is not None and "long" in case.calls:
        return _long(case, iut, parts, case.calls["long"])
    drawn = (case.calls or {}).get("sequences")
    known = Known.from_json((case.calls or {}).get("known"))
    start, budget = time.monotonic(), case.timeout * 0.4 if drawn else min(BUDGET_SECONDS, case.timeout * 0.6)
    wanted = drawn or (case.calls or {}).get("count") or SEQUENCES
    sequences = steps = 0
    held: dict[str, int] = {}  # rule -> steps held to the model
    found: dict[Key, Outcome] = {}  # where each failure arose -> its shrunk finding, in the order found
    while sequences < wanted and time.monotonic() - start < budget:
        rng = np.random.default_rng([case.seed, sequences])
        spec = draw_spec(rng, shapes, parts) | ({"restarts": contract_restarts.CAMPAIGN_RESTART_SEQUENCES}
                                                 if drawn else {})
        sequence = {"spec": spec, "seed": int(rng.integers(2**31)), "steps": []}
        failure = run_sequence(iut, sequence, parts, rng=rng, known=known)
        sequences += 1
        steps += len(sequence["steps"])
        _tally(held, sequence["steps"][:failure[0] if failure else None])
        if drawn:
            print(f"{HELD} {json.dumps({'rules': held, 'steered': known.steered})}", file=sys.stderr, flush=True)
        if failure is None:
            continue
        key = key_of(failure[1].verdict, failure[1].detail, sequence, failure[0])
        if known.find(key) is not None or key in found:  # shrunk already, here or by the campaign
            known.add(key, None)
            continue
        # A probe's case ends at its first finding; `kvprobe fuzz` goes on for other kinds.
        # Shrinking ends with room left for a last replay and the worker's exit (pull managers closing).
        deadline = start + case.timeout * 0.8 if not drawn else min(start + budget, time.monotonic() + 30)
        if "shrink_seconds" in (case.calls or {}):
            deadline = min(deadline, time.monotonic() + case.calls["shrink_seconds"])
        shrunk = shrink(iut, sequence, failure, parts, deadline=deadline)
        replayed = run_sequence(iut, shrunk, parts) or failure
        drawn_key = key  # where it arose in the sequence drawn; shrinking may move it to another step
        key = key_of(replayed[1].verdict, replayed[1].detail, shrunk, replayed[0]) if replayed is not failure else key
        pattern = Pattern.of(shrunk, replayed[0])
        new = known.add(key, pattern)  # not drawn again by this worker
        if drawn_key != key:
            known.add(drawn_key, None)
        if not new:  # shrunk to a failure known already
            continue
        outcome = _outcome(replayed, shrunk, sequence, sequences)
        found[key] = outcome
        if not drawn:
            break
        say_found(outcome.verdict, outcome.detail, shrunk, key, pattern)
    per_rule = f"; steps held per rule: {json.dumps(dict(sorted(held.items())))}" if drawn else ""
    if known.repeats or known.steered:
        per_rule += f"; known findings met again {sum(known.repeats.values())} times, {known.steered} draws " \
                    "steered away from known patterns"
    if found:
        first = next(iter(found.values()))
        if len(found) == 1:
            return first
        return Outcome(first.verdict, "\n".join(f"finding {n} of {len(found)}, {o.verdict}: {o.detail}"
                                                for n, o in enumerate(found.values(), 1)))
    if not steps:
        return Outcome(ERROR, "no sequence ran within the budget")
    elapsed = time.monotonic() - start
    if sequences < wanted and not drawn:
        return Outcome(ERROR, f"drew {sequences} of the {wanted} sequences in the {budget:.0f} s budget "
                              f"({steps} steps held to the contract's model): too few to pass")
    return Outcome(PASS, f"{sequences} sequences, {steps} steps held to the contract's model in {elapsed:.0f} s"
                         f"{per_rule}")


def _tally(held: dict[str, int], steps: list[dict]) -> None:
    for step in steps:
        held[step["rule"]] = held.get(step["rule"], 0) + 1


def _long(case: Case, iut: Adapter, parts: Parts, steps: int) -> Outcome:
    """One long sequence of cycles (probes.suite.contract_long), going on past
    what breaks; not shrunk: its finding is the whole run."""
    rng = np.random.default_rng([case.seed, 0])
    spec = {**LONG_SPEC, "store": 64 if parts.store else 0, "without": [], "favour": "rebuild"}
    sequence = {"spec": spec, "seed": int(rng.integers(2**31)), "steps": []}
    print(f"sequence {json.dumps({'spec': spec, 'seed': sequence['seed']})}", file=sys.stderr, flush=True)
    known = Known.from_json(case.calls.get("known"))
    found = long_run(iut, sequence, parts, rng, steps, known)
    if not found:
        return Outcome(PASS, f"{steps} steps of save, load, unlock, store and rebuild held to the model, no resource "
                             "grew with any rule's operations, and every resource back to its baseline")
    said = "\n".join(f"long run, step {index}: {broken.detail}" for index, broken in found)
    return Outcome(found[0][1].verdict, f"{said}\nsequence (long, {len(sequence['steps'])} steps, not shrunk): "
                                         f"{json.dumps(sequence)}")


def run_sequence(iut: Adapter, sequence: dict, parts: Parts, rng=None,
                 known: Known | None = None) -> tuple[int, Broken] | None:
    """Replay `sequence` (or, with `rng`, draw its steps as it goes and
    record them, none completing a `known` pattern): the first broken rule,
    as (step, Broken), or None."""
    # On the worker's output, so a hang's or a crash's detail names the sequence it ended in.
    print(f"sequence {json.dumps({'spec': sequence['spec'], 'seed': sequence['seed']})}", file=sys.stderr, flush=True)
    try:
        session = Session(iut, sequence["spec"], sequence["seed"])
    except Stop:
        return None
    except Broken as e:
        return -1, e
    steps = sequence["steps"] if rng is None else []
    repeats = np.random.default_rng([sequence["seed"], 1])  # its own stream: draws before the first repeat stay
    index = 0
    try:
        while index < (len(steps) if rng is None else STEPS):
            if rng is not None:
                step = (known or Known()).draw(lambda only: again(repeats, steps, session, parts, only)
                                               or draw_step(rng, session, parts, only),
                                               sequence["spec"]["mode"], [signature(s) for s in steps],
                                               tuple(DRAWS), family)
                if step is None:
                    break
                steps.append(step)
                sequence["steps"] = steps
            step = steps[index]
            print(f"step {index} {json.dumps(step)}", file=sys.stderr, flush=True)
            if applies(session, step, parts):
                RULES[step["rule"]](session, index, step)
                rules.check_host(session)
                rules.check_exports(session)
            index += 1
        for pending in sorted(session.judgments):
            rules.wait(session, index, {"of": pending})
        if session.pulls is not None:
            contract_pulls.settle(session, index, {})
        rules.check_host(session)
        rules.check(session, index, {})
        rules.check_exports(session)
    except Stop:
        sequence["steps"] = steps[:index + 1]
    except Broken as e:
        sequence["steps"] = steps[:index + 1]
        return index, Broken(e.verdict, e.detail)  # not its traceback, whose frames hold the session's managers
    except Exception as e:  # a rule of the harness itself failed: the verdict says so, with the step
        sequence["steps"] = steps[:index + 1]
        return index, Broken(ERROR, f"the harness failed at this step: {type(e).__name__}: {first_line(e)}")
    finally:
        session.close()
    return None


def again(rng, steps: list[dict], session: Session, parts: Parts, only: tuple[str, ...] = ()) -> dict | None:
    """Now and then, the step before drawn once more, verbatim, where its
    precondition still holds: the same call twice (a save of the same
    blocks, a load into the same blocks, an insert of the same hashes), and
    a call made again after it was refused or its copies failed. Random
    draws alone almost never repeat a step."""
    if not steps or rng.random() >= AGAIN:
        return None
    last = steps[-1]
    if last["rule"] in REPEATABLE and (not only or family(last["rule"]) in only) and applies(session, last, parts):
        return dict(last)
    return None


def applies(session: Session, step: dict, parts: Parts) -> bool:
    """Whether a replayed step's precondition still holds."""
    model, rule = session.model, step["rule"]
    if rule == "wait":
        return step["of"] in session.judgments
    if rule == "load":
        save = model.saves.get(step["of"])
        return save is not None and not save.unlocked and all(i < len(save.chunks) for i in step["pick"]) \
            and all(0 <= b < model.rows for b in step["dst"])
    if rule == "unlock" and "of" in step:
        return step["of"] in model.saves
    if rule == "model_step":
        return step["layer"] < len(session.caches) and (parts.donation or step["how"] in ("serving", "dispatch"))
    if rule in ("hold", "fail_copies"):
        return step["layer"] < len(session.caches) and (parts.hold if rule == "hold" else parts.fail_copies)
    if rule == "store_call":
        return session.store is not None
    if rule == "plan":
        return parts.plans
    if rule == "build_refused":
        return step["shape"] in parts.interleaved
    if rule in PULL_RULES:
        starts_world = rule in ("register", "pull") or rule in contract_restarts.RULES  # world() builds it
        return parts.pulls and (starts_world or session.pulls is not None)
    if rule in contract_hosts.RULES:
        return parts.hosts and contract_hosts.applies(session, step)
    return True


def family(rule: str) -> str:
    """The rule a sequence's draw picks for a step of `rule` (a pull's and a host's steps are drawn as one)."""
    return "pulls" if rule in PULL_RULES else "hosts" if rule in contract_hosts.RULES else rule


def failure_kind(failure: tuple[int, Broken]) -> tuple[str, str]:
    """Failures of one kind, for shrinking, share the verdict and the reason
    (contract_known.reason_of), wherever in the sequence they arise."""
    return failure[1].verdict, reason_of(failure[1].detail)


def shrink(iut: Adapter, sequence: dict, failure: tuple[int, Broken], parts: Parts, deadline: float) -> dict:
    """The shortest sequence found that fails the same way, by replays here."""
    kind = failure_kind(failure)

    def fails_alike(candidate: dict) -> dict | None:
        found = run_sequence(iut, candidate, parts)
        return candidate if found is not None and failure_kind(found) == kind else None

    return shorter(sequence, fails_alike, deadline)


def shorter(sequence: dict, fails_alike, deadline: float, max_replays: int = MAX_REPLAYS) -> dict:
    """Runs of steps dropped (halves, then quarters, down to single steps),
    then a layer, while `fails_alike(candidate)` answers the candidate as
    replayed (or None: it did not fail alike); at most `max_replays`
    replays, none begun after `deadline` (time.monotonic())."""
    best, replays = sequence, 0

    def attempt(candidate: dict) -> dict | None:
        nonlocal replays
        if replays >= max_replays or time.monotonic() > deadline:
            return None
        replays += 1
        return fails_alike(json.loads(json.dumps(candidate)))

    chunk = max(1, len(best["steps"]) // 2)
    while chunk >= 1 and replays < max_replays and time.monotonic() < deadline:
        start, progressed = 0, False
        while start < len(best["steps"]):
            trial = attempt({**best, "steps": without(best["steps"], start, chunk)})
            if trial is not None:
                best, progressed = trial, True
            else:
                start += chunk
        if not progressed:
            chunk //= 2
    if best["spec"]["layers"] > 1:
        best = attempt({**best, "spec": {**best["spec"], "layers": 1}}) or best
    return best


def without(steps: list[dict], start: int, count: int) -> list[dict]:
    """The steps but [start, start + count), each later step's reference to
    an earlier one (`of`, a step's index) renumbered to what it names; a
    reference to a dropped step names none (-1), so that step is skipped."""
    kept = steps[:start]
    for step in steps[start + count:]:
        of = step.get("of")
        if isinstance(of, int) and not isinstance(of, bool) and of >= start:
            step = {**step, "of": of - count if of >= start + count else -1}
        kept.append(step)
    return kept


def findings_in(detail: str, verdict: str, output: str = "", keyed: bool = False) -> list[tuple]:
    """Each finding a case's detail gives, and each its worker said on its
    output before it ended: (verdict, its first line, its sequence), and
    with `keyed` what the worker said of where it arose ({key, pattern}, or None)."""
    said = []
    for line in output.splitlines():
        if line.startswith(FOUND + " "):
            try:
                found = json.loads(line[len(FOUND) + 1:])
                where = {"key": found["key"], "pattern": found.get("pattern")} if "key" in found else None
                said.append((found["verdict"], found["detail"], found["sequence"], where))
            except (ValueError, KeyError, TypeError, RecursionError):  # a line an IUT wrote, not the worker
                continue
    found = said + [(*f, None) for f in _findings_in(detail, verdict)]
    return found if keyed else [f[:3] for f in found]


def _findings_in(detail: str, verdict: str) -> list[tuple[str, str, dict | None]]:
    blocks = re.split(r"^finding \d+ of \d+, ", detail, flags=re.M)
    if len(blocks) == 1:
        return [(verdict, detail.strip().splitlines()[0] if detail.strip() else "", sequence_in(detail))]
    found = []
    for block in blocks[1:]:
        said, _, rest = block.partition(": ")
        found.append((said, rest.splitlines()[0], sequence_in(block)))
    return found


def sequence_in(detail: str) -> dict | None:
    """The sequence a case's detail gives: the shrunk one of a finding, or
    the last one the worker began (from its output), or None."""
    found = re.search(r"^sequence \(.*?\): (\{.*\})$", detail, re.M)
    if found:
        try:
            return json.loads(found.group(1))
        except (ValueError, RecursionError):
            return None
    began = [m.start() for m in re.finditer(r"^sequence \{", detail, re.M)]
    if not began:
        return None
    lines = detail[began[-1]:].splitlines()
    try:
        sequence = {**json.loads(lines[0][len("sequence "):]), "steps": []}
        for line in lines[1:]:
            if line.startswith("step "):
                sequence["steps"].append(json.loads(line.split(" ", 2)[2]))
    except (ValueError, IndexError, RecursionError):
        return None
    return sequence


def _outcome(failure: tuple[int, Broken], shrunk: dict, found: dict, number: int = 1) -> Outcome:
    index, broken = failure
    where = "building the manager" if index < 0 else f"step {index} {json.dumps(shrunk['steps'][index])}" \
        if index < len(shrunk["steps"]) else "after the last step, every transfer awaited"
    return Outcome(broken.verdict, f"{where}: {broken.detail}\nsequence (the case's {_ordinal(number)}, "
                                   f"{len(found['steps'])} steps, shrunk to {len(shrunk['steps'])}): "
                                   f"{json.dumps(shrunk)}")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
