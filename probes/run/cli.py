"""The `kvprobe` command."""

from __future__ import annotations

import argparse
import sys

from probes.run import (bisect, diff_command, doctor, explain_command, fuzz_command, generations_command,
                        iuts_command, model_command, peer_env_command, run_command)


# Every command, in the order `kvprobe --help` lists them; each declared by its own module.
COMMANDS = (explain_command.COMMAND, run_command.RUN, run_command.REPORT, peer_env_command.COMMAND,
            fuzz_command.COMMAND, generations_command.COMMAND, run_command.QUALIFY, bisect.COMMAND,
            doctor.COMMAND, iuts_command.COMMAND, model_command.COMMAND, diff_command.COMMAND)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvprobe", description=(
        "Qualify KV-cache block offload against TPU layouts."))
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_to(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"kvprobe: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's code for SIGINT
        finished = getattr(e, "finished", None)
        kept = "" if finished is None else \
            f"; {len(finished)} finished cases kept as run {getattr(e, 'run_id', '(unwritten)')}" if finished \
            else "; no case had finished"
        print(f"kvprobe: interrupted{kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
