"""Stand-in for torchax.ops.mappings: tpu_inference.utils imports j2t_dtype, t2j and t2j_dtype at module level; they convert torch tensors and dtypes, which the driver never does, so each refuses."""


def _refused(name):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"torchax.ops.mappings.{name}: a stand-in (no torch in this environment)")
    return refuse


j2t_dtype = _refused("j2t_dtype")
t2j = _refused("t2j")
t2j_dtype = _refused("t2j_dtype")
