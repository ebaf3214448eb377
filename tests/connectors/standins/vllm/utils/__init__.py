"""Stand-in for vllm.utils: tpu_inference.utils imports it (its hashing helper is only used inside a function the driver never calls)."""
