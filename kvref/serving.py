"""The KV cache a serving stack allocates for each layer of a model, as
tpu-inference (vLLM on TPU) allocates it, with the sharding it gives it over
a (data, model) mesh:

- attention with kv heads (ragged paged attention, v3):
  `(blocks, block_size, ceil(2 * heads_per_shard / packing) * tp, packing, align(head_dim, 128))`,
  K and V interleaved, `packing = 32 // dtype bits`, split `spec(data,None,model)`;
- MLA's latent cache (v2 kernel): `(blocks, ceil(block_size / 32), 32, align(latent, 128) + align(rope, 128))`
  (32: its default MLA_KV_PACKING_SIZE), split `spec(data)`, so replicated over the model axis.

Fewer kv heads than the TP degree are duplicated up to it, as tpu-inference does."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvref.dtypes import element_type
from kvref.shape_key import ShapeKey
from kvref.sharding import Sharding
from kvref.values import integer

MLA_PACKING = 32
LANES = 128


@dataclass(frozen=True)
class ModelFigures:
    """What a model's config says about its KV cache."""

    name: str
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    mla_latent: int = 0  # kv_lora_rank; nonzero: an MLA model
    mla_rope: int = 0  # qk_rope_head_dim

    @property
    def is_mla(self) -> bool:
        return self.mla_latent > 0


# Public figures from each model's config.json.
PRESETS: dict[str, ModelFigures] = {m.name: m for m in (
    ModelFigures("llama-3.1-8b", layers=32, kv_heads=8, head_dim=128),
    ModelFigures("llama-3.1-70b", layers=80, kv_heads=8, head_dim=128),
    ModelFigures("qwen2.5-7b", layers=28, kv_heads=4, head_dim=128),
    ModelFigures("gemma-2-9b", layers=42, kv_heads=8, head_dim=256),
    ModelFigures("deepseek-v3", layers=61, mla_latent=512, mla_rope=64),
)}


MAX_CONFIG_BYTES = 1 << 20  # the most of a config file read


