"""Stand-in for vllm.utils.network_utils.get_ip: tpu_inference.distributed.utils.get_host_ip calls it, and the address it returns is what the disaggregated connector advertises. As vllm's does, it answers $VLLM_HOST_IP; unlike vllm's it never probes the network for an interface address (the driver sets VLLM_HOST_IP=127.0.0.1)."""

import os


def get_ip() -> str:
    ip = os.environ.get("VLLM_HOST_IP", "")
    if not ip:
        raise RuntimeError("VLLM_HOST_IP is not set: this stand-in never looks up the host's interface address")
    return ip
