"""Room for threads: a case that hands a library a huge thread count (a
parallelism of 10**5) must not take the machine's last process ids, which
every other process needs: each thread takes one, and root is not held to
RLIMIT_NPROC. Address space bounds them instead: every thread's stack takes
its share of it, so a worker given room for THREADS more stacks than it has
mapped fails to start the next thread, as a machine out of ids would make it
fail, while the rest of the machine goes on."""

from __future__ import annotations

import contextlib
import resource

from probes.suite.host_budget import address_space_bytes

THREADS = 1024  # more than any manager needs; far fewer than a machine's process ids (32768 by default)
DEFAULT_STACK = 8 << 20  # a thread's stack where RLIMIT_STACK is unlimited (glibc on x86-64)


@contextlib.contextmanager
def room_for_threads(threads: int = THREADS):
    """Within: at most about `threads` more thread stacks (and what else fits
    in that much address space); the limit before is restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    limit = address_space_bytes() + threads * (DEFAULT_STACK if stack == resource.RLIM_INFINITY else stack)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
