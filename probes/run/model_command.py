"""`kvprobe model`: will this model, at this TP degree and block size, offload
on this TPU? Each layer's cache as tpu-inference allocates it
(kvref.serving), one device's shard as the compiler lays it out, whether its
blocks are byte ranges, the host pool it needs, and then the round trip on
those caches, run by the same runner as `kvprobe run`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import kvref
from kvref.generations import DEFAULT_GENERATION
from kvref.serving import PRESETS, ServingCache, model_figures, serving_cache
from kvref.sharding import placements_of
from probes.iut import iut as declared_iut
from probes.run import options
from probes.run.runner import CaseResult, run_cases
from probes.run.subcommand import Command, stdout_console
from probes.suite.matrix import MatrixRow, build_cases
from probes.suite.ownership import row_byte_ranges
from probes.suite.predict import prediction


@dataclass(frozen=True)
class ShardFacts:
    generation: str
    shard: kvref.Shape  # one device's part, as laid out
    source: str
    slice_bytes: int | None  # bytes per block per device; None: blocks are not byte ranges
    reason: str  # why not, or ""
    host_slots: int  # the parts a host block holds

    def host_pool_bytes(self, cache: ServingCache, host_blocks: int) -> int | None:
        """One host's pool for `host_blocks` blocks of every layer."""
        if self.slice_bytes is None:
            return None
        return host_blocks * cache.layers * self.host_slots * self.slice_bytes


def shard_facts(cache: ServingCache, generation: str, iut: str) -> ShardFacts:
    shard, source = declared_iut(iut).layout_of(generation, cache.key, cache.sharding)
    rows = row_byte_ranges(str(shard))  # by packing row numbers, not by asking kvref.major_slice
    slots = 1 if cache.sharding is None else placements_of(cache.sharding.shard_starts(cache.key.dims))[0].host_slots
    why = "" if rows.contiguous else kvref.major_slice(shard).reason
    return ShardFacts(generation, shard, source, rows.slice_bytes if rows.contiguous else None, why, slots)


def probe_caches(cache: ServingCache, name: str, generations: list[str], iut: str,
                 jobs: int | None = None) -> list[CaseResult]:
    """The round trip of this cache (over its mesh) on each generation."""
    row = MatrixRow(name, cache.key, ("roundtrip",), cache.sharding)
    return run_cases(build_cases(generations, [row], ("roundtrip",), iut), jobs)


def all_agree(results: list[CaseResult]) -> bool:
    """Whether every round trip earned a verdict the reference predicts."""
    return all(prediction(r.case).admits(r.outcome.verdict) for r in results)


def model_cache(model: str, dtype: str, block_size: int, tp: int, dp: int) -> ServingCache:
    return serving_cache(model_figures(model), kvref.element_type(dtype).name, block_size, tp, dp)


def describe_model(cache: ServingCache) -> str:
    m = cache.model
    what = (f"MLA latent {m.mla_latent} + rope {m.mla_rope}" if m.is_mla
            else f"{m.kv_heads} kv heads x head dim {m.head_dim}")
    return f"{m.name}: {m.layers} layers, {what}; TP {cache.tp}, DP {cache.dp}"


def render(cache: ServingCache, facts: list[ShardFacts], results: list[CaseResult], host_blocks: int):
    """A rich table: per generation, one device's shard as laid out, whether
    its blocks are byte ranges, the host pool, and the round trip's verdict
    (with the prediction where they disagree)."""
    from rich.table import Table

    over = f"over {cache.sharding}" if cache.sharding else "on one device"
    sources = sorted({f.source for f in facts})
    table = Table(title=f"{describe_model(cache)}\neach layer {cache.key} {over}",
                  caption=f"layouts: {'; '.join(sources)}")
    table.add_column("TPU", no_wrap=True)
    table.add_column("one device's shard", overflow="fold")
    table.add_column("bytes/block", no_wrap=True)
    table.add_column(f"host pool ({host_blocks} blocks)", justify="right", no_wrap=True)
    table.add_column("round trip", min_width=8)
    verdicts = {r.case.generation: r for r in results}
    for f in facts:
        pool = f.host_pool_bytes(cache, host_blocks)
        found = verdicts.get(f.generation)
        if found is None:
            verdict = "not run"
        else:
            predicted = prediction(found.case)
            verdict = found.outcome.verdict if predicted.admits(found.outcome.verdict) else \
                f"[bold red]{found.outcome.verdict}[/] (predicted {predicted}): {found.outcome.detail[:120]}"
        blocks = (f"{f.slice_bytes:,} x {f.host_slots}" if f.host_slots > 1 else f"{f.slice_bytes:,}") \
            if f.slice_bytes else f"not byte ranges: {f.reason}"
        table.add_row(f.generation, str(f.shard), blocks, f"{pool / 2**30:,.2f} GiB" if pool is not None else "-",
                      verdict)
    return table


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=f"a preset ({', '.join(PRESETS)}) or a Hugging Face config.json file")
    parser.add_argument("--dtype", default="bf16", help="cache type: bf16, f8e4m3fn (fp8), f32, ... (default bf16)")
    parser.add_argument("--block-size", type=options.positive, default=16, help="tokens per block (default 16)")
    parser.add_argument("--tp", type=options.positive, default=1, help="tensor-parallel degree: the model axis")
    parser.add_argument("--dp", type=options.positive, default=1, help="data-parallel degree: splits the blocks")
    options.add(parser, "generation", generation=[DEFAULT_GENERATION])
    parser.add_argument("--host-blocks", type=options.positive, default=4096,
                        help="host blocks per layer for the host pool (default 4096)")
    options.add_one(parser, "iut", "kvref-sim", "the implementation the round trip runs on")
    parser.add_argument("--no-probe", action="store_true", help="layouts and host pool only")


def run(args) -> int:
    """1 when a round trip earned other than its prediction."""
    cache = model_cache(args.model, args.dtype, args.block_size, args.tp, args.dp)
    for gen in args.generation:
        declared_iut(args.iut).check_target(gen)
    facts = [shard_facts(cache, gen, args.iut) for gen in args.generation]
    results = [] if args.no_probe else probe_caches(
        cache, f"{cache.model.name}-bs{args.block_size}-tp{args.tp}-dp{args.dp}", args.generation, args.iut)
    stdout_console().print(render(cache, facts, results, args.host_blocks))
    return 0 if all_agree(results) else 1


COMMAND = Command("model", "will this model, at this TP degree and block size, offload on this TPU: its caches "
                  "as tpu-inference allocates them, per-shard layouts, host pool, and the round trip on them",
                  arguments, run)
