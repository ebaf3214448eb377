"""Stand-in for vllm.config: VllmConfig (the parts both connectors read: cache_config.block_size, model_config.max_model_len, kv_transfer_config.is_kv_producer) and get_current_vllm_config, which tpu_inference.offload.utils imports."""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = False


@dataclass
class ModelConfig:
    max_model_len: int = 256
    use_mla: bool = False


@dataclass
class ParallelConfig:
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1


@dataclass
class KVTransferConfig:
    kv_connector: str = ""
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def is_kv_transfer_instance(self) -> bool:
        return bool(self.kv_connector)


@dataclass
class VllmConfig:
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
    additional_config: dict = field(default_factory=dict)


_current: Any = None


def set_current_vllm_config(config: VllmConfig) -> None:
    global _current
    _current = config


def get_current_vllm_config() -> VllmConfig:
    return _current if _current is not None else VllmConfig()
