"""Stand-in for vllm.distributed: a package, so the kv_transfer stand-ins below import."""
