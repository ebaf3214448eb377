"""Stand-in for vllm.v1.metrics: a package, so utils imports."""
