"""vLLM's engine as the facade's client (issue 50): `LLM` with its scheduler
and EngineCore in process, tpu-inference's worker, TPUModelRunner and KV
cache, on JAX's CPU backend, with the stand-ins of tests/engine/standins.

    .venv-engine/bin/python -m tests.engine.driver --out reports/cpu/engine.json

makes a tiny Llama-like model with seeded random weights (model.py), then
runs each mode in an interpreter of its own inside a loopback-only network
namespace (`unshare -rn ... -m probes.run.netns`):

- baseline: no KV connector;
- offload: tpu-inference's RaidenOffloadConnector (kv_both) over
  kvref.compat.tpu_sync installed as `tpu_raiden`;
- disagg: a producer engine and a consumer engine, each with
  tpu-inference's TPUConnector over the facade, the consumer decoding from
  the blocks it pulled from the producer (tests/engine/disagg.py);
- offload+FAULT, disagg+FAULT: the same with kvref's fault model FAULT
  switched on ($KVREF_FAULTS), to show the comparison catches it;
- any of them @tpN (baseline@tp2, offload@tp2+FAULT): tensor parallelism
  over N JAX CPU devices, each cache split over them; @bf16: the model (and
  so its KV cache) in bfloat16; @fp8: an fp8 KV cache; @mla: a
  DeepSeek-V2-like model whose cache is multi-head latent attention's (one
  latent array per layer, blocks of 32 tokens); together: @tp2@bf16,
  @mla@fp8; each compared with the baseline of the same configuration.

Both run the same rounds of prompts (prompts that repeat and share prefixes,
greedy, local prefix caching off so that repeats can only hit the
connector's store), and the summary holds each run's tokens, whether they are
identical, the external hits the scheduler got from the connector
(get_num_new_matched_tokens), and the facade's calls by method."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import kvref

REPO = Path(__file__).resolve().parents[2]
MODES = ("baseline", "offload", "disagg")
BLOCK = 16
MLA_BLOCK = 32  # an MLA cache packs 32 tokens per row (MLA_KV_PACKING_SIZE): a block holds a multiple of them
MAX_TOKENS = 8  # generated per prompt, greedy
MODE_SECONDS = 900  # one mode's run, at most (measured alone: 20-150 s): a stuck one is its own error, not the run's
# XLA's compilations, kept between modes and runs: the modes of one configuration compile the same model.
COMPILED = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvprobe" / "engine-jax"
ENVIRONMENT = {
    "JAX_PLATFORMS": "cpu",
    "JAX_COMPILATION_CACHE_DIR": str(COMPILED),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # EngineCore in this process: the facade's tally is here
    "VLLM_HOST_IP": "127.0.0.1",
    # tpu-inference asks the GCE metadata server for these unless they are set.
    "TPU_ACCELERATOR_TYPE": "v6e-1", "TPU_NAME": "kvprobe-cpu", "TPU_WORKER_ID": "0",
    "CLOUD_TPU_TASK_ID": "0", "TPU_OFFLOAD_DECODE_SAVE": "0", "TPU_OFFLOAD_NUM_CPU_CHUNKS": "64",
    "RAIDEN_NUM_SLOTS": "4", "RAIDEN_TRANSPORT_PARALLELISM": "1",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
}


def prompts(vocab: int, block: int = BLOCK, seed: int = 7) -> list[list[list[int]]]:
    """Rounds of token prompts: two shared prefixes of 4 blocks, prompts
    extending them, and the first round's prompts again in the second."""
    import random
    rng = random.Random(seed)
    words = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    a, b = words(4 * block), words(4 * block)
    first = [a + words(block + 5), b + words(2 * block + 1), words(3 * block + 3)]
    second = [first[0], a + words(7), first[2], b + words(block)]
    third = [first[1], second[1]]
    return [first, second, third]


