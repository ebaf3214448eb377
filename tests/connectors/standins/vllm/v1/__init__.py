"""Stand-in for vllm.v1: a package, so its stand-in modules import."""
