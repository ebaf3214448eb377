"""How a worker of an IUT is started, asked of the IUT value: the Python it
runs in, the environment every process of it gets, whether its build is
installed, and each side's environment in a two-process case. The runner
asks these and knows nothing of the parts behind them (peer environments,
builds, the TPU runtime's variables)."""

from __future__ import annotations

import os

from probes.iut.adapter import IUT
from probes.iut.builds import BUILDS_DIR, build_dir, installed_version
from probes.iut.hardware import device_env, device_only_standin, one_chip_environment
from probes.iut.peer_env import interpreter_python
from probes.iut.tpu_sync import BUILD_VARIABLE


def python_of(declared: IUT) -> tuple[str | None, str]:
    """(the Python its workers run in, or None; why it is missing)."""
    return interpreter_python(declared.interpreter)


def build_missing(declared: IUT) -> str:
    """Why its build cannot run ("" when it has none, or it is installed)."""
    if not declared.build:
        return ""
    library = declared.library.distribution
    if installed_version(build_dir(library, declared.build), library) == declared.build:
        return ""
    return f"the build is not installed ({BUILDS_DIR}); `kvprobe run` installs it first"


ENVIRON_READS = 100  # tries at a copy of os.environ that no other thread changed midway


def environ_now() -> dict:
    """A copy of os.environ. pytest sets and unsets PYTEST_CURRENT_TEST from
    its main thread while the plugin prepares cases on others, and a copy
    lists the keys before it reads each: a key gone in between is a
    KeyError, so the copy is read again."""
    for _ in range(ENVIRON_READS - 1):
        try:
            return dict(os.environ)
        except KeyError:
            continue
    return dict(os.environ)


def environment(declared: IUT) -> dict:
    """The environment every process of this IUT runs with (its workers, and
    `kvprobe iuts` asking whether it can start). One that owns the TPU is
    given what its TPU runtime needs (probes.iut.hardware.device_env);
    TpuUnavailable where that cannot be read."""
    env = device_env(environ_now()) if declared.owns_device else environ_now()
    env.update(declared.environment)
    if declared.build:  # the build first on the path, over the pinned library, sharing its jax
        path = str(build_dir(declared.library.distribution, declared.build))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
        env[BUILD_VARIABLE] = path
    platforms = declared.jax_platforms
    if platforms:
        env.setdefault("JAX_PLATFORMS", platforms)
    else:  # a worker on the real device must see it, whatever the parent runs on
        env.pop("JAX_PLATFORMS", None)
    env.pop("KVREF_FAULTS", None)  # a case's faults travel in the case itself
    # pytest names the running test here, a new value per item: it is no IUT's
    # setting, and as part of a zygote's key it would start a zygote per item.
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def side_environments(declared: IUT, env: dict, sides: int) -> list[dict]:
    """Each side's environment in a case of `sides` processes, from `env`
    (environment's): the same for all, but on a TPU, where each holds one
    chip of the host of its own (hardware.one_chip_environment);
    TpuUnavailable where the host has too few."""
    if not declared.owns_device or device_only_standin():
        return [env] * sides
    return [one_chip_environment(env, index) for index in range(sides)]
