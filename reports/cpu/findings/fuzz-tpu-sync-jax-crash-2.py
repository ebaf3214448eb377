"""tpu-sync-jax 0.0.1rc20261023185136 (defaults): CRASH: killed by SIGSEGV after the probe (the probe had reported ERROR: call 6 {'d2h': False, 'src': [], 'dst': [], 'sizes': None}: a valid request was refused: RuntimeError: absl::StatusOr not ok: INVALID_ARGUMENT: Source host buffer is too small; H2d:

Found by `kvprobe fuzz --iut tpu-sync-jax` (in cpu/call_sequence/fuzz-0-6) and shrunk to 10 call(s):
killed by SIGSEGV after the probe (the probe had reported ERROR: call 6 {'d2h': False, 'src': [], 'dst': [], 'sizes': None}: a valid request was refused: RuntimeError: absl::StatusOr not ok: INVALID_ARGUMENT: Source host buffer is too small; H2d: Scheduled dispatch failed:)
KVPROBE-PHASE probe
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796042511.040011    5718 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
I0000 00:00:1796042511.042697    5718 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
W0000 00:00:1796042511.042716    5718 tpu_utils.cc:643] No data plane NIC was discovered; KV traffic will fall back to a single rail. Set TPU_RAIDEN_DATA_NICS to an explicit comma-separated interface allowlist (for example "ens6,enp192s4"), or raise the MTU of the data interfaces above 1500.
I0000 00:00:1796042511.042820    5718 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
I0000 00:00:1796042511.042840    5718 tpu_utils.cc:630] Detected interface: eth0, BDF: virtio2, MTU: 1400, NUMA: 0, Classification: Control/Fallback Interface
W0000 00:00:1796042511.042855    5718 tpu_utils.cc:643] No data plane NIC was discovered; KV traffic will fall back to a single rail. Set TPU_RAIDEN_DATA_NICS to an explicit comma-separated

Run: .venv-peer/bin/python reports/cpu/findings/fuzz-tpu-sync-jax-crash-2.py
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

CASE = '{"probe": "call_sequence", "generation": "cpu", "iut": "tpu-sync-jax", "name": "fuzz-0-6", "shape": "bf16[128,2,128]", "faults": [], "timeout": 60.0, "startup_timeout": 60.0, "seed": 6, "kind": "", "iut_options": [], "calls": {"shape": "bf16[128,2,128]", "layers": 2, "host_blocks": 106, "mode": "deferred", "calls": [{"d2h": false, "src": [56, 70, 66], "dst": [20, 104, 84], "sizes": null}, {"concurrent": [{"d2h": true, "src": [65], "dst": [3], "sizes": null}, {"d2h": true, "src": [110], "dst": [101], "sizes": null}]}, {"d2h": true, "src": [37, 41, 8, 100], "dst": [83, 45, 9, 3], "sizes": null}, {"d2h": false, "src": [62, 72, null], "dst": [81, 62], "sizes": [1, 9223372036854775808, true]}, {"d2h": true, "src": [1.0, 1.0, -1], "dst": [91, 100, 69], "sizes": null}, {"d2h": true, "src": [16, 92], "dst": [28, 51], "sizes": null}, {"d2h": false, "src": [], "dst": [], "sizes": null}, {"concurrent": [{"d2h": false, "src": [33], "dst": [26], "sizes": null}, {"d2h": false, "src": [94], "dst": [110], "sizes": null}]}, {"d2h": true, "src": [1.0, 72, 123], "dst": [13, 92, 47], "sizes": null}, {"d2h": true, "src": [null, 76, 66], "dst": [69, 62, 26], "sizes": null}]}}'

outcome = run_case_here(CASE)
print(outcome.verdict, outcome.detail)
sys.exit(0 if outcome.verdict == "PASS" else 1)
