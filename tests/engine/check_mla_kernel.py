"""The MLA kernel stand-in against the v1 kernel module's own
ref_mla_ragged_paged_attention (pure JAX, a loop over sequences), on random
inputs: mixed decode and prefill, several pages per sequence, a shuffled
page table, latent and rope widths that are not multiples of 128, float32
and bfloat16 caches (the packing v1's reference takes: the dtype's own).
Run in the engine environment, in a namespace of its own:

    unshare -rn .venv-engine/bin/python tests/engine/check_mla_kernel.py

It prints one JSON line per cache dtype; tests/integration/test_engine.py
holds float32 outputs within 1e-5 and every cache identical (measured
2026-12-06: float32 8.3e-07, bfloat16 0.0156, its rounding). The v2 kernel itself cannot be run here: in
JAX's TPU interpret mode (jax 0.10.2) it fails in its ref.bitcast calls
("'BitcastTransform' object has no attribute 'indices'"); the stand-in's
packed layout (32 tokens a row) was read from its DMA code."""
import json
import os
import sys

sys.path.insert(0, ".")
for key, value in {"JAX_PLATFORMS": "cpu", "TPU_ACCELERATOR_TYPE": "v6e-1", "TPU_NAME": "x",
                   "TPU_WORKER_ID": "0"}.items():
    os.environ.setdefault(key, value)
from tests.engine.standins import torchvision_ops  # noqa: E402

torchvision_ops.install()
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import tpu_inference.kernels.mla.v1.kernel as v1  # noqa: E402

from tests.engine.standins import mla_kernel  # noqa: E402


def case(rng, packing, dtype, page=32, heads=4, lkv=96, rope=40, q_lens=(1, 1, 7, 20), kv_lens=(5, 40, 7, 61),
         pages=24, per_seq=3, max_seqs=6):
    n = len(q_lens)
    tokens = sum(q_lens) + 3  # padded
    cu = np.zeros(max_seqs + 1, np.int32)
    cu[1:n + 1] = np.cumsum(q_lens)
    cu[n + 1:] = cu[n]
    lens = np.zeros(max_seqs, np.int32)
    lens[:n] = kv_lens
    table = (rng.permutation(max_seqs * per_seq) % pages).astype(np.int32)
    decode = sum(1 for q in q_lens if q == 1)
    cache = jnp.asarray(rng.standard_normal((pages, page // packing, packing,
                                             mla_kernel._align(lkv) + mla_kernel._align(rope))), dtype)
    given = (jnp.asarray(rng.standard_normal((heads, tokens, lkv)), dtype),
             jnp.asarray(rng.standard_normal((tokens, heads, rope)), dtype),
             jnp.asarray(rng.standard_normal((tokens, lkv)), dtype),
             jnp.asarray(rng.standard_normal((tokens, rope)), dtype))
    rest = (jnp.asarray(lens), jnp.asarray(table), jnp.asarray(cu), jnp.asarray([decode, decode, n], np.int32))
    return cache, given, rest, int(cu[n])


def main() -> None:
    rng = np.random.default_rng(0)
    for packing, dtype in ((1, jnp.float32), (2, jnp.bfloat16)):
        cache, (ql_nope, q_pe, kv_c, k_pe), rest, n = case(rng, packing, dtype)
        out, written = mla_kernel.mla_ragged_paged_attention(ql_nope, q_pe, kv_c, k_pe, jnp.array(cache), *rest,
                                                             sm_scale=0.1)
        ref_out, ref_written = v1.ref_mla_ragged_paged_attention(jnp.swapaxes(ql_nope, 0, 1), q_pe, kv_c, k_pe,
                                                                 jnp.array(cache), *rest, sm_scale=0.1)
        ours = jnp.swapaxes(out, 0, 1)[:n].astype(jnp.float32)
        theirs = ref_out[:n, :, :out.shape[-1]].astype(jnp.float32)
        cache_diff = jnp.abs(written.astype(jnp.float32) - ref_written.astype(jnp.float32)).max()
        print(json.dumps({"dtype": jnp.dtype(dtype).name, "output": float(jnp.abs(ours - theirs).max()),
                          "cache": float(cache_diff)}))


if __name__ == "__main__":
    main()
