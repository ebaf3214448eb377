"""The `kvprobe` command: its parser (the table of every command), its exit codes, and how it ends on a signal."""

from __future__ import annotations

import argparse
import difflib
import re
import signal
import sys
import traceback
from probes.report.provenance import which_code
from probes.run import (bisect, coverage_command, diff_command, doctor, explain_command, fuzz_command,
                        generations_command, iuts_command, model_command, options, peer_env_command, run_command)


# Every command, in the order `kvprobe --help` lists them; each declared by its own module.
COMMANDS = (explain_command.COMMAND, run_command.RUN, run_command.REPORT, peer_env_command.COMMAND,
            fuzz_command.COMMAND, generations_command.COMMAND, run_command.QUALIFY, bisect.COMMAND,
            doctor.COMMAND, iuts_command.COMMAND, model_command.COMMAND, coverage_command.COMMAND,
            diff_command.COMMAND)


EXIT_CODES = """exit codes (each command):
  0    done, and every result agrees with its prediction (fuzz, diff, doctor: nothing found)
  1    done, and something disagrees or was found (run, qualify: a case whose verdict the
       prediction does not admit; fuzz: a finding; diff: a difference; doctor: a problem)
  2    a usage error or bad input: nothing was run
  3    an internal error of kvprobe itself
  128+N  stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP); a run keeps its finished cases"""
OK, FOUND, USAGE, INTERNAL = 0, 1, 2, 3
STOPPING = (signal.SIGTERM, signal.SIGHUP)  # what a CI cancel, `timeout` and a closed terminal send


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake said in one line (and where to look), exit code 2."""

    def error(self, message: str):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), 1) if choice else []
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(f"{self.prog}: error: {message}{hint} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvprobe", description="Qualify KV-cache block offload against TPU layouts.",
                    epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvprobe {which_code()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_to(sub)
    return parser


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled as Ctrl-C is: the run keeps what finished."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


def main(argv=None) -> int:
    for signum in STOPPING:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # started under nohup: a closed terminal must not stop the run
        signal.signal(signum, _stop)
    try:
        args = build_parser().parse_args(argv)
        options.check_given(vars(args))
        return args.run(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"kvprobe: error: {e}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: one line, the shell's code for the signal
        signum = getattr(e, "signum", signal.SIGINT)
        finished = getattr(e, "finished", None)
        kept = "" if finished is None else \
            f"; {len(finished)} finished cases kept as run {getattr(e, 'run_id', '(unwritten)')}" if finished \
            else "; no case had finished"
        print(f"kvprobe: interrupted ({signal.Signals(signum).name}){kept}", file=sys.stderr)
        return 128 + signum
    except Exception:  # kvprobe's own failure: said as such, with its traceback
        print(f"kvprobe: internal error (exit {INTERNAL}); please report it with this traceback:", file=sys.stderr)
        traceback.print_exc()
        return INTERNAL


if __name__ == "__main__":
    sys.exit(main())