def model_figures(name_or_path) -> ModelFigures:
    """A preset by name, or the figures of a Hugging Face config.json file."""
    if str(name_or_path) in PRESETS:
        return PRESETS[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"no model preset or config file {str(name_or_path)!r}; presets: {', '.join(PRESETS)}")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ValueError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes; a config.json is a few KiB")
        config = json.loads(data.decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a config.json is a JSON object, got {type(config).__name__}")
    return from_config(config, path.parent.name or path.stem)


def from_config(config: dict, name: str = "model") -> ModelFigures:
    """The figures of a config.json's fields (a multimodal config's text_config
    counts): num_hidden_layers, and num_key_value_heads with head_dim (or
    hidden_size / num_attention_heads), or MLA's kv_lora_rank and qk_rope_head_dim."""
    config = {**config, **config.get("text_config", {})} if isinstance(config.get("text_config"), dict) else config

    def field(key: str, missing: list[str]):
        value = config.get(key)
        if value is None:
            missing.append(key)
            return 0
        return integer(value, f"config field {key}", 1)

    missing: list[str] = []
    layers = field("num_hidden_layers", missing)
    if config.get("kv_lora_rank"):
        latent, rope = field("kv_lora_rank", missing), field("qk_rope_head_dim", missing)
        _check_missing(missing, name)
        return ModelFigures(name, layers, mla_latent=latent, mla_rope=rope)
    heads_key = "num_key_value_heads" if config.get("num_key_value_heads") is not None else "num_attention_heads"
    if config.get(heads_key) is None:
        heads = 0
        missing.append("num_key_value_heads (or num_attention_heads)")
    else:
        heads = field(heads_key, missing)
    if config.get("head_dim") is not None:
        head_dim = field("head_dim", missing)
    elif config.get("hidden_size") is not None and config.get("num_attention_heads") is not None:
        hidden, attention = field("hidden_size", missing), field("num_attention_heads", missing)
        if hidden % attention:
            raise ValueError(f"config of {name}: hidden_size {hidden} is not a whole number of "
                             f"num_attention_heads {attention}, so it gives no head_dim; give head_dim")
        head_dim = hidden // attention
    else:
        head_dim = 0
        missing.append("head_dim (or hidden_size and num_attention_heads)")
    _check_missing(missing, name)
    return ModelFigures(name, layers, kv_heads=heads, head_dim=head_dim)


def _check_missing(missing: list[str], name: str) -> None:
    if missing:
        raise ValueError(f"config of {name} lacks {', '.join(missing)}; a KV cache needs num_hidden_layers "
                         "and either num_key_value_heads with head_dim, or kv_lora_rank with qk_rope_head_dim")


@dataclass(frozen=True)
class ServingCache:
    """One layer's cache as the serving stack allocates it, and its count."""

    model: ModelFigures
    key: ShapeKey  # the global array
    sharding: Sharding | None  # None: one device
    tp: int
    dp: int

    @property
    def layers(self) -> int:
        return self.model.layers


def serving_cache(model: ModelFigures, dtype: str, block_size: int, tp: int = 1, dp: int = 1,
                  blocks_per_shard: int = 32) -> ServingCache:
    """The per-layer cache of `model` at this TP and DP degree (blocks split over DP)."""
    for name, value in (("block_size", block_size), ("tp", tp), ("dp", dp), ("blocks_per_shard", blocks_per_shard)):
        integer(value, name, 1)
    element = element_type(dtype)
    blocks = blocks_per_shard * dp
    if model.is_mla:
        dims = (blocks, math.ceil(block_size / MLA_PACKING), MLA_PACKING,
                _align(model.mla_latent) + _align(model.mla_rope))
        spec = "spec(data)"
    else:
        bits = element.numpy.itemsize * 8
        packing = max(1, 32 // bits)
        if model.kv_heads % tp == 0:
            per_shard = model.kv_heads // tp
        elif tp % model.kv_heads == 0:
            per_shard = 1  # each device holds one duplicated head
        else:
            raise ValueError(f"{model.name} has {model.kv_heads} kv heads, which TP {tp} neither divides "
                             "nor is a multiple of")
        dims = (blocks, block_size, math.ceil(2 * per_shard / packing) * tp, packing, _align(model.head_dim))
        spec = "spec(data,None,model)"
    sharding = None if tp * dp == 1 else Sharding.parse(f"mesh(data={dp},model={tp}) {spec}")
    return ServingCache(model, ShapeKey(element.name, dims), sharding, tp, dp)


def _align(n: int) -> int:
    return -(-n // LANES) * LANES


# The serving configurations the shipped layout table and the `serving` shape
# matrix cover: (preset, dtype, block size, TP, DP).
SERVING_CONFIGS: tuple[tuple[str, str, int, int, int], ...] = (
    ("llama-3.1-8b", "bf16", 16, 1, 1),
    ("llama-3.1-8b", "bf16", 64, 4, 1),
    ("llama-3.1-8b", "f8e4m3fn", 128, 8, 1),
    ("llama-3.1-70b", "bf16", 32, 8, 1),
    ("llama-3.1-70b", "f8e4m3fn", 256, 4, 2),
    ("qwen2.5-7b", "bf16", 128, 2, 2),
    ("qwen2.5-7b", "f8e4m3fn", 16, 8, 1),  # 4 kv heads over TP 8: duplicated
    ("gemma-2-9b", "bf16", 256, 2, 1),
    ("deepseek-v3", "bf16", 64, 4, 1),
    ("deepseek-v3", "f8e4m3fn", 128, 1, 2),
)
SERVING_BLOCKS_PER_SHARD = 16  # enough blocks to permute; the layout does not depend on the count


def serving_caches() -> list[tuple[str, ServingCache]]:
    """(a name for it, the cache) for each of SERVING_CONFIGS."""
    found = []
    for preset, dtype, block_size, tp, dp in SERVING_CONFIGS:
        cache = serving_cache(PRESETS[preset], dtype, block_size, tp, dp, SERVING_BLOCKS_PER_SHARD)
        found.append((f"{preset}-{dtype}-bs{block_size}-tp{tp}" + (f"-dp{dp}" if dp > 1 else ""), cache))
    return found
