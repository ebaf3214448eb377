"""The manager's declaration to kvprobe: a Library (the manager side of
probes.iut.protocol, written for protocol version 1) paired with the
simulated TPU arrays kvprobe ships, so every TPU generation's layouts are
probed without a TPU."""

from __future__ import annotations

from importlib import metadata

import kvref
from example_manager.manager import BlockOffloader
from probes.iut.adapter import IUT
from probes.iut.reference import KvrefLibrary, SimArrays


class Waited:
    def __init__(self, future):
        self.future = future

    def wait(self) -> None:
        self.future.result(timeout=60)

    def done(self) -> bool:
        """Asked without waiting: what lets kvprobe see a transfer still in flight."""
        return self.future.done()


class ExampleLibrary:
    distribution = "kvprobe-example-manager"
    supports_faults = False  # kvref's --faults are the reference's; this manager has none
    OPTION_SETS = ({},)  # one way to build it
    manager_class = BlockOffloader

    def __init__(self, faults: kvref.Faults, options: dict | None = None):
        if options:
            raise ValueError(f"the example manager is built one way; got options {options}")

    @property
    def version(self) -> str:
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:  # run from a copy of its source (--iut example_manager.iut:...)
            return "source"

    def skip_reason(self) -> str | None:
        return None

    def manager(self, caches, host_blocks: int, **options):
        return self.manager_class(caches, host_blocks, **options)

    def refuses(self, e: BaseException) -> bool:
        return isinstance(e, (ValueError, kvref.HostBudgetError))

    def transfer(self, manager, d2h: bool, src, dst, sizes=None) -> None:
        self.start(manager, d2h, src, dst, sizes).wait()

    def start(self, manager, d2h: bool, src, dst, sizes=None):
        return Waited((manager.offload if d2h else manager.restore)(src, dst, sizes))

    def save(self, manager, src, sizes=None):
        chunks, future = manager.save(src, sizes)
        return chunks, Waited(future)

    def unlock(self, manager, chunk_ids) -> None:
        manager.release(chunk_ids)

    # It parses kvref's own plan message, so the reference's plan methods serve.
    plan_request, plan_fields = KvrefLibrary.plan_request, KvrefLibrary.plan_fields


# What it cannot be asked, each with why: kvprobe never makes these cases for it.
NOT_APPLICABLE = (("settings", "the example manager has no settings beyond its host pool (no parallelism, no "
                               "timeout_s)"),
                  ("shared_pool", "the example manager's host pool is its own, never attached under a "
                                  "shared-memory key"))

EXAMPLE_MANAGER = IUT("example-manager", SimArrays, ExampleLibrary, targets=kvref.GENERATIONS, protocol=1,
                      not_applicable=NOT_APPLICABLE)
