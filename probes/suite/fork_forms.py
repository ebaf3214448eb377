"""Managers across os.fork(), as a serving engine that forks its workers
meets them: the parent holds a live manager (it has moved blocks) when it
forks, and the child builds one of its own in each constructor form, or
calls the manager it inherited. The child reports through a pipe of the
probe's own and ends with os._exit; the parent bounds it in time, and its
own manager must go on working."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import tempfile
import time

from kvref.polling import wait_for
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.pull_sides import FAILING_TIMEOUT_S, PULL_TIMEOUT_S, Side, endpoint_for, pull_library, uuid_of
from probes.suite.verdicts import CORRUPT, CRASH, ERROR, HANG, PASS, SKIP, Outcome

FORK_KINDS = ("pool_in_child", "slots_in_child", "inherited_call")
HOST_BLOCKS = 8  # of the pool form's host pool; the round trips move them all
CHILD_SECONDS = 10.0  # the longest a child may take
EXIT_POLL_S = 0.02
STACKS_S = 1.0  # for a hanging child to write its stacks, asked by SIGUSR1, before it is killed
STARTED = b"started\n"  # the child's first word: its fork handlers are behind it


def fork_forms(case: Case, iut: Adapter) -> Outcome:
    """pool_in_child: the child builds a pool-form manager over caches of
    its own and round-trips every host block exactly. slots_in_child: the
    parent's live manager is the listening slots form, and the child builds
    two (a producer and a consumer) and pulls blocks between them exactly.
    inherited_call: the child saves through the manager it inherited, which
    must finish or refuse, never hang or kill the child. In every kind the
    child ends within CHILD_SECONDS, and the parent's manager then still
    round-trips exactly. The kinds that make caches in the child SKIP for
    arrays that cannot be made there (Arrays.runs_in_forked_child)."""
    slots = case.kind == "slots_in_child"
    if case.kind != "inherited_call" and not getattr(iut.arrays, "runs_in_forked_child", False):
        return Outcome(SKIP, f"{iut.name}'s arrays ({iut.backend}) cannot be made in a forked child while "
                       "its parent holds some (JAX's runtime, for one, deadlocks there: its threads stay in the "
                       "parent); Arrays.runs_in_forked_child says where they can")
    if slots and pull_library(iut) is None:
        return Outcome(SKIP, f"{iut.name}'s library builds no slots-form manager (no PullLibrary)")
    caches = [iut.make_cache(case.shape, case.seed + i) for i in range(2)]
    if slots:
        manager = pull_library(iut).pull_manager([c for c, _ in caches], "slots", True, PULL_TIMEOUT_S, HOST_BLOCKS)
    else:
        manager = iut.manager([c for c, _ in caches], HOST_BLOCKS)
    wrong = _round_trip(iut, manager, caches)  # a live manager: it has moved blocks (in the slots form, its slots)
    if wrong:
        return Outcome(CORRUPT, f"the parent's manager, before the fork: {wrong}")
    child = _in_child(lambda: _CHILDREN[case.kind](case, iut, manager))
    if child.verdict != PASS:
        return child
    wrong = _round_trip(iut, manager, caches)
    if wrong:
        return Outcome(CORRUPT, f"the parent's manager, after the child: {wrong}")
    return Outcome(PASS, f"child: {child.detail}; the parent's manager went on working")


def _round_trip(iut: Adapter, manager, caches) -> str:
    """Save every block, scramble the caches, load them back: "" when every
    byte came back, else what differs."""
    blocks = list(range(HOST_BLOCKS))
    iut.d2h(manager, blocks, blocks)
    for cache, _ in caches:
        iut.scramble(cache)
    iut.h2d(manager, blocks, blocks)
    for layer, (cache, host) in enumerate(caches):
        got, want = iut.fetch(cache)[:HOST_BLOCKS], host[:HOST_BLOCKS]
        if got.tobytes() != want.tobytes():
            return f"layer {layer}: blocks 0..{HOST_BLOCKS - 1} did not come back"
    return ""


def _pool_in_child(case: Case, iut: Adapter, inherited) -> Outcome:
    fresh = iut.fresh()
    caches = [fresh.make_cache(case.shape, case.seed + 10 + i) for i in range(2)]
    manager = fresh.manager([c for c, _ in caches], HOST_BLOCKS)
    wrong = _round_trip(fresh, manager, caches)
    return Outcome(CORRUPT, wrong) if wrong else Outcome(PASS, "a pool-form manager built in it round-tripped")


def _slots_in_child(case: Case, iut: Adapter, inherited) -> Outcome:
    fresh = iut.fresh()
    lib = pull_library(fresh)
    producer, consumer = Side(case, fresh, lib), Side(case, fresh, lib).another()
    producer.make_caches()
    consumer.make_caches()
    made = [lib.pull_manager(side.caches, "slots", True, FAILING_TIMEOUT_S, HOST_BLOCKS)
            for side in (producer, consumer)]
    producer.manager, consumer.manager = made
    pairs = list(zip(range(HOST_BLOCKS), reversed(range(HOST_BLOCKS))))
    producer.manager.register_read("fork", uuid_of(case), [r for r, _ in pairs])
    consumer.manager.start_read("fork", uuid_of(case), endpoint_for(producer.manager.get_local_endpoints()),
                                [r for r, _ in pairs], [l for _, l in pairs])
    polls = [([], [], [])]
    wait_for(lambda: polls.append(consumer.manager.poll_stats()) or "fork" in polls[-1][1] + polls[-1][2],
             FAILING_TIMEOUT_S, EXIT_POLL_S)
    done = polls[-1]
    if "fork" not in done[1]:
        return Outcome(ERROR, f"a pull between two slots-form managers built in it ended "
                       f"{'failed' if 'fork' in done[2] else 'unsettled'}")
    wrong = producer.unchanged() or consumer.check_landed({l: (producer.seed, r) for r, l in pairs})
    return Outcome(CORRUPT, wrong) if wrong else Outcome(PASS, "two slots-form managers built in it pulled exactly")


def _inherited_call(case: Case, iut: Adapter, inherited) -> Outcome:
    blocks = list(range(HOST_BLOCKS))
    try:
        iut.d2h(inherited, blocks, blocks)
    except Exception as e:  # refusing a manager of another process is right
        return Outcome(PASS, f"a save through the inherited manager was refused: {type(e).__name__}: {e}"[:300])
    return Outcome(PASS, "a save through the inherited manager finished")


_CHILDREN = {"pool_in_child": _pool_in_child, "slots_in_child": _slots_in_child,
             "inherited_call": _inherited_call}
assert tuple(_CHILDREN) == FORK_KINDS


def _in_child(work) -> Outcome:
    """`work()`'s Outcome, run in a forked child bounded by CHILD_SECONDS
    (one that hangs writes its stacks when killed, which the Outcome quotes)."""
    read_end, write_end = os.pipe()
    stacks = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe and leave without the parent's exit handlers
        os.close(read_end)
        os.write(write_end, STARTED)  # past the fork handlers: what follows is the probe's
        # Not dump_traceback_later: cancelling the watchdog the worker armed waits for a thread the child lacks.
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
            outcome = work()
            report = {"verdict": str(outcome.verdict), "detail": outcome.detail}
        except BaseException as e:  # noqa: BLE001 (whatever it raised is the report)
            report = {"verdict": str(ERROR), "detail": f"{type(e).__name__}: {e}"[:500]}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    try:
        status = _wait(pid, CHILD_SECONDS)
        text = b""
        while chunk := os.read(read_end, 65536):
            text += chunk
        if status is None and not text.startswith(STARTED):
            return Outcome(ERROR, f"the forked child hung before the probe's code ran in it (in the fork "
                           f"handlers of the framework or library, killed after {CHILD_SECONDS:.0f}s): nothing "
                           "of the manager was exercised")
        if status is None:
            return Outcome(HANG, f"the forked child did not finish within {CHILD_SECONDS:.0f}s (killed); "
                           f"its main thread was in {_innermost(stacks)}")
        text = text.removeprefix(STARTED)
    finally:
        os.close(read_end)
        stacks.close()
    if os.WIFSIGNALED(status):
        return Outcome(CRASH, f"the forked child was killed by {signal.Signals(os.WTERMSIG(status)).name}"
                       + (f" after reporting {text.decode(errors='replace')[:200]}" if text else ""))
    if not text:
        return Outcome(ERROR, f"the forked child exited with status {os.WEXITSTATUS(status)} without a report")
    report = json.loads(text)
    return Outcome(report["verdict"], report["detail"])


def _innermost(stacks) -> str:
    """The innermost frames of the main thread faulthandler wrote, most recent first."""
    stacks.seek(0)
    threads = stacks.read().decode(errors="replace").split("\n\n")
    main = next((t for t in threads if "<module>" in t or "fork_forms" in t), threads[-1])
    frames = [line.strip() for line in main.splitlines() if line.strip().startswith("File")]
    return "; ".join(frames[:4]) or "(no stacks written)"


def _wait(pid: int, seconds: float) -> int | None:
    """The child's wait status, or None once `seconds` passed (it is then killed and reaped)."""
    waited = []  # each (pid, status) waitpid gave: (0, 0) while the child runs
    if wait_for(lambda: waited.append(os.waitpid(pid, os.WNOHANG)) or waited[-1][0], seconds, EXIT_POLL_S):
        return waited[-1][1]
    os.kill(pid, signal.SIGUSR1)  # its stacks (faulthandler), then the end
    time.sleep(STACKS_S)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
