"""Result and report files written whole or not at all.

A run whose `--out` fills up, or that is killed, mid-write must not leave a
torn CSV that a later `kvprobe report` reads as a whole run: each file is
written into a temporary beside it, then renamed over it (a rename within
one folder is atomic), so a reader sees the old file, or none, or the new
one whole."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, TextIO


def write_whole(path: Path, write: Callable[[TextIO], object]) -> Path:
    """`write(f)` into a temporary file beside `path`, renamed to `path` once it
    is complete; on any failure the temporary goes and `path` is as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            write(f)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def write_text_whole(path: Path, text: str) -> Path:
    return write_whole(path, lambda f: f.write(text))
