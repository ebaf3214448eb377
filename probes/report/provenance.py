"""Which code made a run: kvref's version, where it was loaded from (a
source tree, with its commit, or an installed copy) and the Python. The
same command tests different code by folder; `--version` and a run's
summary.json say which."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def which_code() -> str:
    try:
        number = version("kvref")
    except PackageNotFoundError:  # run from a source tree that was never installed
        number = "(not installed)"
    where = Path(__file__).resolve().parents[2]
    if (where / ".git").exists():
        try:
            commit = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty"], capture_output=True,
                                    text=True, timeout=10).stdout.strip() or "commit unknown"
        except (OSError, subprocess.SubprocessError):
            commit = "commit unknown"
        code = f"the source tree {where} at {commit}"
    else:
        code = f"installed at {where}"
    return f"{number}, {code}; Python {sys.version.split()[0]} ({sys.executable})"
