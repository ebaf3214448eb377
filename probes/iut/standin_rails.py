"""A stand-in host with several data-plane NICs ("rails"), for the
libraries that split a manager into a sub-manager per rail when
ENABLE_MULTI_NUMA is on (kvref.compat.data_rails reads them as
tpu-sync-jax does): a sysfs tree whose class/net holds that many NICs with
a PCI device and a jumbo MTU, and the environment that points a library at
it. Each worker makes its own; the tree goes when the worker exits."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from kvref.compat.data_rails import DATA_NICS_VARIABLE, JUMBO_MTU, MULTI_NUMA_VARIABLE, SYSFS_VARIABLE

RAIL_NAMES = "kvrail{}"  # never a real interface's name


def rails_environment(rails: int) -> dict[str, str]:
    """The variables under which a library splits its managers over `rails` stand-in NICs."""
    root = Path(tempfile.mkdtemp(prefix="kvprobe-rails-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    names = [RAIL_NAMES.format(i) for i in range(rails)]
    for name in names:
        nic = root / "class" / "net" / name
        (nic / "device").mkdir(parents=True)
        (nic / "mtu").write_text(f"{JUMBO_MTU * 6}\n")
    return {MULTI_NUMA_VARIABLE: "1", SYSFS_VARIABLE: str(root), DATA_NICS_VARIABLE: ",".join(names)}
