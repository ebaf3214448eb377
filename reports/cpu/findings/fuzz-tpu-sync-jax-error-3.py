"""tpu-sync-jax 0.0.1rc20261023185136 (unsafe_skip_buffer_lock=False): ERROR: call 0 {'d2h': True, 'src': [], 'dst': [], 'sizes': None}: a valid request was refused: RuntimeError: absl::StatusOr not ok: OUT_OF_RANGE: Copy range exceeds destination host buffer size; DispatchD2hChunks: Inline dispatch fa

Found by `kvprobe fuzz --iut tpu-sync-jax` (in cpu/call_sequence/fuzz-0-2) and shrunk to 1 call(s):
call 0 {'d2h': True, 'src': [], 'dst': [], 'sizes': None}: a valid request was refused: RuntimeError: absl::StatusOr not ok: OUT_OF_RANGE: Copy range exceeds destination host buffer size; DispatchD2hChunks: Inline dispatch failed:

Run: .venv-peer/bin/python reports/cpu/findings/fuzz-tpu-sync-jax-error-3.py
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

CASE = '{"probe": "call_sequence", "generation": "cpu", "iut": "tpu-sync-jax", "name": "fuzz-0-2", "shape": "f32[64,1,128]", "faults": [], "timeout": 60.0, "startup_timeout": 60.0, "seed": 2, "kind": "", "iut_options": [["unsafe_skip_buffer_lock", false]], "calls": {"shape": "f32[64,1,128]", "layers": 1, "host_blocks": 11, "mode": "put", "calls": [{"d2h": true, "src": [], "dst": [], "sizes": null}]}}'

outcome = run_case_here(CASE)
print(outcome.verdict, outcome.detail)
sys.exit(0 if outcome.verdict == "PASS" else 1)
