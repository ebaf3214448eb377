"""tpu-inference 0.32.0's two KV connectors, unmodified, driven as its model
runner drives them (tests/connectors/driver.py, in the peer environment):
the drop-in facade must serve both byte for byte on every serving shape;
tpu-sync-jax is driven the same way, inside a loopback-only network
namespace, and what it does is reported, not held to the facade's rules."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from probes.iut import peer_env
from probes.run import netns
from tests.connectors.driver import SHAPE_NAMES, all_cases
from tests.peer_python import peer_python_or_skip

pytestmark = pytest.mark.peer

REPO = Path(__file__).resolve().parents[2]
JAX_ENV = peer_env.PEER_ENVS["jax"]
# What the driver needs besides the peer environment's pins (jax, tpu-sync-jax, kvref): tpu-inference
# itself, and the small packages its connectors and runner/kv_cache.py import, in JAX_ENV.beside_dir.
NEEDED = dict(JAX_ENV.beside)
DRIVER_SECONDS = 175  # a whole run of the driver, every case (each in its own interpreter, two at once)
MIN_DONATING_STEPS = 12

VERSIONS = """
import json
from importlib import metadata
found = {}
for name in %r:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def peer_python():
    python = peer_python_or_skip(JAX_ENV)
    done = subprocess.run([str(python), "-c", VERSIONS % (list(NEEDED),)], capture_output=True, text=True,
                          timeout=60, env=beside_env())
    found = json.loads(done.stdout) if done.returncode == 0 else {}
    wrong = {name: found.get(name) for name, version in NEEDED.items() if found.get(name) != version}
    if wrong:
        pytest.skip(f"the peer environment lacks what the connectors' driver needs in {JAX_ENV.beside_dir} "
                    f"({wrong}): run `kvprobe peer-env`")
    return python


def beside_env() -> dict:
    """The environment with the serving stack's folder on the path (for the driver only)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(JAX_ENV.beside_dir),
                                                                      os.environ.get("PYTHONPATH")]))}


def run_driver(command: list[str], out: Path) -> dict:
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=DRIVER_SECONDS,
                          env=beside_env())
    assert done.returncode == 0, f"the driver exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert out.exists(), f"the driver wrote no summary to {out}:\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


SAID_COUNTS = ("pulls_unsettled", "unsettled_reasons", "drain_ended")  # what says why a pull did not settle


def described(case: dict) -> str:
    """A case in a few lines: outcome, counts, the first exception, mismatch and error logged."""
    counts = {k: v for k, v in case.get("counts", {}).items() if isinstance(v, int) or k in SAID_COUNTS}
    said = [f"{case['case']}: {case.get('outcome')}, {case.get('mismatches')} mismatches, "
            f"{case.get('logged_errors')} errors logged; {counts}"]
    said += [f"  {e['type']} at {e.get('where')}: {e['message'][:400]}" for e in case.get("exceptions", [])[:1]]
    said += [f"  mismatch: {m[:400]}" for m in case.get("first_mismatches", [])[:1]]
    said += [f"  logged: {m[:400]}" for m in case.get("logged", [])[:1]]
    return "\n".join(said)


@pytest.mark.timeout(DRIVER_SECONDS + 30)
def test_facade_serves_both_connectors_byte_exact_over_donating_steps(peer_python, tmp_path):
    out = tmp_path / "facade.json"
    summary = run_driver([str(peer_python), "-m", "tests.connectors.driver", "--lib", "facade", "--out", str(out)],
                         out)
    cases = {c["case"]: c for c in summary["cases"]}
    assert sorted(cases) == sorted(all_cases())

    problems = []
    for name, case in cases.items():
        counts = case.get("counts", {})
        wrong = case.get("outcome") != "ran" or case.get("mismatches") or case.get("exceptions")
        if not case.get("reported_only"):
            wrong = wrong or case.get("logged_errors") or counts.get("pulls_unsettled")
            if name.startswith("offload:"):
                wrong = wrong or counts.get("donating_steps", 0) < MIN_DONATING_STEPS
                wrong = wrong or counts.get("saves_refused")
            else:
                wrong = wrong or min(counts.get("producer_donating_steps", 0),
                                     counts.get("consumer_donating_steps", 0)) < MIN_DONATING_STEPS
                wrong = wrong or counts.get("pulls_done") != counts.get("pulls_started")
        if wrong:
            problems.append(described(case))
    assert not problems, "the facade did not serve every case exactly:\n" + "\n".join(problems)

    # Each kind of transfer happened, on every shape: the test cannot pass by doing nothing.
    for shape in SHAPE_NAMES:
        offload = cases[f"offload:{shape}"]["counts"]
        for what in ("saves", "loads", "hit_blocks", "evictions_unlocked", "store_entries_checked"):
            assert offload.get(what, 0) > 0, f"offload:{shape}: no {what} ({offload})"
        disagg = cases[f"disagg:{shape}"]["counts"]
        for what in ("registrations", "pulls_done", "pulled_blocks", "sends_done"):
            assert disagg.get(what, 0) > 0, f"disagg:{shape}: no {what} ({disagg})"
        for kind in ("offload", "disagg"):
            assert cases[f"{kind}:{shape}"]["transfers_checked"] > 0


@pytest.mark.timeout(DRIVER_SECONDS + 30)
def test_tpu_sync_jax_is_driven_the_same_way_and_reported(peer_python, tmp_path):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "connectors.json"
    summary = run_driver(netns.python_command(str(peer_python), "tests.connectors.driver", "--lib", "tpu-sync-jax",
                                              "--out", str(out)), out)
    assert summary["environment"]["loopback_only_namespace"] is True
    assert summary["environment"]["interfaces"] == ["lo"]
    cases = {c["case"]: c for c in summary["cases"]}
    assert sorted(cases) == sorted(all_cases())
    for name, case in cases.items():
        assert case.get("outcome") in ("ran", "raised", "timed out", "crashed"), described(case)
        if case["outcome"] != "ran":  # whatever went wrong is said, with its text
            assert case["exceptions"] and all(e["message"] for e in case["exceptions"]), described(case)
