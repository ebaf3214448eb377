"""`kvprobe model`: a model's caches as tpu-inference allocates them, from a
preset or a config.json, their per-shard layouts, and the round trip on them."""

import json
import os
import re

import pytest

from kvref.serving import PRESETS, from_config, serving_cache
from probes.run import cli


def test_attention_caches_follow_tpu_inferences_shape():
    """(blocks, block size, ceil(2 * heads per shard / packing) * TP, packing, aligned head dim)."""
    llama = PRESETS["llama-3.1-8b"]  # 8 kv heads of 128
    assert serving_cache(llama, "bf16", 16).key.dims == (32, 16, 8, 2, 128)  # 2*8/2 = 8
    tp4 = serving_cache(llama, "bf16", 64, tp=4)
    assert tp4.key.dims == (32, 64, 8, 2, 128) and tp4.sharding.shard_dims(tp4.key.dims) == (32, 64, 2, 2, 128)
    fp8 = serving_cache(llama, "f8e4m3fn", 128, tp=8, dp=2)  # packing 4: ceil(2*1/4) = 1 per device
    assert fp8.key.dims == (64, 128, 8, 4, 128) and str(fp8.sharding) == "mesh(data=2,model=8) spec(data,None,model)"
    qwen = serving_cache(PRESETS["qwen2.5-7b"], "bf16", 16, tp=8)  # 4 kv heads over 8 devices: duplicated
    assert qwen.sharding.shard_dims(qwen.key.dims) == (32, 16, 1, 2, 128)


def test_an_mla_cache_is_one_latent_replicated_over_the_model_axis():
    deepseek = serving_cache(PRESETS["deepseek-v3"], "bf16", 64, tp=4)
    assert deepseek.key.dims == (32, 2, 32, 640)  # ceil(64/32) pages of 32, 512 + 128 aligned
    assert deepseek.sharding.shard_dims(deepseek.key.dims) == deepseek.key.dims


def test_a_tp_degree_that_does_not_fit_the_heads_is_refused_by_name():
    with pytest.raises(ValueError, match="has 8 kv heads, which TP 3 neither divides nor is a multiple of"):
        serving_cache(PRESETS["llama-3.1-8b"], "bf16", 16, tp=3)


@pytest.mark.parametrize("config, missing", [
    ({"num_key_value_heads": 8, "head_dim": 128}, "num_hidden_layers"),
    ({"num_hidden_layers": 32, "head_dim": 128}, r"num_key_value_heads \(or num_attention_heads\)"),
    ({"num_hidden_layers": 32, "num_key_value_heads": 8}, r"head_dim \(or hidden_size and num_attention_heads\)"),
    ({"num_hidden_layers": 61, "kv_lora_rank": 512}, "qk_rope_head_dim"),
])
def test_a_config_without_the_fields_a_cache_needs_names_them(config, missing):
    with pytest.raises(ValueError, match=f"lacks {missing}"):
        from_config(config, "m")


def test_a_config_json_reads_as_its_fields_say(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
                                "hidden_size": 2048, "text_config_unused": 1}))
    found = cli.build_parser().parse_args(["model", str(path), "--tp", "2", "-g", "v6e"])
    assert found.model == str(path)
    model = from_config(json.loads(path.read_text()), "tiny")
    assert (model.layers, model.kv_heads, model.head_dim) == (4, 4, 128)
    assert cli.main(["model", str(path), "--tp", "2", "-g", "v6e"]) == 0


@pytest.mark.parametrize("argv", [
    ["llama-3.1-8b", "--tp", "4", "-g", "v6e"],
    ["deepseek-v3", "--tp", "2", "--dtype", "f8e4m3fn", "--block-size", "128", "-g", "tpu7x"],
    ["gemma-2-9b", "--dp", "2", "--block-size", "32", "-g", "v5e"],
])
def test_a_preset_runs_end_to_end_and_its_round_trip_earns_the_prediction(argv, capsys):
    assert cli.main(["model", *argv]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "host pool" in out


def test_a_model_that_is_neither_preset_nor_file_is_an_error(capsys):
    assert cli.main(["model", "no-such-model", "-g", "v6e", "--no-probe"]) == 2
    assert "no model preset or config file 'no-such-model'; presets: llama-3.1-8b" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("num_key_value_heads", "8"), ("num_hidden_layers", 0), ("head_dim", True)])
def test_a_config_field_that_is_not_a_positive_integer_is_named(field, value):
    config = {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128, field: value}
    with pytest.raises(ValueError, match=f"config field {field} must be a positive integer, got {value!r}"):
        from_config(config, "m")


@pytest.mark.parametrize("config, needle", [
    ({"num_hidden_layers": 2, "num_key_value_heads": 8, "head_dim": 0}, "head_dim must be a positive integer, got 0"),
    ({"num_hidden_layers": 2, "num_key_value_heads": 8, "num_attention_heads": 8, "hidden_size": 4},
     "hidden_size 4 is not a whole number of num_attention_heads 8"),
])
def test_a_derived_head_dim_of_zero_is_refused_by_name(config, needle):
    with pytest.raises(ValueError, match=needle):
        from_config(config)


def test_a_config_file_is_read_to_a_bound(tmp_path, capsys):
    from kvref.serving import MAX_CONFIG_BYTES

    big = tmp_path / "config.json"
    big.write_text(json.dumps({"num_hidden_layers": 2, "padding": "x" * MAX_CONFIG_BYTES}))
    assert cli.main(["model", str(big), "-g", "v5e"]) == 2
    assert f"larger than {MAX_CONFIG_BYTES:,} bytes" in capsys.readouterr().err


def test_piped_its_table_never_wraps_a_layout_mid_token():
    """A CI log is no 80-column terminal: each row of the table is one line."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "probes.run.cli", "model", "llama-3.1-8b", "--no-probe"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("│ tpu7x")]
    assert len(rows) == 1 and re.search(r"bf16\[[\d,]+\]\{[^}\s]+\}", rows[0]), done.stdout  # whole, on one line
