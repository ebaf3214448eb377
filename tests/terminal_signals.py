"""Signals a test's child gets as if started from a terminal.

A job a non-interactive shell starts in the background ignores SIGINT, and
one under `nohup` ignores SIGHUP; an ignored signal stays ignored across
fork and exec, and Python leaves an ignored SIGINT ignored. The tests that
send a child Ctrl-C, SIGTERM or SIGHUP undo that for it: in this process,
for as long as the child is started (a handled signal is the default again
in the exec'd child)."""

import contextlib
import signal

SENT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def terminal_signals():
    saved = {signum: signal.getsignal(signum) for signum in SENT}
    for signum, handler in saved.items():
        if handler == signal.SIG_IGN:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
