"""Stand-in for vllm.ray.lazy_utils: layers/common/attention_backend.py (imported by runner/kv_cache.py) imports is_in_ray_actor; the driver runs no Ray."""


def is_in_ray_actor() -> bool:
    return False
