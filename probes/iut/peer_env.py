"""Peer environments: an interpreter of their own with a pinned library or
framework that cannot share `.venv`, in which workers probing it run.
`kvprobe peer-env --lib jax|torch|xla` creates and checks one.

- jax: tpu-sync-jax (Python 3.12), which runs on JAX CPU arrays, so it is
  probed on any machine.
- torch: tpu-sync-torch with torch and TorchTPU (torch_tpu), Python 3.12.
  TorchTPU has no CPU device, so this one is only useful on a TPU VM.
- xla: torch_xla with its torch (Python 3.11), for kvref over real lazy
  tensors on the XLA CPU device. PyPI's torch 2.9.0 is the CUDA build (its CPU
  library links libcudart), so this one downloads about 3 GB of nvidia wheels
  and takes about 7 GB; it runs without a GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SYNC_VERSION = "0.0.1rc20261023185136"
# An unrelated package holds the old name on PyPI: it must never be installed.
FORBIDDEN_PREFIXES = ("tpu-raiden", "tpu_raiden")
REPO = Path(__file__).resolve().parents[2]
# How to get the Python the project and its peer environments need where the image has none.
GET_PYTHON = ("sudo add-apt-repository -y ppa:deadsnakes/ppa && sudo apt-get install -y python3.12 "
              "python3.12-venv python3.12-dev")
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "nanobind>=2.4"]

CHECK_SCRIPT = """
import json, sys
from importlib import metadata
print(json.dumps({"python": list(sys.version_info[:3]),
                  "dists": {d.metadata["Name"]: d.version for d in metadata.distributions()}}))