KV_DTYPES = ("fp8",)  # vLLM's kv_cache_dtype values a mode may name; the default is the model's
MODEL_DTYPES = {"bf16": "bfloat16"}  # the model's (and so the cache's) dtype a mode may name; the default float32
MLA = "mla"
# What an MLA model needs of tpu-inference: vLLM's DeepseekV2 (tpu-inference's own DeepseekV3 hard-codes
# V3's sizes and fp8 weights), and the model design and DP attention it requires of every MLA model.
MLA_ENVIRONMENT = {"MODEL_IMPL_TYPE": "vllm", "NEW_MODEL_DESIGN": "1",
                   "KVPROBE_ENGINE_HBM_BYTES": str(256 << 20)}  # thousands of blocks: plenty, and 2 GiB each is not
MLA_CONFIG = {"sharding": {"sharding_strategy": {"enable_dp_attention": True}}}


@dataclass(frozen=True)
class Mode:
    """A mode as written: KIND[@CONFIG...][+FAULT], each CONFIG tpN (tensor
    parallelism over N CPU devices), a model dtype (bf16), a KV cache dtype
    (fp8) or the MLA model (mla)."""

    kind: str
    tp: int = 1
    kv_dtype: str = "auto"
    fault: str = ""
    dtype: str = "float32"
    mla: bool = False

    @classmethod
    def parse(cls, text: str) -> "Mode":
        rest, _, fault = text.partition("+")
        kind, *parts = rest.split("@")
        tps = [int(c[2:]) for c in parts if re.fullmatch(r"tp[1-8]", c)]
        kv_dtypes = [c for c in parts if c in KV_DTYPES]
        dtypes = [MODEL_DTYPES[c] for c in parts if c in MODEL_DTYPES]
        mla = [c for c in parts if c == MLA]
        if kind not in MODES or len(tps) + len(kv_dtypes) + len(dtypes) + len(mla) != len(parts) \
                or max(len(tps), len(kv_dtypes), len(dtypes), len(mla)) > 1 or (fault and kind == "baseline"):
            raise ValueError(f"mode {text!r}: expected KIND[@CONFIG...][+FAULT], KIND one of {', '.join(MODES)} "
                             f"(a FAULT for offload or disagg), each CONFIG at most once: tpN (N from 1 to 8), "
                             f"a model dtype ({', '.join(MODEL_DTYPES)}), a KV cache dtype ({', '.join(KV_DTYPES)}) "
                             f"or {MLA}")
        if fault:  # a fault model kvref has, checked before any model is written or engine started
            try:
                kvref.Faults.parse([fault], environ={})
            except ValueError as e:
                raise ValueError(f"mode {text!r}: {str(e).split('; expected')[0]}") from None
        return cls(kind, tps[0] if tps else 1, kv_dtypes[0] if kv_dtypes else "auto", fault,
                   dtypes[0] if dtypes else "float32", bool(mla))

    @property
    def config(self) -> str:
        parts = ([MLA] if self.mla else []) + ([f"tp{self.tp}"] if self.tp > 1 else []) \
            + [name for name, dtype in MODEL_DTYPES.items() if dtype == self.dtype] \
            + ([self.kv_dtype] if self.kv_dtype != "auto" else [])
        return "".join(f"@{part}" for part in parts)

    @property
    def text(self) -> str:
        return self.kind + self.config + (f"+{self.fault}" if self.fault else "")

    @property
    def baseline(self) -> str:
        """The mode whose tokens this one's must equal: the baseline of the same configuration."""
        return Mode("baseline", self.tp, self.kv_dtype, dtype=self.dtype, mla=self.mla).text

    @property
    def block(self) -> int:
        return MLA_BLOCK if self.mla else BLOCK

    def model(self, models: Path) -> Path:
        """Where its model is written, in the folder of the engine's models."""
        return models / ("mla" if self.mla else "llama")

    @property
    def model_config(self) -> dict:
        from tests.engine import model
        return model.MLA_CONFIG if self.mla else model.CONFIG


