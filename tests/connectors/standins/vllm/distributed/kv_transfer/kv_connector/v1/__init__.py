"""Stand-in for vllm.distributed.kv_transfer.kv_connector.v1: a package, so base and metrics import."""
