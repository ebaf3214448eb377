"""`kvprobe diff`: what changed between two run CSVs (probes.report.diff)."""

from __future__ import annotations

import argparse
from pathlib import Path

from probes.run.subcommand import Command


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)


def run(args) -> int:
    """0 when the runs agree, 1 with a table of what differs."""
    from probes.report import diff, results

    for path in (args.a, args.b):
        if not path.exists():
            raise ValueError(f"no such run file: {path}")
    changes = diff.diff_runs(*(_read(results, path) for path in (args.a, args.b)))
    if changes.empty:
        print("no differences")
        return 0
    print(changes.to_markdown(index=False))
    return 1


def _read(results, path: Path):
    """A run CSV, or a one-line refusal saying why it is not one."""
    frame = results.read_run(path)
    if frame.empty:
        raise ValueError(f"{path} holds no cases (a header alone): nothing to compare")
    return frame


COMMAND = Command("diff", "what changed between two run CSVs", arguments, run)
