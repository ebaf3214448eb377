"""The verdict channel: how a worker tells the runner what it runs on, that
its probe started, and its result. It is a pipe of its own, not stdout or
stderr, which the IUT's code shares with the worker: whatever an IUT prints,
at import, in the probe or at exit, or a process it forks writes there, is
output, never a verdict.

Each message is a JSON line carrying a token the runner made for this case
and handed to the worker before any IUT code ran (on stdin, or in the
zygote's request); a line without it is counted as forged. A result stands
only if exactly one came (probes.run.runner.classify): a second one, or a
forged line, means something besides the worker wrote to the channel, and the
case is an ERROR saying so.

Trust model: the IUT runs in the worker's own process, so code that sets
out to read the worker's memory could find the token; what the channel
stops is an IUT's output, its forks and its exit handlers changing a verdict.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field

FD_VARIABLE = "KVPROBE_CHANNEL_FD"  # a fresh worker's channel: the fd it inherited
DESCRIBED, PHASE, RESULT = "described", "phase", "result"  # what a message says


def new_token() -> str:
    return secrets.token_hex(16)


class Channel:
    """The worker's end: one fd, written with this case's token."""

    def __init__(self, fd: int, token: str):
        self.fd, self.token = fd, token
        os.set_inheritable(fd, False)  # a program the IUT starts does not get it

    @classmethod
    def inherited(cls, token: str) -> "Channel":
        """A fresh worker's channel, named by FD_VARIABLE (taken out of the
        environment before any IUT code runs)."""
        return cls(int(os.environ.pop(FD_VARIABLE)), token)

    def say(self, kind: str, payload=None) -> None:
        data = (json.dumps({"token": self.token, "kind": kind, "payload": payload}) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def close(self) -> None:
        """After the result: nothing else of this worker says anything."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


@dataclass
class Heard:
    """What came over one case's channel."""

    messages: list[dict] = field(default_factory=list)  # with the right token, in order
    forged: int = 0  # lines without it

    @classmethod
    def parse(cls, data: bytes | str, token: str) -> "Heard":
        heard = cls()
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        for line in text.splitlines():
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):  # any line a worker can write: never the run's end
                message = None
            if isinstance(message, dict) and message.get("token") == token:
                heard.messages.append(message)
            elif line.strip():
                heard.forged += 1
        return heard

    def payloads(self, kind: str) -> list:
        return [m.get("payload") for m in self.messages if m.get("kind") == kind]

    @property
    def probe_started(self) -> bool:
        return bool(self.payloads(PHASE))

    def tampered(self) -> str:
        """Why the channel cannot be believed ("" when it can)."""
        results = len(self.payloads(RESULT))
        if self.forged:
            return f"{self.forged} line(s) without this case's token came over the verdict channel"
        if results > 1:
            return f"{results} results came over the verdict channel, where the worker writes one"
        return ""