class Tally:
    """Calls to the facade's classes, by Class.method, and the caches its
    managers were built over, in this process."""

    def __init__(self):
        self.calls = collections.Counter()
        self.caches: list[dict] = []

    def note_caches(self, manager_class) -> None:
        real = manager_class.__init__

        def init(manager, *args, **kwargs):
            caches = kwargs.get("kv_caches", args[0] if args else None)
            first = caches[0]
            self.caches.append({"layers": len(caches), "shape": list(first.shape), "dtype": str(first.dtype),
                                "devices": len(first.sharding.device_set)})
            real(manager, *args, **kwargs)
        manager_class.__init__ = init

    def wrap(self, cls) -> None:
        for name, value in list(vars(cls).items()):
            if callable(value) and (not name.startswith("_") or name == "__init__"):
                setattr(cls, name, self._counted(f"{cls.__name__}.{name}", value))

    def _counted(self, key, fn):
        def counted(*args, **kwargs):
            self.calls[key] += 1
            return fn(*args, **kwargs)
        counted.__wrapped__ = fn
        return counted


def prepare(mode: Mode) -> tuple[Tally, list[str]]:
    """This process made ready for an engine before JAX starts: the
    environment, the mode's CPU devices and kvref fault model, the facade
    installed as `tpu_raiden` with its calls counted (but for the
    baseline), and the stand-ins."""
    for key, value in {**ENVIRONMENT, **(MLA_ENVIRONMENT if mode.mla else {})}.items():
        os.environ.setdefault(key, value)
    if mode.tp > 1:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={mode.tp}"
    if mode.fault:
        os.environ["KVREF_FAULTS"] = mode.fault
    from tests.engine import standins
    tally = Tally()
    if mode.kind != "baseline":
        from kvref.compat import tpu_sync
        tpu_sync.install("tpu_raiden")
        tally.note_caches(tpu_sync.KVCacheManager)
        for cls in (tpu_sync.KVCacheManager, tpu_sync.KVCacheStore, tpu_sync.TransferFuture):
            tally.wrap(cls)
    return tally, standins.install(mla=mode.mla)


def engine(model: Path, mode: Mode, **kwargs):
    """vLLM's `LLM` over the tiny model, greedy-ready, prefix caching off."""
    from vllm import LLM
    if mode.mla:
        kwargs["additional_config"] = MLA_CONFIG
    return LLM(model=str(model), skip_tokenizer_init=True, dtype=mode.dtype, block_size=mode.block,
               max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256, enable_prefix_caching=False,
               async_scheduling=False, enforce_eager=True, seed=0, load_format="safetensors",
               tensor_parallel_size=mode.tp, kv_cache_dtype=mode.kv_dtype, **kwargs)


def greedy(max_tokens: int = MAX_TOKENS, kv_transfer_params: dict | None = None):
    from vllm import SamplingParams
    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                          extra_args=extra)


def outputs(outs) -> list[dict]:
    return [{"tokens": list(o.outputs[0].token_ids), "num_cached_tokens": o.num_cached_tokens} for o in outs]


def vocab_of(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["vocab_size"]


def run_one(text: str, model: Path) -> dict:
    """One engine run in this process (already inside the namespace)."""
    started, mode = time.monotonic(), Mode.parse(text)
    if mode.kind == "disagg":
        from tests.engine import disagg
        return disagg.consume(model, mode, started)
    tally, applied = prepare(mode)
    hits = []
    kwargs = {}
    if mode.kind == "offload":
        from vllm.config import KVTransferConfig
        from tpu_inference.offload import raiden_offload_connector as roc
        count_hits(roc.RaidenOffloadConnector, hits)
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="RaidenOffloadConnector", kv_role="kv_both",
            kv_connector_module_path="tpu_inference.offload.raiden_offload_connector")
    llm = engine(model, mode, **kwargs)
    up = time.monotonic() - started
    rounds = [outputs(llm.generate([{"prompt_token_ids": p} for p in batch], greedy(), use_tqdm=False))
              for batch in prompts(vocab_of(model), mode.block)]
    return {"mode": mode.text, "startup_s": round(up, 1), "run_s": round(time.monotonic() - started, 1),
            "standins": applied, "rounds": rounds, "external_hits": hits, "facade_calls": dict(tally.calls),
            "caches": tally.caches}


