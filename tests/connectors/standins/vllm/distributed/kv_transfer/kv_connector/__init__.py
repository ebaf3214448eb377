"""Stand-in for vllm.distributed.kv_transfer.kv_connector: a package, so factory and v1 import."""
