"""The `kvprobe` command's entry point. It imports nothing heavy itself:
Ctrl-C (or SIGTERM, SIGHUP) while the commands are still being imported
(numpy, JAX, the compiler's table: the first second or so) is held until
the imports are done, then ends the command as an interruption of a run
does, with one line and exit 128 + the signal. (Raised inside an import, it
came out as a traceback, or as numpy's ImportError.)"""

import signal
import sys

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main() -> int:
    came: list[int] = []
    before = {signum: signal.getsignal(signum) for signum in HELD}
    for signum, handler in before.items():
        if handler != signal.SIG_IGN:  # an ignored signal (nohup, a background job) stays ignored
            signal.signal(signum, lambda s, frame: came.append(s))
    try:
        from probes.run import cli
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    if came:
        print(f"kvprobe: interrupted ({signal.Signals(came[0]).name}) while starting", file=sys.stderr)
        return 128 + came[0]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
