"""Stand-in for vllm.envs: tpu_inference.utils and layers/common/attention_backend.py import it; only read inside functions the driver never calls."""

VLLM_TPU_USING_PATHWAYS = False
VLLM_WORKER_MULTIPROC_METHOD = "fork"
