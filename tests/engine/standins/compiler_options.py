"""Stand-in for tpu_inference.models.common.compiler_options.

The step and sampling functions are jitted with TPU-only XLA options
(xla_tpu_all_gather_collective_matmul_mode, xla_tpu_sparse_core_*, ...); the
CPU compiler refuses options it does not know, so compiling fails. Here both
option sets are empty: the same programs, compiled with XLA's defaults.

The getters are imported by name (decode_loop, sampling, model_loader,
vllm_model_wrapper), so each importer's binding is replaced too; install()
runs before those modules are first imported where it can, and patches them
where they already are."""

import sys

IMPORTERS = ("tpu_inference.runner.decode_loop", "tpu_inference.layers.jax.sample.sampling",
             "tpu_inference.models.common.model_loader", "tpu_inference.models.vllm.vllm_model_wrapper")


def none() -> dict:
    return {}


def install() -> str:
    from tpu_inference.models.common import compiler_options
    names = [n for n in dir(compiler_options) if n.startswith("get_") and n.endswith("compiler_options")]
    for name in names:
        setattr(compiler_options, name, none)
        for importer in IMPORTERS:
            module = sys.modules.get(importer)
            if module is not None and hasattr(module, name):
                setattr(module, name, none)
    return f"compiler_options: {', '.join(names)} -> {{}}"
