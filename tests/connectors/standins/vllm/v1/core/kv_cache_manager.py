"""Stand-in for vllm's KVCacheBlocks: what the scheduler hands update_state_after_alloc; both connectors call only get_block_ids()."""


class KVCacheBlocks:
    def __init__(self, block_ids: list[int]):
        self._block_ids = list(block_ids)

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self._block_ids),)
