"""The process around kvref under random events: transfers in flight (some
held on a slow link) when the process exits, raises, forks, is signalled or
drops everything it holds. Each case runs in a process of its own
(`python -m probes.fuzz.lifecycle CASE_JSON`); the parent checks how it
ended against what the event alone implies (a normal exit is status 0, a
SIGTERM is death by SIGTERM, never an abort, a crash or a hang) and what the
child checked of the bytes it awaited."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from kvref.polling import wait_for
from probes.fuzz.mismatch import Mismatch

CASE_SECONDS = 20.0  # well inside the fuzz worker's watchdog; a held copy lasts at most 1.5 s
KINDS = ("d2h", "h2d", "auto", "raw_d2h", "raw_h2d")
EVENTS = {  # what ends the child, and the status that ending alone implies
    "await": 0, "exit": 0, "return": 0, "drop_and_exit": 0, "thread": 0, "fork": 0, "exit_holding_gil": 0,
    "daemon_packing": 0, "daemon_waiting": 0,
    "raise": 1, "SIGTERM": -signal.SIGTERM, "SIGINT": -signal.SIGINT, "SIGINT_in_wait": -signal.SIGINT,
}
ROWS, HOST_BLOCKS = 64, 24
# Rows each kind touches, so that every byte's final value is determined: one
# manager's transfers run in program order; raw ones and a second manager's
# (which allocates its own chunks) only read rows nothing writes, or write rows
# nothing else touches.
MANAGED_READ, MANAGED_WRITE, UNWRITTEN, RAW_WRITE = range(0, 48), range(16, 48), range(0, 16), range(48, 64)
CRASH_SIGNS = ("terminate called", "Fatal Python error", "Segmentation fault", "Aborted", "core dumped")


class Lifecycle:
    name = "lifecycle"

    def generate(self, rng) -> dict:
        raw_rows = [int(r) for r in rng.permutation(RAW_WRITE)]
        transfers = []
        for _ in range(int(rng.integers(0, 5))):
            kind = KINDS[int(rng.integers(len(KINDS)))]
            if kind == "raw_h2d":
                if not raw_rows:
                    continue
                transfers.append({"kind": kind, "rows": [raw_rows.pop()]})
            elif kind in ("raw_d2h", "auto"):
                transfers.append({"kind": kind, "rows": [int(rng.choice(UNWRITTEN))]})
            elif kind == "h2d":
                transfers.append({"kind": kind, "chunks": [int(rng.integers(HOST_BLOCKS))],
                                  "rows": [int(rng.choice(MANAGED_WRITE))]})
            else:
                transfers.append({"kind": kind, "rows": [int(rng.choice(MANAGED_READ))],
                                  "chunks": [int(rng.integers(HOST_BLOCKS))]})
        hold_us = int(rng.choice([0, 200_000, 1_500_000])) if rng.random() < 0.6 else 0
        return {"event": list(EVENTS)[int(rng.integers(len(EVENTS)))], "hold_us": hold_us,
                "transfers": transfers, "seed": int(rng.integers(2**31))}

    def command(self, case: dict) -> list[str]:
        return [sys.executable, "-m", "probes.fuzz.lifecycle", json.dumps(case)]

    def run(self, case: dict) -> str:
        try:
            done = subprocess.run(self.command(case), capture_output=True, text=True, timeout=CASE_SECONDS)
        except subprocess.TimeoutExpired:
            raise Mismatch(f"{case['event']}: the child hung past {CASE_SECONDS:.0f} s") from None
        expected = EVENTS[case["event"]]
        crash = next((sign for sign in CRASH_SIGNS if sign in done.stderr), None)
        if done.returncode != expected or crash:
            raise Mismatch(f"{case['event']}: exit {done.returncode}, expected {expected}"
                           f"{f' ({crash!r} on stderr)' if crash else ''}: {done.stderr.strip()[-800:]}")
        if case["event"] in ("await", "fork") and "checked" not in done.stdout:
            raise Mismatch(f"{case['event']}: the child did not check its bytes: {done.stdout[-400:]}")
        return "accepted"


def _start(case: dict):
    """The child's device, manager and transfers in flight, and a function
    that awaits them and checks every byte they moved."""
    import numpy as np

    import kvref

    rng = np.random.default_rng(case["seed"])
    host = rng.integers(0, 2**31, (ROWS, 8, 128), dtype=np.int64).astype(np.float32)
    cache = kvref.SimDevice().put(host)
    manager, allocating = kvref.KVCacheManager([cache], HOST_BLOCKS), kvref.KVCacheManager([cache], 8)
    device, chunks = [row.tobytes() for row in host], [bytes(manager.bytes_per_block)] * HOST_BLOCKS
    if case["hold_us"]:
        cache.hold_next_dma(case["hold_us"])
    futures, reads = [], []  # reads: (a function giving the bytes read, the bytes expected)
    for t in case["transfers"]:
        kind = t["kind"]
        if kind == "d2h":
            futures.append(manager.d2h(t["rows"], t["chunks"]))
            chunks[t["chunks"][0]] = device[t["rows"][0]]
        elif kind == "auto":
            taken, future = allocating.d2h_auto_allocate(t["rows"])
            futures.append(future)
            reads.append((lambda chunk=taken[0]: allocating.read_block_bytes(0, chunk), device[t["rows"][0]]))
        elif kind == "h2d":
            futures.append(manager.h2d(t["chunks"], t["rows"]))
            device[t["rows"][0]] = chunks[t["chunks"][0]]
        elif kind == "raw_d2h":
            landing = np.zeros(manager.bytes_per_block, np.uint8)
            futures.append(kvref.transfer_d2h_async(cache, landing, t["rows"], [0]))
            reads.append((landing.tobytes, device[t["rows"][0]]))
        else:  # raw_h2d
            source = rng.integers(0, 256, manager.bytes_per_block, dtype=np.uint8)
            futures.append(kvref.transfer_h2d_async(cache, source, [0], t["rows"]))
            device[t["rows"][0]] = source.tobytes()

    def check() -> None:
        for future in futures:
            future.result(timeout=CASE_SECONDS / 2)
        physical = cache.physical_bytes()
        for row, expected in enumerate(device):
            assert physical[row * len(expected):(row + 1) * len(expected)].tobytes() == expected, f"row {row}"
        for chunk, expected in enumerate(chunks):
            assert manager.read_block_bytes(0, chunk) == expected, f"host chunk {chunk}"
        for read, expected in reads:
            assert read() == expected, "an allocated chunk or a raw read"
        print("checked", flush=True)

    return {"cache": cache, "managers": (manager, allocating), "futures": futures, "reads": reads}, check


def _forked_child_works(held: dict) -> int:
    """In a forked child: a new manager moves blocks, and an inherited future
    is refused saying why (or, done before the fork, gives its result). The
    status says which failed."""
    import numpy as np

    import kvref

    try:
        fresh = kvref.SimDevice().put(np.full((ROWS, 8, 128), 7.0, np.float32))
        manager = kvref.KVCacheManager([fresh], 2)
        manager.d2h([3], [1]).result(timeout=CASE_SECONDS / 4)
        if manager.read_block_bytes(0, 1) != np.full((8, 128), 7.0, np.float32).tobytes():
            return 3
        for future in held["futures"][:1]:
            try:
                future.result(timeout=CASE_SECONDS / 4)
            except kvref.DeviceError as e:
                if "fork" not in str(e):
                    return 4
        return 0
    except BaseException:  # noqa: BLE001 (any failure is the status; the parent reads it)
        import traceback
        traceback.print_exc()
        return 6


class _SlowToFinalize:
    def __del__(self):
        time.sleep(0.3)  # drops the GIL while the interpreter finalizes


def _exit_holding_gil(futures) -> None:
    """Keep the GIL while the copies end, so their threads wait for it to let
    go of what they own, then exit: those threads get the GIL only while the
    interpreter finalizes (a release taking it then once aborted the process)."""
    sys.setswitchinterval(30)
    globals()["_finalizing_slowly"] = _SlowToFinalize()
    deadline = time.monotonic() + CASE_SECONDS / 2
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        pass
    spin = time.perf_counter() + 0.2
    while time.perf_counter() < spin:
        pass
    sys.exit(0)


def child(case: dict) -> None:
    event = case["event"]
    # Ctrl-C raises KeyboardInterrupt here even where this child was started ignoring SIGINT
    # (a shell's background job), which Python would otherwise leave ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if event == "thread":  # transfers issued on a thread that ends before the process does
        worker = threading.Thread(target=lambda: _start(case))
        worker.start()
        worker.join()
        return
    held, check = _start(case)
    if event == "await":
        check()
    elif event == "exit":
        sys.exit(0)
    elif event == "raise":
        raise RuntimeError("a planned error with transfers in flight")
    elif event == "drop_and_exit":
        import gc
        held.clear()
        gc.collect()
        sys.exit(0)
    elif event == "fork":
        pid = os.fork()
        if pid == 0:
            os._exit(_forked_child_works(held))
        waited = []  # each (pid, status) waitpid gave: (0, 0) while the child runs
        if not wait_for(lambda: waited.append(os.waitpid(pid, os.WNOHANG)) or waited[-1][0], CASE_SECONDS / 2):
            os.kill(pid, signal.SIGKILL)
            sys.exit("the forked child hung")
        status = waited[-1][1]
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"the forked child failed with {os.waitstatus_to_exitcode(status)}")
        check()
    elif event == "exit_holding_gil":
        _exit_holding_gil(held["futures"])
    elif event in ("SIGTERM", "SIGINT"):
        os.kill(os.getpid(), getattr(signal, event))
        time.sleep(CASE_SECONDS)  # the signal ends the process before this does
    elif event in ("daemon_packing", "daemon_waiting"):  # the process exits while a daemon thread is in a call
        threading.Thread(target=_keep_calling, args=(event, held), daemon=True).start()
        time.sleep(0.05)
        sys.exit(0)
    elif event == "SIGINT_in_wait":
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        for future in held["futures"]:
            future.result(timeout=CASE_SECONDS / 2)
        time.sleep(CASE_SECONDS)



def _keep_calling(event: str, held: dict) -> None:
    """Calls that let go of the GIL, one after another, until the process ends."""
    import numpy as np

    import kvref

    cache, (manager, _) = held["cache"], held["managers"]
    logical = np.ones((ROWS, 8, 128), np.float32)
    while True:
        if event == "daemon_packing":
            kvref.pack(logical, cache.shape)
        else:
            manager.d2h(list(MANAGED_READ[:8]), list(range(8))).result(timeout=CASE_SECONDS)


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
