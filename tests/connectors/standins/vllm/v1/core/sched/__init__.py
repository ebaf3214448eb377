"""Stand-in for vllm.v1.core.sched: a package, so output imports."""
