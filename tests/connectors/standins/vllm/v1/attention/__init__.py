"""Stand-in for vllm.v1.attention: a package, so backends.registry imports."""
