"""How the two workers of a two-process probe (a producer and a consumer,
each with its own caches and manager) tell each other what the other needs:
JSON values posted as files in a folder both were given, each written whole
before it appears. No socket: the only connections between the workers are
the managers' own."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

POLL_SECONDS = 0.005
DONE = "done"  # what a side posts when its probe returns, whatever it returned

PRODUCER, CONSUMER = "producer", "consumer"
ROLES = (PRODUCER, CONSUMER)


class PeerSilent(TimeoutError):
    """The other worker did not post what this one waited for in time."""


def posted_by(folder, role: str, name: str) -> bool:
    """Whether `role` has posted `name` in `folder` (the runner asks too)."""
    return _path(folder, role, name).exists()


def _path(folder, role: str, name: str) -> Path:
    return Path(folder) / f"{role}.{name}.json"


class Rendezvous:
    def __init__(self, folder: str, role: str):
        if role not in ROLES:
            raise ValueError(f"role {role!r}; expected one of {ROLES}")
        self.folder, self.role = Path(folder), role

    @property
    def peer(self) -> str:
        return CONSUMER if self.role == PRODUCER else PRODUCER

    def post(self, name: str, value=None) -> None:
        path = _path(self.folder, self.role, name)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(value))
        os.replace(partial, path)

    def wait(self, name: str, seconds: float):
        """What the other worker posted as `name`, waiting at most `seconds`,
        or until it is done without posting it."""
        return json.loads(_path(self.folder, self.peer, self.first(name, seconds=seconds)).read_text())

    def first(self, *names: str, seconds: float) -> str:
        """The first of `names` the other worker posts, waiting at most `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            done = self.posted(DONE)  # first: what it posted before it was done is then all seen below
            for name in names:
                if self.posted(name):
                    return name
            if done:
                raise PeerSilent(f"the {self.peer} finished its side without posting {' or '.join(names)}")
            if time.monotonic() > deadline:
                raise PeerSilent(f"the {self.peer} did not post {' or '.join(names)} within {seconds:.0f}s")
            time.sleep(POLL_SECONDS)

    def posted(self, name: str) -> bool:
        """Whether the other worker has posted `name`."""
        return posted_by(self.folder, self.peer, name)
