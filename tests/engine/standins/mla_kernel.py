"""Stand-in for tpu-inference's MLA ragged paged attention kernel (v2).

`tpu_inference.kernels.mla.v2.kernel.mla_ragged_paged_attention` is a Pallas
TPU kernel (Mosaic, DMAs and semaphores; its q/out transposes are Pallas
too): it cannot be lowered for the CPU backend. This is the same computation
in pure JAX, jittable, with the same signature, over the same cache layout:

- not transposed (default, MLA_TRANSPOSE_KV_CACHE=False):
  [pages, page_size // P, P, align(kv_lora_rank, 128) + align(rope, 128)],
  P = cache.shape[2] (MLA_KV_PACKING_SIZE, default 32): a page's token s is
  at [s // P, s % P]; its latent kv_c in [:align(lkv, 128)], its rope key
  k_pe in [align(lkv, 128):], zero padded (the kernel pads both to 128);
- transposed (MLA_TRANSPOSE_KV_CACHE=True): [pages, align(lkv, 128) + rope,
  page_size], token s in column s.

It writes each new token's (kv_c, k_pe) into its page and slot, then attends
each query token (MQA over the latent: q = [ql_nope | q_pe], k = [kv_c |
k_pe], v = kv_c) to its sequence's first kv_len - q_len + i + 1 positions
(causal, optional sliding window and soft cap, the q/k/v scales where the
kernel applies them). Inputs and outputs are the kernel's: ql_nope and the
output head-major [heads, tokens, lkv], q_pe [tokens, heads, rope], and
(output, cache). Only sequences [0, distribution[2]) are written or attended.

Numerics: scores and softmax in float32 (the kernel casts its scores to
s_dtype, bfloat16 by default, and runs flash attention in blocks), so
outputs agree to float rounding, not bit for bit; the cache it writes is
exact (a copy).

Installed over the kernel module's attribute and over
tpu_inference.layers.common.attention_interface's binding (it imports the
name)."""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from tests.engine.standins import ragged

KERNEL = "tpu_inference.kernels.mla.v2.kernel"
INTERFACE = "tpu_inference.layers.common.attention_interface"


def _align(x: int, a: int = 128) -> int:
    return (x + a - 1) // a * a


def mla_ragged_paged_attention(ql_nope, q_pe, new_kv_c, new_k_pe, cache_kv, kv_lens, page_indices, cu_q_lens,
                               distribution, *, sm_scale=1.0, sliding_window=None, soft_cap=None, mask_value=None,
                               q_scale=None, k_scale=None, v_scale=None, transpose_kv_cache=False, **_tuning):
    """The kernel's signature; its tuning arguments (chunk_prefill_size,
    num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes,
    decode_batch_size, mixed_q_split, s_dtype, two_step_flash_attention,
    p_same_dtype_as_v, debug_mode) change how it is blocked, not what it
    computes, and are ignored."""
    return _mla(ql_nope, q_pe, new_kv_c, new_k_pe, cache_kv, kv_lens, page_indices, cu_q_lens, distribution,
                sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap, mask_value=mask_value,
                q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, transpose_kv_cache=transpose_kv_cache)


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap", "mask_value", "q_scale",
                                             "k_scale", "v_scale", "transpose_kv_cache"),
                   donate_argnames=("cache_kv",))
def _mla(ql_nope, q_pe, new_kv_c, new_k_pe, cache_kv, kv_lens, page_indices, cu_q_lens, distribution, *, sm_scale,
         sliding_window, soft_cap, mask_value, q_scale, k_scale, v_scale, transpose_kv_cache):
    num_heads, num_tokens, lkv = ql_nope.shape
    r = q_pe.shape[-1]
    nope_dim = _align(lkv)
    if transpose_kv_cache:
        pages_total, kv_dim, page_size = cache_kv.shape
    else:
        pages_total, rows, packing, kv_dim = cache_kv.shape
        page_size = rows * packing
    rope_dim = kv_dim - nope_dim  # padded rope width in the cache
    pages_per_seq = page_indices.shape[0] // kv_lens.shape[0]
    at = ragged.place(num_tokens, kv_lens, page_indices, cu_q_lens, distribution, page_size, pages_total)

    # The new rows: [tokens, kv_dim], latent then rope, each zero padded.
    new = jnp.concatenate([jnp.pad(new_kv_c, ((0, 0), (0, nope_dim - lkv))),
                           jnp.pad(new_k_pe, ((0, 0), (0, rope_dim - r)))], axis=-1).astype(cache_kv.dtype)
    if transpose_kv_cache:
        cache_kv = cache_kv.at[at.page[:, None], jnp.arange(kv_dim)[None, :], at.slot[:, None]].set(new, mode="drop")
        flat = jnp.swapaxes(cache_kv, 1, 2)  # [pages, page_size, kv_dim]
    else:
        cache_kv = cache_kv.at[at.page, at.slot // packing, at.slot % packing].set(new, mode="drop")
        flat = cache_kv.reshape(pages_total, page_size, kv_dim)

    # Every token's sequence kv: [tokens, pages_per_seq * page_size, kv_dim].
    kv = flat[at.table[at.seq]].reshape(num_tokens, pages_per_seq * page_size, kv_dim).astype(jnp.float32)
    k = jnp.concatenate([kv[..., :lkv], kv[..., nope_dim:nope_dim + r]], axis=-1)
    v = kv[..., :lkv]
    q = jnp.concatenate([jnp.swapaxes(ql_nope, 0, 1), q_pe], axis=-1).astype(jnp.float32)  # [T, N, lkv + r]
    p = ragged.weights(jnp.einsum("tnd,tkd->tnk", q, k) * sm_scale, at, kv_lens, causal=True,
                       sliding_window=sliding_window, soft_cap=soft_cap, q_scale=q_scale, k_scale=k_scale,
                       mask_value=mask_value)
    out = jnp.einsum("tnk,tkl->ntl", p, v)
    if v_scale is not None:
        out = out * v_scale
    out = jnp.where(at.valid[None, :, None], out, 0).astype(ql_nope.dtype)
    return out, cache_kv


def install() -> str:
    import importlib
    kernel = importlib.import_module(KERNEL)
    kernel.mla_ragged_paged_attention = mla_ragged_paged_attention
    interface = sys.modules.get(INTERFACE)
    if interface is not None:
        interface.mla_ragged_paged_attention = mla_ragged_paged_attention
    return "mla attention: mla_ragged_paged_attention (Pallas) -> pure-JAX MLA over the same latent cache layout"
