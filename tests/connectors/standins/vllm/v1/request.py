"""Stand-in for vllm's Request and RequestStatus: the connectors read a request's id, tokens, computed-token count, block hashes (bytes), kv_transfer_params and status."""

import enum
from typing import Any, Optional


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()

    @staticmethod
    def is_finished(status) -> bool:
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                 kv_transfer_params: Optional[dict[str, Any]] = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids = list(prompt_token_ids)
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.block_hashes: list[bytes] = []
        self.kv_transfer_params = kv_transfer_params
        self.status = RequestStatus.WAITING

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.all_token_ids.append(token)
