"""Stand-in for vllm.forward_context: the model runner passes get_forward_context() to start_load_kv (the offload connector ignores it, the disaggregated one takes it as `_`)."""

from dataclasses import dataclass
from typing import Any


@dataclass
class ForwardContext:
    attn_metadata: Any = None
    vllm_config: Any = None


_context = ForwardContext()


def get_forward_context() -> ForwardContext:
    return _context
