"""What both attention stand-ins (attention, mla_kernel) share with the
kernels they stand in for: where each token of a ragged batch lies (its
sequence, its position in that sequence's kv, the page and slot it is
written to), and the softmax weights of each token over its sequence's
keys (scaled, capped, masked as the kernels mask)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Placed(NamedTuple):
    seq: jax.Array  # each token's sequence
    valid: jax.Array  # whether it is a token of one of the batch's sequences (the rest is padding)
    pos: jax.Array  # its position in its sequence's kv: kv_len - q_len + its index in the query
    table: jax.Array  # [sequences, pages a sequence] of page numbers
    page: jax.Array  # the page it is written to; pages_total (out of range, dropped) where it is not
    slot: jax.Array  # its slot in that page


def place(num_tokens: int, kv_lens, page_indices, cu_q_lens, distribution, page_size: int,
          pages_total: int) -> Placed:
    max_seqs = kv_lens.shape[0]
    num_seqs = distribution[2]
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], token, side="right"), 0, max_seqs - 1).astype(jnp.int32)
    valid = (seq < num_seqs) & (token < cu_q_lens[jnp.minimum(num_seqs, max_seqs)])
    pos = kv_lens[seq] - (cu_q_lens[seq + 1] - token)
    table = page_indices.reshape(max_seqs, page_indices.shape[0] // max_seqs)
    page = jnp.where(valid & (pos >= 0), table[seq, jnp.clip(pos, 0) // page_size], pages_total)
    return Placed(seq, valid, pos, table, page, jnp.clip(pos, 0) % page_size)


def weights(scores, placed: Placed, kv_lens, *, causal: bool, sliding_window, soft_cap, q_scale, k_scale,
            mask_value):
    """Softmax over each token's keys of `scores` [tokens, heads, keys]:
    scaled by the k and q scales, capped, masked beyond its sequence's kv,
    after its own position where causal, and outside its sliding window."""
    if k_scale is not None:
        scores = scores * k_scale
    if q_scale is not None:
        scores = scores * q_scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    key = jnp.arange(scores.shape[-1], dtype=jnp.int32)[None, :]
    pos = placed.pos[:, None]
    mask = key < kv_lens[placed.seq][:, None]
    if causal:
        mask = mask & (key <= pos)
    if sliding_window is not None:
        mask = mask & (key > pos - sliding_window)
    if mask_value is None:
        mask_value = float(jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(jnp.where(mask[:, None, :], scores, mask_value), axis=-1)
