"""One `kvprobe` command as its module declares it: its name, its help,
the arguments it takes and what it runs (pytest's way: each module adds
its own options). `probes.run.cli` builds the parser from the table of
them. A command's module keeps its heavy imports inside `run`, so that
building the parser costs no more than the arguments do."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


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
