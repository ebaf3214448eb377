"""Stand-in for vllm.ray: a package, so lazy_utils imports."""
