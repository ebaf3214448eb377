"""Builds of a production library beyond its pinned one: `--iut
tpu-sync-jax==VERSION` probes that build. Each is installed on demand, with
`pip install --no-deps --target`, into a cache beside the peer environment,
whose jax it shares (its workers put the build first on PYTHONPATH). An
install is checked to hold exactly the distribution and version asked for,
and never a name that belongs to an unrelated package."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

from probes.iut.peer_env import REPO, PeerEnvError, forbidden, normal_name, peer_env

BUILDS_DIR = REPO / ".venv-peer-builds"
LIBRARIES = {"tpu-sync-jax": "jax"}  # a library with builds -> its peer environment
INSTALL_SECONDS = 900


class BuildUnavailable(RuntimeError):
    """A build could not be installed: the reason says why (registry, version)."""


def split(name: str) -> tuple[str, str | None]:
    """'tpu-sync-jax==0.0.1.dev1' -> ('tpu-sync-jax', '0.0.1.dev1'); a bare name -> (name, None)."""
    base, sep, version = name.partition("==")
    if not sep:
        return name, None
    try:
        Version(version)
    except InvalidVersion:
        raise ValueError(f"{name!r}: {version!r} is not a version; expected NAME==VERSION, e.g. "
                         "tpu-sync-jax==0.0.1.dev20261027082629") from None
    return base, version


def build_dir(library: str, version: str) -> Path:
    return BUILDS_DIR / library / version


def installed_version(path: Path, library: str) -> str | None:
    """The version of `library` installed under `path`, if any."""
    found = [d.version for d in metadata.distributions(path=[str(path)])
             if normal_name(d.metadata["Name"]) == normal_name(library)]
    return found[0] if len(found) == 1 else None


def ensure(library: str, version: str) -> Path:
    """The build's directory, installing it first if needed."""
    if library not in LIBRARIES:
        raise ValueError(f"{library} has no builds to choose; builds exist for {', '.join(LIBRARIES)}")
    target = build_dir(library, version)
    if installed_version(target, library) == version:
        return target
    python = peer_env(LIBRARIES[library]).python()
    if python is None:
        raise BuildUnavailable(peer_env(LIBRARIES[library]).missing())
    tmp = Path(tempfile.mkdtemp(dir=_parent(target), prefix=".installing-"))
    try:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                               f"{library}=={version}"], capture_output=True, text=True,
                              timeout=INSTALL_SECONDS)
        if done.returncode:
            raise BuildUnavailable(f"{library}=={version} could not be installed: "
                                   f"{_last_lines(done.stderr or done.stdout)}")
        check(tmp, library, version)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)  # whole, or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def check(path: Path, library: str, version: str) -> None:
    names = {normal_name(d.metadata["Name"]): d.version for d in metadata.distributions(path=[str(path)])}
    bad = forbidden(names)
    if bad:
        raise PeerEnvError(f"{bad} came with {library}=={version}: that name belongs to an unrelated package")
    if names != {normal_name(library): version}:
        raise PeerEnvError(f"installing {library}=={version} gave {names}; expected exactly that build")


def published(library: str) -> list[str]:
    """Every version of `library` the registry offers, oldest first."""
    python = peer_env(LIBRARIES[library]).python()
    if python is None:
        raise BuildUnavailable(peer_env(LIBRARIES[library]).missing())
    done = subprocess.run([str(python), "-m", "pip", "index", "versions", "--pre", "--json", library],
                          capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise BuildUnavailable(f"the registry did not list {library}: {_last_lines(done.stderr)}")
    return in_build_order(json.loads(done.stdout)["versions"])


def in_build_order(versions: list[str]) -> list[str]:
    """Oldest first: by the build stamp a nightly or release candidate carries
    (0.0.1.dev20261027082629, 0.0.1rc20261023185136), which PEP 440 order
    does not follow (every dev sorts before every rc); by version otherwise."""
    stamps = [re.search(r"(\d{14})", v) for v in versions]
    if all(stamps):
        return [v for _, v in sorted(zip((m.group(1) for m in stamps), versions))]
    return sorted(versions, key=Version)


def _parent(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent


def _last_lines(text: str) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