def count_hits(connector, hits: list) -> None:
    """Record each external hit the connector class gives the scheduler."""
    real = connector.get_num_new_matched_tokens

    def matched(self, request, num_computed_tokens):
        found = real(self, request, num_computed_tokens)
        hits.append({"request": str(request.request_id), "computed": num_computed_tokens,
                     "external": found[0] if isinstance(found, tuple) else found})
        return found
    connector.get_num_new_matched_tokens = matched


def in_namespace(python: str, mode: str, model: Path, out: Path) -> dict:
    cmd = ["unshare", "-rn", python, "-m", "probes.run.netns", "tests.engine.driver",
           "--one", mode, "--model", str(model), "--out", str(out)]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=MODE_SECONDS)
    except subprocess.TimeoutExpired as e:
        return {"mode": mode, "error": f"did not end in {MODE_SECONDS} s: {str(e.stderr)[-3000:]}",
                "wall_s": MODE_SECONDS}
    wall = round(time.monotonic() - started, 1)
    if done.returncode or not out.exists():
        return {"mode": mode, "error": done.stderr[-3000:], "returncode": done.returncode, "wall_s": wall}
    return {**json.loads(out.read_text()), "wall_s": wall}


def _jobs(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 8:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of modes from 1 to 8")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "reports/cpu/engine.json")
    parser.add_argument("--one", help="one mode, KIND[@CONFIG...][+FAULT]")
    parser.add_argument("--models", type=Path, default=REPO / "build/engine-models",
                        help="the folder the engine's models are written to, one folder each")
    parser.add_argument("--model", type=Path, help="with --one: the model the mode runs")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated, each KIND[@CONFIG...][+FAULT]; each is compared with the baseline "
                             "of its configuration")
    parser.add_argument("--jobs", type=_jobs, default=1, help="modes run at once (1 to 8)")
    args = parser.parse_args(argv)
    for name, value in vars(args).items():  # argparse takes `--NAME=--` as an empty list, never asking its type
        if isinstance(value, list):
            parser.error(f"--{name}: no value (`--` is not one)")
    for mode in (args.one or args.modes).split(","):
        try:
            Mode.parse(mode)
        except ValueError as e:
            parser.error(str(e))
    if args.one and args.model is None:
        parser.error("--one runs one mode on the model --model names")
    if args.one:
        args.out.write_text(json.dumps(run_one(args.one, args.model), indent=1))
        return 0
    from tests.engine import model
    args.out.parent.mkdir(parents=True, exist_ok=True)  # each mode's own summary is written beside it
    modes = args.modes.split(",")
    for mode in map(Mode.parse, modes):
        model.write(mode.model(args.models), mode.model_config)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = pool.map(lambda m: in_namespace(sys.executable, m, Mode.parse(m).model(args.models),
                                               args.out.with_suffix(f".{m}.json")), modes)
        runs = dict(zip(modes, done))
    tokens = {m: [[o["tokens"] for o in r] for r in run.get("rounds", [])] for m, run in runs.items()}
    same = {m: bool(t) and t == tokens.get(Mode.parse(m).baseline) for m, t in tokens.items()}
    summary = {"identical": all(same.values()), "same_as_baseline": same, "tokens": tokens, "runs": runs}
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({"same_as_baseline": same,
                      **{m: {k: r.get(k) for k in ("startup_s", "run_s", "wall_s", "facade_calls", "error")}
                         for m, r in runs.items()}}, indent=1)[:4000])
    return 0 if summary["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
