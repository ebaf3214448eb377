"""Stand-in for vllm's KVConnectorOutput: what the model runner gathers from the worker-side connector each step and the scheduler hands update_connector_output."""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    invalid_block_ids: set[int] = field(default_factory=set)

    def is_empty(self) -> bool:
        return (not self.finished_sending and not self.finished_recving and not self.kv_connector_stats
                and not self.invalid_block_ids)
