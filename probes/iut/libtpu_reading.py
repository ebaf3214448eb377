"""What the real libtpu makes of a TPU runtime's environment, read without a chip.

libtpu 0.0.52 turns its environment into its driver's flags before it looks
for a device, and at its lowest log level says each (`argv[12]:
'--deepsea_host_bounds=1,1,1'`); what it cannot use it logs as an error
(`E... INVALID_ARGUMENT: Error: unexpected worker hostname ...`). Started
with TPU_SKIP_MDS_QUERY (it asks no metadata server then), in a network
namespace with only lo, it gets that far on any machine and stops at "No
jellyfish device found" (or at a chip configuration of "jellyfish", the
version it assumes without hardware). A TPU type it parses gives its slice's
wrap, host bounds or chip configuration (`--deepsea_wrap`,
`--deepsea_host_bounds`, `--deepsea_chip_config_name`); one it does not
gives none, and it says "Failed to find host bounds for accelerator type:
v7x-2"."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SKIP_METADATA = "TPU_SKIP_MDS_QUERY"
MULTIPLE_LOADS = "ALLOW_MULTIPLE_LIBTPU_LOAD"  # libtpu's bypass of its lockfile
# A machine's own TPU device nodes: where they are, libtpu would open its chips, not stop short of them.
TPU_NODES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
FLAG = re.compile(r"argv\[\d+\]: '--([a-z_]+)=(.*)'$")
ERROR = re.compile(r"^([EF]\d{4} |Failed |Error)")  # its log's errors, and what it prints bare
NO_CHIP = "jellyfish"  # the version it assumes without hardware: what follows from that is no finding
STOPPED = "Unable to initialize backend 'tpu'"
TYPE_FLAGS = ("deepsea_wrap", "deepsea_host_bounds", "deepsea_chip_config_name")
START = "import jax\ntry:\n    jax.devices('tpu')\nexcept Exception as e:\n    print(e)\n"
SECONDS = 120.0


@dataclass(frozen=True)
class LibtpuReading:
    flags: dict[str, str]  # the driver's flags it derived, without the leading dashes
    errors: tuple[str, ...]  # what it logged as an error about them (its stop for want of a chip aside)

    @property
    def knows_the_type(self) -> bool:
        """Whether it parsed TPU_ACCELERATOR_TYPE into a slice (any of TYPE_FLAGS)."""
        return any(flag in self.flags for flag in TYPE_FLAGS)

    def to_json(self) -> str:
        return json.dumps({"flags": self.flags, "errors": list(self.errors)})


def runtime_variables(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` the runtime reads (TPU_*), which decide what it makes of them."""
    return {k: v for k, v in env.items() if k.startswith("TPU_") and k not in ("TPU_LOG_DIR",)}


def only_loopback() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def read(env: dict[str, str], python: str) -> tuple[LibtpuReading | None, str]:
    """(what the libtpu of `python` makes of the runtime variables of `env`,
    ""), or (None, why it could not be read here)."""
    variables = runtime_variables(env)
    if not variables.get(SKIP_METADATA):
        return None, f"without {SKIP_METADATA} libtpu would ask the metadata server"
    if nodes := [n for pattern in TPU_NODES for n in glob.glob(pattern)]:
        return None, f"this machine has TPU device nodes ({', '.join(nodes[:3])}): libtpu would open its chips"
    prefix = []
    if not only_loopback():
        if not (unshare := shutil.which("unshare")):
            return None, "no `unshare` to start libtpu in a loopback-only namespace"
        prefix = [unshare, "-rn"]
    with tempfile.TemporaryDirectory(prefix="libtpu-reading-") as logs:
        started = {**variables, "PATH": "/usr/bin:/bin", "HOME": logs, "TPU_LOG_DIR": logs, "JAX_PLATFORMS": "tpu",
                   "TPU_STDERR_LOG_LEVEL": "0", "TPU_MIN_LOG_LEVEL": "0", MULTIPLE_LOADS: "true"}
        try:
            done = subprocess.run([*prefix, python, "-c", START], env=started, capture_output=True, text=True,
                                  timeout=SECONDS)
        except subprocess.TimeoutExpired:
            return None, f"libtpu did not stop within {SECONDS:.0f} s"
        except OSError as e:
            return None, f"libtpu could not be started: {e}"
    lines = done.stderr.splitlines()
    tail = " ".join((done.stderr or done.stdout).split())[-300:]
    if prefix and done.returncode and done.stderr.startswith("unshare:"):
        return None, f"`unshare -rn` was refused: {tail}"
    if done.returncode or STOPPED not in done.stdout:
        return None, f"libtpu did not get as far as looking for its device: {tail}"
    flags = dict(m.groups() for line in lines if (m := FLAG.search(line)))
    if not flags:  # jax says the same when there is no libtpu to load
        return None, f"libtpu said none of its driver's flags (not installed in {python}, or not loaded): {tail}"
    errors = tuple(line for line in lines if ERROR.match(line) and NO_CHIP not in line)
    return LibtpuReading(flags, errors), ""


def read_once(env: dict[str, str], python: str, folder: Path) -> tuple[LibtpuReading | None, str]:
    """read(), kept in `folder` by the interpreter and the variables read, so
    that the many workers of one run started alike pay for it once (one
    reads while the others wait for it)."""
    asked = json.dumps([python, sorted(runtime_variables(env).items())])
    kept = folder / f"libtpu-reading-{hashlib.sha256(asked.encode()).hexdigest()[:16]}.json"
    with open(kept.with_suffix(".lock"), "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # released when the file closes; a reading is bounded by SECONDS
        if kept.exists():
            fields = json.loads(kept.read_text())
            return LibtpuReading(fields["flags"], tuple(fields["errors"])), ""
        reading, why = read(env, python)
        if reading is not None:
            kept.write_text(reading.to_json())
        return reading, why
