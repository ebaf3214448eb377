"""A stand-in TPU VM for a test (probes.iut.standin_vm): its folder, its
metadata server on loopback, and the environment a process on it runs
with. The harness's commands are run on it as a user runs them on a TPU VM."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from probes.iut import standin_vm
from probes.iut.hardware import STANDIN_VARIABLE

REPO = Path(__file__).resolve().parents[1]
REHEARSAL_MATRIX = REPO / "tests" / "matrices" / "rehearsal.csv"
# What the test's own process set that a fresh shell on a TPU VM would not have.
# What this test process (and the libtpu its jax or kvref's compiler loaded) set, which no shell on a VM has:
# ALLOW_MULTIPLE_LIBTPU_LOAD is libtpu's bypass of its lockfile, a user's choice.
NOT_ON_A_VM = ("JAX_PLATFORMS", STANDIN_VARIABLE, "XLA_FLAGS", "TPU_SKIP_MDS_QUERY", "PYTEST_CURRENT_TEST",
               "ALLOW_MULTIPLE_LIBTPU_LOAD")
# A process that opens the stand-in VM's runtime (KVPROBE_TPU_VM) and prints its devices' ids.
OPEN_RUNTIME = ("import json; from probes.iut import standin_vm; "
                "print(json.dumps([d.id for d in standin_vm.open_runtime(standin_vm.active())]))")


@contextlib.contextmanager
def standin(root: Path, chip: str, chips: int = 1, *, metadata: bool = True, **built):
    """(the VM, the environment of a shell on it); its metadata server runs
    while the block does, unless `metadata` is False (a VM whose server is down)."""
    vm = standin_vm.build(root, chip, chips, **built)
    env = {k: v for k, v in os.environ.items() if k not in NOT_ON_A_VM}
    env.update({standin_vm.VM_VARIABLE: str(vm.root),
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={vm.devices}"})
    if not metadata:
        yield vm, env
        return
    with standin_vm.metadata_server(vm):
        yield vm, env


def kvprobe(env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probes.run.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def pytest_tpu(env: dict, out: Path, *args: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, pd.DataFrame]:
    """`pytest -m tpu` in this repository on the VM, as `make tpu-test` runs it:
    its exit, and the results CSV its kvprobe plugin wrote (--kvprobe-out)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "tpu", "-p", "no:cacheprovider", "-q", "-rA",
                           "--kvprobe-out", str(out), *args], cwd=REPO, env={**env, "COLUMNS": "2000"},
                          capture_output=True, text=True, timeout=timeout)
    runs = sorted(out.glob("*/runs/*.csv"))
    frame = pd.concat([pd.read_csv(path, keep_default_na=False) for path in runs]) if runs else pd.DataFrame()
    return done, frame
