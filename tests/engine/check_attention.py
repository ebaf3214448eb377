"""The attention stand-in against the kernel module's own ref_ragged_paged_attention
(mixed decode and prefill, GQA, head_dim 64 padded to 128): run in the jax
peer environment, PYTHONPATH=.venv-peer/beside .venv-peer/bin/python tests/engine/check_attention.py.
Measured 2026-12-06: output max diff 4.8e-07, cache identical."""
import os; os.environ["JAX_PLATFORMS"]="cpu"
import sys; sys.path.insert(0, ".")
from tests.connectors.bootstrap import load_tpu_inference
load_tpu_inference()
import numpy as np, jax, jax.numpy as jnp
from tests.engine.standins import attention
import tpu_inference.kernels.ragged_paged_attention.v3.kernel as K
rng = np.random.default_rng(0)
nq, nkv, d, page, pages, pps, maxs = 4, 2, 64, 4, 32, 6, 4
T = 16
q_lens = [1, 5, 3]; kv_lens = [7, 5, 10]
cu = np.concatenate([[0], np.cumsum(q_lens)]); cu = np.concatenate([cu, [cu[-1]]*(maxs+1-len(cu))]).astype(np.int32)
kvl = np.array(kv_lens + [0]*(maxs-3), np.int32)
pidx = rng.permutation(pages)[:maxs*pps].astype(np.int32) if pages >= maxs*pps else rng.permutation(maxs*pps).astype(np.int32) % pages
pidx = np.arange(maxs*pps, dtype=np.int32)[::-1].copy() % pages
Q = jnp.asarray(rng.standard_normal((T, nq, d)), jnp.float32)
Kk = jnp.asarray(rng.standard_normal((T, nkv, d)), jnp.float32)
V = jnp.asarray(rng.standard_normal((T, nkv, d)), jnp.float32)
shape = K.get_kv_cache_shape(pages, page, nkv, d, jnp.float32) if hasattr(K, "get_kv_cache_shape") else None
print("shape", shape)
cache = jnp.asarray(rng.standard_normal(shape), jnp.float32)
dist = jnp.array([1, 1, 3], jnp.int32)
ref_out, ref_cache = K.ref_ragged_paged_attention(Q, Kk, V, cache, jnp.asarray(kvl), jnp.asarray(pidx), jnp.asarray(cu), dist, sm_scale=0.125)
out, c2 = attention.ragged_paged_attention(Q, Kk, V, jnp.array(cache), jnp.asarray(kvl), jnp.asarray(pidx), jnp.asarray(cu), dist, sm_scale=0.125)
n = cu[3]
print("out max diff", float(jnp.abs(out[:n]-ref_out[:n]).max()), "cache diff", float(jnp.abs(c2-ref_cache).max()))
