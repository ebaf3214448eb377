"""Stand-in for vllm.v1.core: a package, so sched.output and kv_cache_manager import."""
