"""Stand-in for vllm.v1.attention.backends: a package, so registry imports."""
