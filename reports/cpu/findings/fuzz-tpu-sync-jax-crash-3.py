"""tpu-sync-jax  (unsafe_skip_buffer_lock=False): CRASH: killed by SIGSEGV

Found by `kvprobe fuzz --iut tpu-sync-jax` (in cpu/call_sequence/fuzz-0-0) and shrunk to 1 call(s):
killed by SIGSEGV
KVPROBE-PHASE probe
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796042598.669328    9481 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
I0000 00:00:1796042598.669401    9481 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
W0000 00:00:1796042598.669404    9481 tpu_utils.cc:643] No data plane NIC was discovered; KV traffic will fall back to a single rail. Set TPU_RAIDEN_DATA_NICS to an explicit comma-separated interface allowlist (for example "ens6,enp192s4"), or raise the MTU of the data interfaces above 1500.
I0000 00:00:1796042598.669631    9481 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
I0000 00:00:1796042598.669640    9481 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
W0000 00:00:1796042598.669641    9481 tpu_utils.cc:643] No data plane NIC was discovered; KV traffic will fall back to a single rail. Set TPU_RAIDEN_DATA_NICS to an explicit comma-separated interface allowlist (for example "ens6,enp192s4"), or raise the MTU of the data interfaces above 1500.
InitTransportServer: target_numa=-1
InitTransportServer: Local IP: 192.0.2.2
I0000 00:00:1796042598.670176    9481 raw_buffer_transport.cc:281] bound_ip_

Run: .venv-peer/bin/python reports/cpu/findings/fuzz-tpu-sync-jax-crash-3.py
It replays the sequence through the harness's own adapter, prints the verdict
and exits non-zero (or crashes, or hangs until its watchdog), as it did then."""

import faulthandler
import os
import sys

from probes.run import netns  # noqa: E402  (the library listens on every interface: run it where only lo exists)

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", 'cpu')
faulthandler.dump_traceback_later(120.0, exit=True)

from probes.run.probe_case import run_case_here  # noqa: E402

CASE = '{"probe": "call_sequence", "generation": "cpu", "iut": "tpu-sync-jax", "name": "fuzz-0-0", "shape": "f32[64,1,128]", "faults": [], "timeout": 60.0, "startup_timeout": 60.0, "seed": 0, "kind": "", "iut_options": [["unsafe_skip_buffer_lock", false]], "calls": {"shape": "f32[64,1,128]", "layers": 1, "host_blocks": 81, "mode": "put", "calls": [{"d2h": false, "src": [9223372036854775807, 9223372036854775807, 55], "dst": [45, 24, 54], "sizes": null}]}}'

outcome = run_case_here(CASE)
print(outcome.verdict, outcome.detail)
sys.exit(0 if outcome.verdict == "PASS" else 1)
