"""Stand-in for vllm's AttentionBackendEnum: layers/common/attention_backend.py (imported by runner/kv_cache.py) imports it at module level; only its registration helpers, which the driver never calls, use it."""

import enum


class AttentionBackendEnum(enum.Enum):
    FLASH_ATTN = "flash_attn"
