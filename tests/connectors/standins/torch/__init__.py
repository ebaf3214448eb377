"""Stand-in for torch: tpu_inference.utils (imported by runner/kv_cache.py) names torch.dtype, torch.Tensor and four float dtypes at module level; installing torch for that is not cheap. Nothing in the driver's paths makes or converts a tensor, so these are bare names."""


class dtype:  # noqa: N801 (torch's name)
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


class Tensor:
    """Never instantiated: only named in annotations."""


bfloat16 = dtype("bfloat16")
float8_e4m3fn = dtype("float8_e4m3fn")
float8_e4m3fnuz = dtype("float8_e4m3fnuz")
float8_e5m2 = dtype("float8_e5m2")
float8_e5m2fnuz = dtype("float8_e5m2fnuz")
