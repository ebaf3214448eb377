"""A tiny Llama-like model with seeded random weights, written locally
(config.json and model.safetensors): 2 layers, vocab 512, hidden 256, 2
query heads and 1 KV head of dim 128 (the attention stand-in and the cache
layout pad head_dim to 128). Random weights, not the dummy loader's: those
give the same token for every context, which would hide a corrupted cache."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 128, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
          "bos_token_id": 1, "eos_token_id": 2}


def write(path: Path, seed: int = 0) -> Path:
    import numpy as np
    from safetensors.numpy import save_file
    path.mkdir(parents=True, exist_ok=True)
    if (path / "model.safetensors").exists() and json.loads((path / "config.json").read_text()) == CONFIG:
        return path
    c = CONFIG
    rng = np.random.default_rng(seed)
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    tensors = {"model.embed_tokens.weight": w(c["vocab_size"], h), "model.norm.weight": np.ones(h, np.float32),
               "lm_head.weight": w(c["vocab_size"], h)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                        p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
                        p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                        p + "mlp.down_proj.weight": w(h, i), p + "input_layernorm.weight": np.ones(h, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(CONFIG, indent=1))
    return path
