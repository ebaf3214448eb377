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
    if mask_value is None:
        mask_value = float(jnp.finfo(jnp.float32).min)
    num_tokens, num_q_heads, actual_head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    pages_total, page_size, heads_x2_packed, packing, head_dim = kv_cache.shape
    max_seqs = kv_lens.shape[0]
    pages_per_seq = page_indices.shape[0] // max_seqs
    num_seqs = distribution[2]

    # Each token's sequence, and its position within that sequence's kv.
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], token, side="right"), 0, max_seqs - 1).astype(jnp.int32)
    valid = (seq < num_seqs) & (token < cu_q_lens[jnp.minimum(num_seqs, max_seqs)])
    q_end = cu_q_lens[seq + 1]
    pos = kv_lens[seq] - (q_end - token)  # kv_len - q_len + index within the query
    table = page_indices.reshape(max_seqs, pages_per_seq)

    if update_kv_cache:
        merged = kernel.merge_kv(keys, values)  # [tokens, heads_x2_packed, packing, head_dim]
        page = table[seq, jnp.clip(pos, 0) // page_size]
        slot = jnp.clip(pos, 0) % page_size
        page = jnp.where(valid & (pos >= 0), page, pages_total)  # out of range: dropped
        kv_cache = kv_cache.at[page, slot].set(merged.astype(kv_cache.dtype), mode="drop")

    # Every token's sequence kv: [tokens, pages_per_seq * page_size, heads_x2, head_dim].
    gathered = kv_cache[table[seq]].reshape(num_tokens, pages_per_seq * page_size, heads_x2_packed * packing,
                                            head_dim)
    k = gathered[:, :, 0:2 * num_kv_heads:2, :actual_head_dim]
    v = gathered[:, :, 1:2 * num_kv_heads:2, :actual_head_dim]
    k = jnp.repeat(k, group, axis=2).astype(jnp.float32)
    v = jnp.repeat(v, group, axis=2).astype(jnp.float32)
    q = queries.astype(jnp.float32)
    if q_scale is not None:
        q = q / q_scale
    attn = jnp.einsum("thd,tkhd->thk", q, k) * sm_scale
    if k_scale is not None:
        attn = attn * k_scale
    if q_scale is not None:
        attn = attn * q_scale
    if soft_cap is not None:
        attn = soft_cap * jnp.tanh(attn / soft_cap)
    key = jnp.arange(pages_per_seq * page_size, dtype=jnp.int32)[None, :]
    mask = key < kv_lens[seq][:, None]
    if use_causal_mask:
        mask = mask & (key <= pos[:, None])
    if sliding_window is not None:
        mask = mask & (key > pos[:, None] - sliding_window)
    attn = jnp.where(mask[:, None, :], attn, mask_value)
    attn = jax.nn.softmax(attn, axis=-1)
    out = jnp.einsum("thk,tkhd->thd", attn, v)
    if v_scale is not None:
        out = out * v_scale
    out = jnp.where(valid[:, None, None], out, 0).astype(out_dtype)
    return out, kv_cache


def install() -> str:
    import importlib
    kernel = importlib.import_module(KERNEL)
    kernel.ragged_paged_attention = ragged_paged_attention
    interface = sys.modules.get("tpu_inference.layers.common.attention_interface")
    if interface is not None:
        interface.ragged_paged_attention = ragged_paged_attention
    return "attention: ragged_paged_attention (Pallas) -> pure-JAX paged attention over the same cache layout"
