"""One `kvprobe` command as its module declares it: its name, its help,
the arguments it takes and what it runs (pytest's way: each module adds
its own options). `probes.run.cli` builds the parser from the table of
them. A command's module keeps its heavy imports inside `run`, so that
building the parser costs no more than the arguments do."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

PIPED_WIDTH = 240  # a log or a file is no 80-column terminal: a table is never wrapped mid-token into one


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit code

    def add_to(self, subparsers) -> None:
        parser = subparsers.add_parser(self.name, help=self.help)
        self.arguments(parser)
        parser.set_defaults(run=self.run)


def stdout_console():
    """Where a command prints its tables: the terminal's width on a terminal;
    piped, PIPED_WIDTH (or COLUMNS, where the user set it)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal or "COLUMNS" in os.environ else Console(width=PIPED_WIDTH)
