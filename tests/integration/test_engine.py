"""vLLM's engine as the facade's client (tests/engine): its scheduler and
EngineCore, tpu-inference's worker, model runner and KV cache, on JAX's CPU
backend. Greedy tokens with tpu-inference's RaidenOffloadConnector over
kvref.compat.tpu_sync must be those of the same engine with no connector,
with prompts the connector really served (external hits the scheduler got,
the facade's saves and loads called); a facade that loads a neighbouring
chunk or saves a neighbouring block must change them. So must a consumer
engine's, decoding from blocks its TPUConnector pulled from a producer
engine (tests/engine/disagg.py): the baseline's tokens, every prompt's full
blocks pulled; a pull written one block off must change them.

What the tokens cannot see, the byte checks of tests/integration/test_real_connectors.py
do (the same connectors, block for block): a corruption of a block the model
attends to only a little can leave a greedy token unchanged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from probes.run import netns
from tests.engine import build_env, driver, model

REPO = Path(__file__).resolve().parents[2]
# Each corruption the output must show, as a kvref fault model under the facade.
TEETH = ("loads_neighbouring_chunk", "saves_neighbouring_block")
PULL_TEETH = ("pull_written_one_block_off",)
# Cache configurations the connectors meet, each on every path: a bf16 model
# under tensor parallelism over two CPU devices (each cache bf16, split over
# both), an fp8 KV cache, an MLA model's latent cache (one array a layer,
# [blocks, 1, 32 tokens, latent and rope key]).
CONFIGS = {"tp2@bf16": lambda cache: cache["devices"] == 2 and cache["dtype"] == "bfloat16",
           "fp8": lambda cache: cache["dtype"] == "float8_e4m3fn",
           "mla": lambda cache: cache["shape"][1:] == [1, driver.MLA_BLOCK, 256] and cache["dtype"] == "float32"}
# The teeth are shown on the default model's cache and on the MLA model's latent one.
TEETH_CONFIGS = ("", "@mla")
MODES = ("baseline", "offload", "disagg",
         *(f"{kind}@{config}" for config in CONFIGS for kind in ("baseline", "offload", "disagg")),
         *(f"offload{config}+{fault}" for config in TEETH_CONFIGS for fault in TEETH),
         *(f"disagg{config}+{fault}" for config in TEETH_CONFIGS for fault in PULL_TEETH))
ENGINE_SECONDS = 3600  # every mode, one at a time; one takes 20-170 s as the machine is loaded, bf16, fp8 and disagg more
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
                           "--models", str(REPO / "build" / "engine-models"), "--modes", ",".join(MODES)],
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


@pytest.mark.parametrize("config", TEETH_CONFIGS)
@pytest.mark.parametrize("fault", TEETH)
def test_a_facade_that_moves_the_wrong_block_changes_the_tokens(runs, fault, config):
    run = runs["runs"][f"offload{config}+{fault}"]
    assert run["facade_calls"].get("KVCacheManager.h2d", 0) > 0, run["facade_calls"]
    assert tokens(runs, f"offload{config}+{fault}") != tokens(runs, f"baseline{config}")


def test_a_consumer_engine_decoding_from_pulled_blocks_gives_the_baseline_tokens(runs):
    assert tokens(runs, "disagg") == tokens(runs, "baseline")


def test_the_consumer_pulled_every_prompts_full_blocks_from_the_producer(runs):
    """Each prompt's full blocks were external to the consumer's scheduler
    (so it decoded from what it pulled), registered by the producer and
    pulled by the consumer, and every pull the facade reported landed."""
    run = runs["runs"]["disagg"]
    batches = driver.prompts(model.CONFIG["vocab_size"])
    wanted = sorted(len(p) // driver.BLOCK * driver.BLOCK for batch in batches for p in batch)
    external: dict[str, int] = {}  # the scheduler may ask of a request more than once
    for hit in run["external_hits"]:
        external[hit["request"]] = max(external.get(hit["request"], 0), hit["external"])
    assert sorted(external.values()) == wanted, run["external_hits"]
    pulls = sum(len(batch) for batch in batches)
    assert run["producer"]["facade_calls"].get("KVCacheManager.register_read", 0) == pulls, run["producer"]
    assert run["facade_calls"].get("KVCacheManager.start_read", 0) == pulls, run["facade_calls"]


@pytest.mark.parametrize("config", TEETH_CONFIGS)
@pytest.mark.parametrize("fault", PULL_TEETH)
def test_a_facade_that_writes_a_pull_wrongly_changes_the_consumers_tokens(runs, fault, config):
    run = runs["runs"][f"disagg{config}+{fault}"]
    assert run["facade_calls"].get("KVCacheManager.start_read", 0) > 0, run["facade_calls"]
    assert tokens(runs, f"disagg{config}+{fault}") != tokens(runs, f"baseline{config}")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("kind", ("offload", "disagg"))
def test_each_cache_configuration_gives_its_baselines_tokens_on_each_path(runs, kind, config):
    run = runs["runs"][f"{kind}@{config}"]
    caches = run["caches"] + run.get("producer", {}).get("caches", [])
    assert caches and all(map(CONFIGS[config], caches)), caches  # every manager's caches are so
    baseline = tokens(runs, f"baseline@{config}")
    assert len({t for batch in baseline for out in batch for t in out}) >= MIN_DISTINCT_TOKENS, baseline
    assert tokens(runs, f"{kind}@{config}") == baseline
    moved = "KVCacheManager.h2d" if kind == "offload" else "KVCacheManager.start_read"  # a load served, a pull made
    assert run["facade_calls"].get(moved, 0) > 0, run["facade_calls"]


def test_the_mla_kernel_stand_in_computes_what_the_kernels_reference_does():
    """The stand-in every @mla mode attends with, against tpu-inference's own
    reference of the MLA kernel: the same cache written, the same output to
    float32's rounding (bfloat16's own rounding aside)."""
    python = build_env.ENV.venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no engine environment at {build_env.ENV.venv}: `make engine-env` builds it")
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    done = subprocess.run(["unshare", "-rn", str(python), "tests/engine/check_mla_kernel.py"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    found = {r["dtype"]: r for r in map(json.loads, (l for l in done.stdout.splitlines() if l.startswith("{")))}
    assert set(found) == {"float32", "bfloat16"}, done.stderr[-3000:]
    assert found["float32"]["output"] < 1e-5 and found["bfloat16"]["output"] < 0.05, found
    assert found["float32"]["cache"] == 0 == found["bfloat16"]["cache"], found


def test_a_mode_names_its_path_configuration_and_fault_and_is_refused_otherwise():
    mode = driver.Mode.parse("disagg@tp2@fp8+pull_written_one_block_off")
    assert (mode.kind, mode.tp, mode.kv_dtype, mode.fault) == ("disagg", 2, "fp8", "pull_written_one_block_off")
    assert mode.text == "disagg@tp2@fp8+pull_written_one_block_off" and mode.baseline == "baseline@tp2@fp8"
    assert driver.Mode.parse("offload").baseline == "baseline"
    bf16 = driver.Mode.parse("offload@bf16@tp2")
    assert (bf16.dtype, bf16.tp, bf16.text, bf16.baseline) == ("bfloat16", 2, "offload@tp2@bf16", "baseline@tp2@bf16")
    mla = driver.Mode.parse("disagg@fp8@mla")
    assert (mla.mla, mla.block, mla.text, mla.baseline) == (True, driver.MLA_BLOCK, "disagg@mla@fp8", "baseline@mla@fp8")
    assert mla.model(Path("m")) == Path("m/mla") and driver.Mode.parse("offload").model(Path("m")) == Path("m/llama")
    for text in ("baseline+saves_neighbouring_block", "offload@tp9", "offload@fp16", "offload@tp2@tp4", "serve",
                 "offload@bf16@bf16", "offload@mla@mla"):
        with pytest.raises(ValueError, match="expected KIND"):
            driver.Mode.parse(text)
    with pytest.raises(ValueError, match=r"unknown fault model\(s\) \['pull_writen_one_block_off'\] \(did you mean "
                                         r"'pull_written_one_block_off'\?\)$"):
        driver.Mode.parse("disagg+pull_writen_one_block_off")


@pytest.mark.parametrize("argv, said", [
    (["--modes", "offload+saves_neighbouring_blok"], "unknown fault model(s) ['saves_neighbouring_blok']"),
    (["--jobs", "0"], "expected a whole number of modes from 1 to 8"),
    (["--jobs=--"], "--jobs: no value (`--` is not one)"),
    (["--modes=--"], "--modes: no value (`--` is not one)"),
])
def test_the_engine_driver_refuses_a_bad_option_in_one_line_before_writing_anything(tmp_path, argv, said):
    done = subprocess.run([sys.executable, "-m", "tests.engine.driver", "--models", str(tmp_path / "models"),
                           "--out", str(tmp_path / "engine.json"), *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # no model written, no summary
