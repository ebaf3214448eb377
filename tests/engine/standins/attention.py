"""Stand-in for tpu-inference's ragged paged attention kernel (v3).

The kernel is a Pallas TPU kernel (Mosaic): it cannot be lowered for the CPU
backend. The kernel module's own `ref_ragged_paged_attention` loops over the
sequences in Python on concrete lengths, so it cannot run under jit. This is
the same computation in pure JAX, jittable, over the same paged cache layout
([pages, page_size, kv_heads_x2 // packing, packing, head_dim], keys and
values interleaved per head, head_dim padded to 128, from the kernel's own
`merge_kv`): it writes each new token's K/V into its page and slot, then
attends each query token to its sequence's first kv_len - q_len + i + 1
positions (causal, optional sliding window and soft cap). It returns
(output, kv_cache) like the kernel, so the cache the connector saves and
loads is the one the real layout would hold.

Installed over the kernel module's attribute before
tpu_inference.layers.common.attention_interface binds it."""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from tests.engine.standins import ragged

KERNEL = "tpu_inference.kernels.ragged_paged_attention.v3.kernel"


def ragged_paged_attention(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, *,
                           use_causal_mask=True, update_kv_cache=True, skip_kv_mask=False, sm_scale=1.0,
                           sliding_window=None, soft_cap=None, out_dtype=None, mask_value=None, q_scale=None,
                           k_scale=None, v_scale=None, **_tuning):
    return _rpa(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution,
                use_causal_mask=use_causal_mask, update_kv_cache=update_kv_cache, sm_scale=sm_scale,
                sliding_window=sliding_window, soft_cap=soft_cap, out_dtype=out_dtype, mask_value=mask_value,
                q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)


@functools.partial(jax.jit, static_argnames=("use_causal_mask", "update_kv_cache", "sm_scale", "sliding_window",
                                             "soft_cap", "out_dtype", "mask_value", "q_scale", "k_scale",
                                             "v_scale"),
                   donate_argnames=("kv_cache",))
def _rpa(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, *, use_causal_mask,
         update_kv_cache, sm_scale, sliding_window, soft_cap, out_dtype, mask_value, q_scale, k_scale, v_scale):
    kernel = sys.modules[KERNEL]
    if out_dtype is None:
        out_dtype = jnp.float32 if queries.dtype == jnp.float32 else jnp.bfloat16
    num_tokens, num_q_heads, actual_head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    pages_total, page_size, heads_x2_packed, packing, head_dim = kv_cache.shape
    pages_per_seq = page_indices.shape[0] // kv_lens.shape[0]
    at = ragged.place(num_tokens, kv_lens, page_indices, cu_q_lens, distribution, page_size, pages_total)

    if update_kv_cache:
        merged = kernel.merge_kv(keys, values)  # [tokens, heads_x2_packed, packing, head_dim]
        kv_cache = kv_cache.at[at.page, at.slot].set(merged.astype(kv_cache.dtype), mode="drop")

    # Every token's sequence kv: [tokens, pages_per_seq * page_size, heads_x2, head_dim].
    gathered = kv_cache[at.table[at.seq]].reshape(num_tokens, pages_per_seq * page_size, heads_x2_packed * packing,
                                                  head_dim)
    k = gathered[:, :, 0:2 * num_kv_heads:2, :actual_head_dim]
    v = gathered[:, :, 1:2 * num_kv_heads:2, :actual_head_dim]
    k = jnp.repeat(k, group, axis=2).astype(jnp.float32)
    v = jnp.repeat(v, group, axis=2).astype(jnp.float32)
    q = queries.astype(jnp.float32)
    if q_scale is not None:
        q = q / q_scale
    attn = ragged.weights(jnp.einsum("thd,tkhd->thk", q, k) * sm_scale, at, kv_lens, causal=use_causal_mask,
                          sliding_window=sliding_window, soft_cap=soft_cap, q_scale=q_scale, k_scale=k_scale,
                          mask_value=mask_value)
    out = jnp.einsum("thk,tkhd->thd", attn, v)
    if v_scale is not None:
        out = out * v_scale
    out = jnp.where(at.valid[:, None, None], out, 0).astype(out_dtype)
    return out, kv_cache


def install() -> str:
    import importlib
    kernel = importlib.import_module(KERNEL)
    kernel.ragged_paged_attention = ragged_paged_attention
    interface = sys.modules.get("tpu_inference.layers.common.attention_interface")
    if interface is not None:
        interface.ragged_paged_attention = ragged_paged_attention
    return "attention: ragged_paged_attention (Pallas) -> pure-JAX paged attention over the same cache layout"
