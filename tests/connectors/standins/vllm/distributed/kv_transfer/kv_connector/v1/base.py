"""Stand-in for vllm's KVConnectorBase_V1, KVConnectorMetadata and KVConnectorRole: both connectors subclass them; the base keeps the metadata the model runner binds before start_load_kv and clears after get_finished."""

import enum


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata:
    """What a scheduler-side connector hands its worker-side one each step."""


class KVConnectorBase_V1:
    def __init__(self, vllm_config, role, kv_cache_config=None):
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    def bind_connector_metadata(self, connector_metadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        return set()

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def update_connector_output(self, connector_output) -> None:
        return None

    def shutdown(self) -> None:
        return None
