"""Stand-in for tokamax's grouped matmul v2 (the Pallas kernel of MoE and
quantized linear layers).

tpu-inference imports `gmm_v2` and `calculate_tiling` from
`tokamax._src.ops.experimental.gmm_v2.gmm_v2` when its layers load, for
mixture-of-experts models and the quantized matmul kernel. The tokamax that has it is
written for Python 3.12, and the engine environment is 3.11 (the CPU torch on
this disk is built for it); the newest tokamax for 3.11 (0.0.12) has no
gmm_v2 (nor could a Pallas TPU kernel run on the CPU). The engine runs a
dense, unquantized model, so neither is called: the module is put in place
with both saying so if they ever are. If tokamax
has the module, nothing is done."""

import importlib.util
import sys
import types

MODULE = "tokamax._src.ops.experimental.gmm_v2.gmm_v2"


def gmm_v2(*args, **kwargs):
    raise NotImplementedError("tokamax's gmm_v2 (mixture-of-experts, quantized matmul) is not in the engine "
                              "environment (it needs Python 3.12); the engine test runs a dense bf16/fp32 model")


calculate_tiling = gmm_v2


def install() -> str:
    try:
        if importlib.util.find_spec(MODULE) is not None:
            return "moe kernel: tokamax has gmm_v2, left as is"
    except ModuleNotFoundError:
        pass
    parts = MODULE.split(".")
    for depth in range(len(parts) - 2, len(parts)):  # the two missing levels: gmm_v2 and gmm_v2.gmm_v2
        name = ".".join(parts[:depth + 1])
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.__path__ = []
    sys.modules[MODULE].gmm_v2, sys.modules[MODULE].calculate_tiling = gmm_v2, calculate_tiling
    setattr(sys.modules[".".join(parts[:-1])], parts[-1], sys.modules[MODULE])
    return "moe kernel: tokamax gmm_v2 and calculate_tiling stood in (dense model, never called)"