"""


class PeerEnvError(RuntimeError):
    pass


@dataclass(frozen=True)
class PeerEnv:
    name: str
    venv: Path
    pins: dict[str, str]  # distribution -> exact version; the library under test first
    python_variable: str = ""  # an environment variable naming an existing interpreter instead
    report: tuple[str, ...] = ()  # unpinned distributions whose versions `verify` reports
    python_version: str = "3.12"  # the interpreter it is made with (this minor version)
    requirements: tuple[str, ...] = ()  # installed besides the pins (pip requirements or paths)
    # Distributions installed exactly and without their dependencies into a
    # folder of their own (beside_dir), on sys.path only for the processes
    # that ask for it: a serving stack whose pieces run beside stand-ins.
    beside: tuple[tuple[str, str], ...] = ()

    @property
    def beside_dir(self) -> Path:
        return self.venv / "beside"

    @property
    def library(self) -> str:
        return next(iter(self.pins))

    @property
    def version(self) -> str:
        return self.pins[self.library]

    def python(self) -> Path | None:
        """The interpreter ($<python_variable> or the venv's), if it exists."""
        chosen = os.environ.get(self.python_variable) if self.python_variable else None
        path = Path(chosen or self.venv / "bin" / "python")
        return path if path.exists() else None

    def missing(self) -> str:
        create = f"--lib {self.name}" if PEER_ENVS.get(self.name) == self else "--iut IUT"
        also = f" or set {self.python_variable}" if self.python_variable else ""
        return (f"the {self.name} peer environment ({self.library}) is not installed at "
                f"{self.venv}: run `kvprobe peer-env {create}`{also}")


# The jax peer environment's JAX, exactly (tpu-sync-jax asks for >= 0.11), and
# the libtpu the shipped layout table was compiled with, so the hardware
# workers' compiler is the one the predictions were read from.
PEER_JAX = "0.12.0.1"


def table_libtpu() -> str:
    from kvref.oracle import table

    return table.load()["versions"]["libtpu"]


PEER_ENVS = {
    # Beside it, tpu-inference's connectors and the small packages they and its
    # runner/kv_cache.py import (tests/connectors drives them over stand-ins for vllm).
    "jax": PeerEnv("jax", REPO / ".venv-peer", {"tpu-sync-jax": SYNC_VERSION, "jax": PEER_JAX, "jaxlib": PEER_JAX,
                                                "libtpu": table_libtpu()}, "KVPROBE_PEER_PYTHON",
                   beside=(("tpu-inference", "0.32.0"), ("prometheus-client", "0.26.0"), ("sympy", "1.14.0"),
                           ("mpmath", "1.3.0"))),
    # torch 2.13.0 is one of the ABIs tpu-sync-torch ships an extension for and
    # inside the range TorchTPU 0.2.0 accepts.
    "torch": PeerEnv("torch", REPO / ".venv-peer-torch",
                     {"tpu-sync-torch": SYNC_VERSION, "torch": "2.13.0", "torch-tpu": "0.2.0"},
                     "KVPROBE_PEER_TORCH_PYTHON", report=("libtpu",)),
    # torch-xla 2.9.0 pins torch 2.9.0; both have cp311 wheels on PyPI.
    "xla": PeerEnv("xla", REPO / ".venv-xla", {"torch-xla": "2.9.0", "torch": "2.9.0"},
                   "KVPROBE_XLA_PYTHON", python_version="3.11"),
}


def peer_env(name: str) -> PeerEnv:
    if name not in PEER_ENVS:
        raise ValueError(f"unknown peer environment {name!r}; expected one of {sorted(PEER_ENVS)}")
    return PEER_ENVS[name]


def declared_env(interpreter) -> PeerEnv | None:
    """The environment an IUT's `interpreter` names, if it names one."""
    if isinstance(interpreter, PeerEnv):
        return interpreter
    if interpreter == "main" or os.sep in str(interpreter):
        return None
    return peer_env(interpreter)


def interpreter_python(interpreter) -> tuple[str | None, str]:
    """(the Python an IUT's workers run in, or None; why it is missing). An
    IUT's interpreter is "main" (kvprobe's own), a peer environment's name, a
    path to a Python, or a PeerEnv of its own (`kvprobe peer-env --iut`)."""
    if interpreter == "main":
        return sys.executable, ""
    env = declared_env(interpreter)
    if env is None:
        path = Path(interpreter)
        return (str(path), "") if path.exists() else (None, f"its interpreter {path} does not exist")
    python = env.python()
    return (str(python), "") if python else (None, env.missing())


def base_python(version: str = "3.12") -> list[str]:
    """A Python `version` to make the venv with: pyenv's, or python<version>
    on PATH (tried, since a pyenv shim can stand on PATH without a version
    behind it)."""
    candidates = []
    if shutil.which("pyenv"):
        versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout
        candidates += [["env", f"PYENV_VERSION={v}", "pyenv", "exec", "python"]
                       for v in sorted(versions.split(), reverse=True) if v.startswith(version + ".")]
    if shutil.which(f"python{version}"):
        candidates.append([f"python{version}"])
    wanted = tuple(int(part) for part in version.split("."))
    for cmd in candidates:
        done = subprocess.run([*cmd, "-c", f"import sys; print(sys.version_info[:2] == {wanted})"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == "True":
            return cmd
    raise PeerEnvError(f"this environment needs Python {version}, and neither a pyenv {version} nor "
                       f"a working python{version} was found; on Ubuntu (a TPU VM's image): {GET_PYTHON}")


def create(env: PeerEnv) -> dict:
    if not (env.venv / "bin" / "python").exists():
        _run([*base_python(env.python_version), "-m", "venv", str(env.venv)])
    python = str(env.venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    pins = [f"{dist}=={version}" for dist, version in env.pins.items()]
    _run([python, "-m", "pip", "install", "-q", *pins, *env.requirements, *BUILD_REQUIREMENTS])
    if env.beside:
        _run([python, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(env.beside_dir),
              *(f"{dist}=={version}" for dist, version in env.beside)])
    # Its own build directory: the extension is built against this interpreter's nanobind.
    _run([python, "-m", "pip", "install", "-q", "--no-build-isolation", "-e", str(REPO),
          f"--config-settings=build-dir=build/{env.name}-{{wheel_tag}}"])
    return verify(env, Path(python))


def verify(env: PeerEnv, python: Path) -> dict:
    """The pinned and reported versions, after checking the pins and the forbidden names."""
    done = subprocess.run([str(python), "-c", CHECK_SCRIPT], capture_output=True, text=True)
    if done.returncode:
        raise PeerEnvError(f"{python} does not run: {done.stderr.strip()[-500:]}")
    found = json.loads(done.stdout)
    dists = check_dists(env, found["dists"], tuple(found["python"]))
    return {"python": ".".join(map(str, found["python"])), **env.pins,
            **{d: dists.get(d, "") for d in env.report}}


def check_dists(env: PeerEnv, installed: dict[str, str], python_version: tuple) -> dict[str, str]:
    """Installed distributions (normalized names) if every pin holds and no
    forbidden name is present; PeerEnvError naming the problem otherwise."""
    dists = {normal_name(name): version for name, version in installed.items()}
    bad = forbidden(dists)
    if bad:
        raise PeerEnvError(f"{bad} installed: that name belongs to an unrelated package; remove "
                           "the environment and recreate it")
    for dist, version in env.pins.items():
        # A local build tag (torch's "+cpu") is the same release.
        if dists.get(normal_name(dist), "").split("+")[0] != version:
            raise PeerEnvError(f"{dist} {dists.get(normal_name(dist))} installed, expected {version}; "
                               f"run `kvprobe peer-env --lib {env.name}`")
    wanted = tuple(int(part) for part in env.python_version.split("."))
    if tuple(python_version[:2]) != wanted:
        raise PeerEnvError(f"Python {'.'.join(map(str, python_version))}: the {env.name} environment "
                           f"is made with Python {env.python_version}")
    return dists


def normal_name(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503): tpu_sync.JAX -> tpu-sync-jax."""
    return re.sub(r"[-_.]+", "-", name).lower()


def forbidden(names) -> list[str]:
    """The names among `names` (normalized) that belong to the unrelated package."""
    prefixes = tuple(normal_name(p) for p in FORBIDDEN_PREFIXES)
    return sorted(n for n in names if n.startswith(prefixes))


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd)
    if done.returncode:
        raise PeerEnvError(f"command failed ({done.returncode}): {' '.join(cmd)}")
