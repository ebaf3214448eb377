"""A fix-up (not a stand-in for TPU hardware): tpu-inference 0.32.0's MLA
layer under vLLM's models (layers/vllm/custom_ops/mla_attention.py,
VllmMLAAttention.process_weights_after_loading) always "quantizes" W_UK_T
and W_UV to the KV cache's quantized dtype, which is None for an unquantized
cache (kv_cache_dtype="auto"): quantize_tensor(None, ...) takes
jnp.finfo(None) (float64's range), its scales underflow to 0 in float32,
the weights become inf and every logit NaN (greedy token 0 everywhere,
measured). This is tpu-inference's, not the CPU's: the same arithmetic runs
on a TPU. Here, for dtype None only, that module's quantize_tensor returns
the tensor unchanged with unit scales (what "no quantization" means); a
quantized cache (fp8) takes the real function."""


def install() -> str:
    import jax.numpy as jnp
    from tpu_inference.layers.vllm.custom_ops import mla_attention
    real = mla_attention.quantize_tensor
    if getattr(real, "kvprobe_standin", False):
        return "unquantized_mla: already installed"

    def quantize_tensor(dtype, tensor, axis=-1, block_size=None):
        if dtype is not None:
            return real(dtype, tensor, axis, block_size)
        axes = range(tensor.ndim) if axis is None else ([axis] if isinstance(axis, int) else axis)
        axes = {a % tensor.ndim for a in axes}
        shape = tuple(n for i, n in enumerate(tensor.shape) if i not in axes)
        return tensor, jnp.ones(shape, jnp.float32)

    quantize_tensor.kvprobe_standin = True
    mla_attention.quantize_tensor = quantize_tensor
    return "unquantized_mla: W_UK_T/W_UV kept unquantized (unit scales) when the KV cache is not quantized"
