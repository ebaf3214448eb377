"""vLLM's engine as the facade's client (tests/engine): its scheduler and
EngineCore, tpu-inference's worker, model runner and KV cache, on JAX's CPU
backend. Greedy tokens with tpu-inference's RaidenOffloadConnector over
kvref.compat.tpu_sync must be those of the same engine with no connector,
with prompts the connector really served (external hits the scheduler got,
the facade's saves and loads called); a facade that loads a neighbouring
chunk or saves a neighbouring block must change them.

What the tokens cannot see, the byte checks of tests/test_real_connectors.py
do (the same connectors, block for block): a corruption of a block the model
attends to only a little can leave a greedy token unchanged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from probes.run import netns
from tests.engine import build_env, driver, model

REPO = Path(__file__).resolve().parent.parent
# Each corruption the output must show, as a kvref fault model under the facade.
TEETH = ("loads_neighbouring_chunk", "saves_neighbouring_block")
MODES = ("baseline", "offload", *(f"offload+{fault}" for fault in TEETH))
ENGINE_SECONDS = 1500  # every mode, one at a time; one takes 40-150 s as the machine is loaded
MIN_DISTINCT_TOKENS = 20  # random weights: a cache read wrongly changes what follows

pytestmark = pytest.mark.timeout(ENGINE_SECONDS + 120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    python = build_env.ENV.venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no engine environment at {build_env.ENV.venv}: `make engine-env` builds it")
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    out = tmp_path_factory.mktemp("engine") / "engine.json"
    done = subprocess.run([str(python), "-m", "tests.engine.driver", "--out", str(out),
                           "--model", str(REPO / "build" / "engine-model"), "--modes", ",".join(MODES)],
                          cwd=REPO, capture_output=True, text=True, timeout=ENGINE_SECONDS)
    assert out.exists(), f"the driver exited {done.returncode} and wrote no summary:\n{done.stderr[-4000:]}"
    summary = json.loads(out.read_text())
    for mode, run in summary["runs"].items():
        assert not run.get("error"), f"{mode}: the engine failed:\n{run['error'][-4000:]}"
    return summary


def tokens(summary: dict, mode: str) -> list:
    return summary["tokens"][mode]


def test_the_baseline_engine_generates_tokens_that_depend_on_the_context(runs):
    every = [t for batch in tokens(runs, "baseline") for out in batch for t in out]
    assert len(every) == sum(len(batch) for batch in driver.prompts(model.CONFIG["vocab_size"])) * driver.MAX_TOKENS
    assert len(set(every)) >= MIN_DISTINCT_TOKENS, every


def test_the_offload_connector_over_the_facade_gives_the_baseline_tokens(runs):
    assert tokens(runs, "offload") == tokens(runs, "baseline")


def test_repeated_prompts_were_served_from_the_facade(runs):
    offload = runs["runs"]["offload"]
    later = [out["num_cached_tokens"] for batch in offload["rounds"][1:] for out in batch]
    assert sum(hit["external"] for hit in offload["external_hits"]) > 0, offload["external_hits"]
    assert any(later), "no prompt of the later rounds was served from the connector's store"
    calls = offload["facade_calls"]
    assert calls.get("KVCacheManager.d2h_auto_allocate", 0) > 0 and calls.get("KVCacheManager.h2d", 0) > 0, calls


@pytest.mark.parametrize("fault", TEETH)
def test_a_facade_that_moves_the_wrong_block_changes_the_tokens(runs, fault):
    run = runs["runs"][f"offload+{fault}"]
    assert run["facade_calls"].get("KVCacheManager.h2d", 0) > 0, run["facade_calls"]
    assert tokens(runs, f"offload+{fault}") != tokens(runs, "baseline")
