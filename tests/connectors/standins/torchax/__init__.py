"""Stand-in for torchax: tpu_inference.utils imports torchax.ops.mappings at module level (torchax needs torch)."""
