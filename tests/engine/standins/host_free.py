"""Stand-in (a wrapper) for tpu-inference's unquantized linear weight load.

`VllmUnquantizedLinearMethod._load_linear_weights` puts a torch layer's
weight on the mesh and then frees the host copy with
`weight.untyped_storage().resize_(0)`. Under vLLM's DeepseekV2
(MODEL_IMPL_TYPE=vllm) on this CPU torch (2.13.0), the storage of
`kv_a_proj_with_mqa`'s weight (tpu-inference's VllmReplicatedLinear) cannot
be resized at that point ("RuntimeError: Trying to resize storage that is
not resizable"; its storage reports resizable() before the load, so it is
the load that pins it). Freeing host memory changes nothing the engine
computes, so within this call a free that is refused is skipped (the host
copy stays until the layer drops it)."""


def install() -> str:
    import torch
    from tpu_inference.layers.vllm.quantization import unquantized
    cls = unquantized.VllmUnquantizedLinearMethod
    real = cls._load_linear_weights
    if getattr(real, "kvprobe_standin", False):
        return "host_free: already installed"
    resize = torch.UntypedStorage.resize_
    skipped = []

    def tolerant_resize(storage, size):
        try:
            return resize(storage, size)
        except RuntimeError as e:
            if size != 0 or "not resizable" not in str(e):
                raise
            skipped.append(storage.nbytes())
            return storage

    def _load_linear_weights(self, layer):
        torch.UntypedStorage.resize_ = tolerant_resize
        try:
            return real(self, layer)
        finally:
            torch.UntypedStorage.resize_ = resize

    _load_linear_weights.kvprobe_standin = True
    _load_linear_weights.skipped = skipped
    cls._load_linear_weights = _load_linear_weights
    return "host_free: a refused free of a linear weight's host copy (not resizable) is skipped"
