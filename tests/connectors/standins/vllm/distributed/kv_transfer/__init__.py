"""Stand-in for vllm.distributed.kv_transfer: a package, so the kv_connector stand-ins below import."""
