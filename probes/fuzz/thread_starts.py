"""Fuzz category `thread_starts`: a process that cannot start a thread at
some moment (a pids cgroup limit, a full address space), during pulls and
host-to-host transfers between two reference managers. Each input names a
few calls and which of the threads kvref starts meanwhile (its own, and the
timers its listener arms) are refused.

What must hold is known without kvref: a call whose thread could not start
is refused saying so, and claims nothing; a call that was accepted settles,
done or failed, within its timeout; and once every transfer settled and
every chunk handed out was unlocked, both managers have as many chunks free
as before, and go on serving the next input (the pair lives as long as the
worker, so what one input leaks the next one meets; one input in FRESH
starts a new pair, so a thread a manager starts only once, at its first
call, can be refused too)."""

from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager

import numpy as np

import kvref
from kvref.polling import wait_for
from probes.fuzz.mismatch import Mismatch

SHAPE = (32, 8, 128)  # f32: 4 KiB blocks
HOST_BLOCKS = 16
TIMEOUT_S = 3.0  # each manager's: a transfer that cannot land fails within it
SETTLE_S = TIMEOUT_S + 5.0
CALLS = ("pull", "h2h_read", "h2h_write")
FRESH = 4  # one input in FRESH, drawn, starts a new pair of managers


class ThreadStarts:
    name = "thread_starts"
    input_seconds = 4 * SETTLE_S

    def generate(self, rng) -> dict:
        calls = [{"call": str(rng.choice(CALLS)), "blocks": [int(b) for b in rng.choice(HOST_BLOCKS, 2, replace=False)],
                  "parallelism": int(rng.integers(1, 4))} for _ in range(int(rng.integers(1, 4)))]
        refused = sorted({int(n) for n in rng.integers(0, 8, int(rng.integers(0, 3)))})
        return {"calls": calls, "refused": refused, "uuid": int(rng.integers(1, 2**50)),
                "fresh": bool(rng.integers(0, FRESH) == 0)}

    def run(self, case: dict) -> str:
        if case.get("fresh"):
            _renew_pair()
        server, client = _pair()
        peer = server.get_local_endpoints()[0]["endpoint"]
        free = server.chunks_available, client.chunks_available
        pulls, reads, writes, refusals = [], [], [], 0
        with _threads_refused(set(case["refused"])):
            for n, call in enumerate(case["calls"]):
                before = server.chunks_available, client.chunks_available
                try:
                    if call["call"] == "pull":
                        req, uuid = f"req-{case['uuid']}-{n}", case["uuid"] + n
                        server.register_read(req, uuid, call["blocks"])
                        client.start_read(req, uuid, peer, call["blocks"], call["blocks"], call["parallelism"])
                        pulls.append(req)
                    elif call["call"] == "h2h_read":
                        reads.append(client.h2h_read(peer, call["blocks"]))
                    else:
                        writes.append(client.h2h_write(peer, call["blocks"]))
                except (RuntimeError, ValueError) as e:  # a thread not started, here or at the peer; a block
                    if isinstance(e, RuntimeError) and "could not start" not in str(e):  # the peer cannot serve
                        raise Mismatch(f"{call['call']} raised RuntimeError not saying a thread could not "
                                       f"start: {e}") from None
                    # What settles meanwhile only frees chunks: a refused call's claim shows as fewer.
                    if not wait_for(lambda: server.chunks_available >= before[0] and
                                    client.chunks_available >= before[1], SETTLE_S, 0.01):
                        raise Mismatch(f"{call['call']} was refused ({e}) and claimed chunks: free {before} "
                                       f"before, {(server.chunks_available, client.chunks_available)} after") from None
                    refusals += 1
        _settle(server, client, pulls, reads, writes)
        if not wait_for(lambda: (server.chunks_available, client.chunks_available) == free, SETTLE_S, 0.01):
            raise Mismatch(f"chunks free {free} before the input, "
                           f"{(server.chunks_available, client.chunks_available)} once everything settled")
        server.d2h([0], [0], [HOST_BLOCKS]).result()  # every host block the server serves holds bytes again
        return "refused" if refusals else "accepted"


def _settle(server, client, pulls: list[str], reads: list, writes: list) -> None:
    """Every accepted call settled within its timeout, and what it handed out unlocked."""
    reported: set[str] = set()

    def polled() -> bool:
        server.poll_stats()
        _, done, failed = client.poll_stats()
        reported.update(done, failed)
        return reported >= set(pulls)

    if not wait_for(polled, SETTLE_S, 0.01):
        raise Mismatch(f"pulls {sorted(set(pulls) - reported)} never settled within {SETTLE_S} s")
    for side, handed in ((client, reads), (server, writes)):
        for ids, future in handed:
            try:
                future.result(timeout=SETTLE_S)
            except TimeoutError:
                raise Mismatch(f"a host-to-host transfer never settled within {SETTLE_S} s") from None
            except Exception:  # noqa: BLE001 (failed: its chunks are FAILED, unlocked as any)
                pass
            side.unlock_blocks(ids)


@functools.cache
def _pair():
    """The worker's server (listening, serving host transfers) and client, for every input."""
    return _manager(1, listen="127.0.0.1:0", serve_host=True), _manager(2)


def _renew_pair() -> None:
    """The pair closed; the next input's is a new one."""
    for manager in _pair():
        manager.close()
    _pair.cache_clear()


def _manager(seed: int, **options):
    device = kvref.SimDevice("v6e")
    rng = np.random.default_rng(seed)
    caches = [device.put(rng.standard_normal(SHAPE).astype(np.float32)) for _ in range(2)]
    manager = kvref.KVCacheManager(caches, HOST_BLOCKS, timeout_s=TIMEOUT_S, **options)
    manager.d2h([0], [0], [HOST_BLOCKS]).result()
    return manager


@contextmanager
def _threads_refused(refused: set[int]):
    """Thread.start refused ("can't start new thread", as at a pids limit) for
    the threads kvref starts (named kvref-*, and timers) whose ordinal is in `refused`."""
    start, count = threading.Thread.start, [0]

    def start_or_refuse(thread):
        if thread.name.startswith("kvref") or isinstance(thread, threading.Timer):
            count[0] += 1
            if count[0] - 1 in refused:
                raise RuntimeError("can't start new thread")
        start(thread)

    threading.Thread.start = start_or_refuse
    try:
        yield
    finally:
        threading.Thread.start = start
        time.sleep(0)  # threads started just before go on unpatched
