"""tpu-sync-jax 0.0.1rc20261023185136 (defaults): CORRUPT: call 1 {'d2h': True, 'src': [], 'dst': [], 'sizes': None}: layer 0: host blocks [11] differ from the model

Found by `kvprobe fuzz --iut tpu-sync-jax` (in cpu/call_sequence/fuzz-0-8) and shrunk to 2 call(s):
call 1 {'d2h': True, 'src': [], 'dst': [], 'sizes': None}: layer 0: host blocks [11] differ from the model

Run: .venv-peer/bin/python reports/cpu/findings/fuzz-tpu-sync-jax-corrupt-2.py
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

CASE = '{"probe": "call_sequence", "generation": "cpu", "iut": "tpu-sync-jax", "name": "fuzz-0-8", "shape": "f32[32,4,256]", "faults": [], "timeout": 60.0, "startup_timeout": 60.0, "seed": 8, "kind": "", "iut_options": [], "calls": {"shape": "f32[32,4,256]", "layers": 1, "host_blocks": 48, "mode": "put", "calls": [{"d2h": true, "src": [13], "dst": [11], "sizes": null}, {"d2h": true, "src": [], "dst": [], "sizes": null}]}}'

outcome = run_case_here(CASE)
print(outcome.verdict, outcome.detail)
sys.exit(0 if outcome.verdict == "PASS" else 1)
