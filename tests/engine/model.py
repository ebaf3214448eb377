"""The tiny models the engine runs, with seeded random weights, written
locally (config.json and model.safetensors). Random weights, not the dummy
loader's: those give the same token for every context, which would hide a
corrupted cache.

- CONFIG, Llama-like: 2 layers, vocab 512, hidden 256, 2 query heads and 1
  KV head of dim 128 (the attention stand-in and the cache layout pad
  head_dim to 128).
- MLA_CONFIG, DeepSeek-V2-like (multi-head latent attention, as
  DeepSeek-V2-Lite: a plain q_proj, q_lora_rank None): 2 dense layers
  (first_k_dense_replace = num_hidden_layers, so no MoE), vocab 512, hidden
  256, 2 heads, kv_lora_rank 128, qk_nope 64, qk_rope 64 (padded to 128 in
  the cache), v_head_dim 64. Its cache is one latent array per layer,
  [blocks, 1, 32, 128 + 128]."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

COMMON = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 2, "max_position_embeddings": 512, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **COMMON, "num_key_value_heads": 1,
          "head_dim": 128, "rms_norm_eps": 1e-5}
MLA_CONFIG = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", **COMMON,
              "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_scaling": None, "attention_bias": False,
              "kv_lora_rank": 128, "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64,
              "v_head_dim": 64, "first_k_dense_replace": 2,
              # The MoE fields DeepSeek-V2's config carries; no layer is an MoE layer here.
              "moe_intermediate_size": 128, "n_shared_experts": 1, "n_routed_experts": 4,
              "num_experts_per_tok": 2, "routed_scaling_factor": 1.0, "topk_method": "greedy", "n_group": 1,
              "topk_group": 1, "moe_layer_freq": 1, "norm_topk_prob": False, "scoring_func": "softmax"}


def attention_weights(c: dict, w) -> dict:
    """One layer's attention weights, by name under self_attn."""
    h, n = c["hidden_size"], c["num_attention_heads"]
    if c["model_type"] == "deepseek_v2":
        lora, nope, rope, v = c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        return {"q_proj": w(n * (nope + rope), h), "kv_a_proj_with_mqa": w(lora + rope, h),
                "kv_b_proj": w(n * (nope + v), lora), "o_proj": w(h, n * v)}
    q, kv = n * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return {"q_proj": w(q, h), "k_proj": w(kv, h), "v_proj": w(kv, h), "o_proj": w(h, q)}


def write(path: Path, config: dict = CONFIG, seed: int = 0) -> Path:
    import numpy as np
    from safetensors.numpy import save_file
    path.parent.mkdir(parents=True, exist_ok=True)
    if (path / "config.json").exists() and json.loads((path / "config.json").read_text()) == config:
        return path
    c = config
    rng = np.random.default_rng(seed)
    h, i = c["hidden_size"], c["intermediate_size"]

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    tensors = {"model.embed_tokens.weight": w(c["vocab_size"], h), "model.norm.weight": np.ones(h, np.float32),
               "lm_head.weight": w(c["vocab_size"], h)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({f"{p}self_attn.{name}.weight": value for name, value in attention_weights(c, w).items()})
        if c["model_type"] == "deepseek_v2":
            tensors[p + "self_attn.kv_a_layernorm.weight"] = np.ones(c["kv_lora_rank"], np.float32)
        tensors.update({p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                        p + "mlp.down_proj.weight": w(h, i), p + "input_layernorm.weight": np.ones(h, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    # Whole or not at all: the folder is written beside it and moved into place.
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.mkdir()
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    (partial / "config.json").write_text(json.dumps(config, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(partial, path)
    return path
