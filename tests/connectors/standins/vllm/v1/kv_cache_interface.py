"""Stand-in for vllm's KVCacheConfig: the connectors' constructors take one (and keep it)."""

from dataclasses import dataclass, field


@dataclass
class KVCacheConfig:
    num_blocks: int = 0
    kv_cache_tensors: list = field(default_factory=list)
    kv_cache_groups: list = field(default_factory=list)
