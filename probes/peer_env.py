"""The peer environment: Python 3.12 with the production library, pinned, in
which workers probing it run. `kvprobe peer-env` creates and checks it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PEER_DIST = "tpu-sync-jax"
PEER_VERSION = "0.0.1rc20261023185136"
# An unrelated package holds the old name on PyPI: it must never be installed.
FORBIDDEN_PREFIXES = ("tpu-raiden", "tpu_raiden")
REPO = Path(__file__).resolve().parent.parent
PEER_VENV = REPO / ".venv-peer"
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "nanobind>=2.4"]

CHECK_SCRIPT = """
import json, sys
from importlib import metadata
print(json.dumps({"python": list(sys.version_info[:3]),
                  "dists": {d.metadata["Name"]: d.version for d in metadata.distributions()}}))
"""


class PeerEnvError(RuntimeError):
    pass


def peer_python() -> Path | None:
    """The peer interpreter ($KVPROBE_PEER_PYTHON or .venv-peer), if it exists."""
    path = Path(os.environ.get("KVPROBE_PEER_PYTHON") or PEER_VENV / "bin" / "python")
    return path if path.exists() else None


def base_python() -> list[str]:
    """A Python 3.12 to make the venv with: pyenv's 3.12, or python3.12 on PATH
    (tried, since a pyenv shim can stand on PATH without a version behind it)."""
    candidates = []
    if shutil.which("pyenv"):
        versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout
        candidates += [["env", f"PYENV_VERSION={v}", "pyenv", "exec", "python"]
                       for v in sorted(versions.split(), reverse=True) if v.startswith("3.12")]
    if shutil.which("python3.12"):
        candidates.append(["python3.12"])
    for cmd in candidates:
        done = subprocess.run([*cmd, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == "True":
            return cmd
    raise PeerEnvError(f"{PEER_DIST} needs Python 3.12, and neither a pyenv 3.12 nor a working "
                       "python3.12 was found")


def create(venv: Path = PEER_VENV) -> dict:
    if not (venv / "bin" / "python").exists():
        _run([*base_python(), "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    _run([python, "-m", "pip", "install", "-q", f"{PEER_DIST}=={PEER_VERSION}", *BUILD_REQUIREMENTS])
    _run([python, "-m", "pip", "install", "-q", "--no-build-isolation", "-e", str(REPO)])
    return verify(Path(python))


def verify(python: Path) -> dict:
    """The installed distributions, after checking the pin and the forbidden names."""
    done = subprocess.run([str(python), "-c", CHECK_SCRIPT], capture_output=True, text=True)
    if done.returncode:
        raise PeerEnvError(f"{python} does not run: {done.stderr.strip()[-500:]}")
    found = json.loads(done.stdout)
    dists = check_dists(found["dists"], tuple(found["python"]))
    return {"python": ".".join(map(str, found["python"])), PEER_DIST: PEER_VERSION,
            "jax": dists.get("jax", "")}


def check_dists(installed: dict[str, str], python_version: tuple) -> dict[str, str]:
    """Installed distributions (normalized names) if the pin holds and no
    forbidden name is present; PeerEnvError naming the problem otherwise."""
    dists = {_normal(name): version for name, version in installed.items()}
    bad = sorted(n for n in dists if n.startswith(tuple(_normal(p) for p in FORBIDDEN_PREFIXES)))
    if bad:
        raise PeerEnvError(f"{bad} installed: that name belongs to an unrelated package; remove "
                           "the environment and recreate it")
    if dists.get(_normal(PEER_DIST)) != PEER_VERSION:
        raise PeerEnvError(f"{PEER_DIST} {dists.get(_normal(PEER_DIST))} installed, expected "
                           f"{PEER_VERSION}; run `kvprobe peer-env`")
    if tuple(python_version[:2]) < (3, 12):
        raise PeerEnvError(f"Python {'.'.join(map(str, python_version))}: {PEER_DIST} needs 3.12 or newer")
    return dists


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd)
    if done.returncode:
        raise PeerEnvError(f"command failed ({done.returncode}): {' '.join(cmd)}")
