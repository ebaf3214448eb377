"""Workers forked from a warm parent: a forkserver that has imported the
worker's modules once (numpy, kvref, the probes) forks each case's process,
so a case costs a fork instead of an interpreter start and its imports. Each
case is still its own process, in its own session, under its own watchdog:
a crash or a hang costs that case alone, and the runner kills its group and
reads its exit status as it does for a started worker.

Only cases of the main interpreter's IUTs use it (the simulated device, JAX on
the CPU); peer environments and real devices start their workers afresh, and
nothing in the forkserver opens a device."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading

PRELOAD = ["probes.run.warm"]
_context = None
_lock = threading.Lock()


def context():
    """The forkserver context, started once with PRELOAD imported."""
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _context = ctx
    return _context


def start(case_json: str, env: dict, out_path: str, err_path: str):
    """The case's process, started; its stdout and stderr go to the files."""
    process = context().Process(target=_child, args=(case_json, env, out_path, err_path), daemon=False)
    process.start()
    return process


def _child(case_json: str, env: dict, out_path: str, err_path: str) -> None:
    os.setsid()  # its own process group, which the runner kills whole
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    from probes.run.worker import run_text

    status = run_text(case_json)
    sys.stdout.flush()
    # What interpreter exit would release, released here under the armed
    # watchdog: garbage, then every thread still running.
    gc.collect()
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    sys.stderr.flush()
    os._exit(status)
