"""Hardware IUTs with a CPU standing in for the TPU (probes.iut.hardware):
their own code runs on JAX CPU devices. The stand-in is part of the IUT's
declared environment, since a hardware worker inherits no TPU variables."""

import dataclasses

from probes.iut.declared import JAX_CPU_MESH, KVREF_SIM, TPU_SYNC_JAX_TPU
from probes.iut.hardware import STANDIN_VARIABLE
from probes.iut.reference import KvrefLibrary

JAX_TPU_ON_CPU = dataclasses.replace(TPU_SYNC_JAX_TPU, environment=((STANDIN_VARIABLE, "cpu"), JAX_CPU_MESH))


class _RefusesNothing(KvrefLibrary):
    """kvref's manager, whose every error this library calls a failure."""

    def refuses(self, e):
        return False


REFUSES_NOTHING = dataclasses.replace(KVREF_SIM, library=_RefusesNothing)
