"""tpu-inference's RaidenOffloadConnector (offload/raiden_offload_connector.py),
both halves, over one serving shape: requests whose prefixes repeat, so the
store is looked up and hit, blocks are loaded from the host, saved after
the step that wrote them (the step still running), and evicted, and the
evicted chunks unlocked. Every save, load and stored entry is checked byte
for byte (see run)."""

from __future__ import annotations

import os
import random

from tests.connectors.checks import Describer, DeviceCheck, HostCheck, Tally
from tests.connectors.engine import (ZERO, CacheSpec, Content, Mirror, ModelRunner, RowLayout, Scheduler,
                                     create_caches, make_mesh)

STORE_CAPACITY = 8  # the scheduler half's KVCacheStore(capacity=TPU_OFFLOAD_NUM_CPU_CHUNKS)
POOL_SLACK = 8  # the worker half's host pool holds this many chunks more (see run)
MAX_TOKENS_PER_STEP = 128
FAMILIES = 6
PREFIX_BLOCKS = 2
# Which prefix family each step's request continues: repeats after one to
# five steps (hits), never twice in a row (two requests of one prefix in one
# step would both miss and both save it).
PATTERN = [0, 1, 0, 2, 1, 3, 0, 4, 2, 5, 3, 1, 4, 0, 5, 2, 1, 3, 0, 4]
DRAIN_STEPS = 8


def arrivals(steps: int, block_size: int, seed: int = 7) -> list[list[tuple[str, list[int], int]]]:
    """Per step, the requests that arrive: (id, prompt, max_tokens)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(PREFIX_BLOCKS * block_size)] for _ in range(FAMILIES)]
    out = []
    for t in range(steps):
        family = PATTERN[t % len(PATTERN)]
        tail = block_size + (5 if t % 2 else 0)  # a whole block, then a part of one on odd steps
        now = [(f"req-{t}", prefixes[family] + [rng.randrange(32000) for _ in range(tail)], 3)]
        if t % 3 == 2:  # exactly the previous step's prefix: every token a stored hit
            now.append((f"req-{t}-prefix", list(prefixes[PATTERN[(t - 1) % len(PATTERN)]]), 2))
        out.append(now)
    return out


def run(spec: CacheSpec, steps: int, tally: Tally, same_pool: bool = False) -> None:
    """Raises whatever the connector or library raises; the caller records it."""
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

    from tpu_inference.offload.raiden_offload_connector import RaidenOffloadConnector

    tally.at = "building the connector halves"
    bs = spec.block_size
    config = VllmConfig(cache_config=CacheConfig(block_size=bs), model_config=ModelConfig(max_model_len=256),
                        kv_transfer_config=KVTransferConfig("RaidenOffloadConnector", "kv_both"))
    # Both halves read TPU_OFFLOAD_NUM_CPU_CHUNKS when they are built (the
    # store's capacity, the host pool's chunks). With one value for both, a
    # save needs a free chunk while every stored entry keeps its chunk
    # locked, so once the store is full every save is refused and no insert
    # ever evicts: `same_pool` runs that as deployed; otherwise the worker is
    # built with POOL_SLACK chunks more, so that saves go on and evict.
    capacity, pool = STORE_CAPACITY, STORE_CAPACITY + (0 if same_pool else POOL_SLACK)
    tally.counts.update(store_capacity=capacity, host_pool_chunks=pool)
    os.environ["TPU_OFFLOAD_NUM_CPU_CHUNKS"] = str(capacity)
    scheduler_side = RaidenOffloadConnector(config, KVConnectorRole.SCHEDULER, KVCacheConfig())
    os.environ["TPU_OFFLOAD_NUM_CPU_CHUNKS"] = str(pool)
    worker_side = RaidenOffloadConnector(config, KVConnectorRole.WORKER, KVCacheConfig())

    tally.at = "building the caches and registering the runner"
    mesh = make_mesh(spec)
    caches = create_caches(spec, mesh)
    layout = RowLayout(caches[0].shape, caches[0].dtype, bs, spec.use_mla)
    tally.counts.update(cache=f"{caches[0].dtype}{list(caches[0].shape)} x{len(caches)} "
                        f"{caches[0].sharding.spec} over {dict(mesh.shape)}")
    content = Content(layout)
    runner = ModelRunner(caches, mesh, layout, MAX_TOKENS_PER_STEP)
    worker_side.register_runner(runner)
    manager = worker_side.connector_worker.raiden_manager
    store = scheduler_side.connector_scheduler.kv_store

    mirror = Mirror(spec.num_blocks, layout.rows)
    describer = Describer(content)
    device = DeviceCheck("offload", runner, mirror, content, describer)
    host = HostCheck(manager, runner, mirror, content, describer)
    tally.counts["host_chunks_read"] = "reference.read_block_bytes" if host.available else "not readable"
    scheduler = Scheduler(scheduler_side, bs, spec.num_blocks, "offload")
    padding = [ZERO] * (layout.rows - bs)
    hash_rows: dict[bytes, list[bytes]] = {}  # a block hash -> the row keys of its block

    def keys_of(req_id):
        return scheduler.requests[req_id].token_keys

    def learn(req_id):
        seq = scheduler.requests[req_id]
        for pos, key in enumerate(seq.token_keys):
            describer.name(key, f"the row of token {pos} of {req_id}")
        for i, h in enumerate(seq.request.block_hashes):
            hash_rows.setdefault(h, seq.token_keys[i * bs:(i + 1) * bs] + padding)

    plan_arrivals = arrivals(steps, bs)
    carried = False
    for t in range(steps + DRAIN_STEPS):
        if t >= steps and not scheduler.running and not scheduler.waiting:
            if carried:
                break  # drained, and one step more has carried the last staged unlocks
            carried = True
        where = tally.at = f"step {t}"
        for req_id, prompt, max_tokens in (plan_arrivals[t] if t < steps else []):
            scheduler.add(Request(req_id, prompt, max_tokens))
            learn(req_id)
        plan = scheduler.schedule()
        meta = plan.output.kv_connector_metadata
        loads = [(m.req_id, m.load_spec) for m in meta.requests_meta if m.load_spec and m.load_spec.can_load]
        saves = [(m.req_id, m.save_spec) for m in meta.requests_meta
                 if m.save_spec and not m.save_spec.skip_save and m.save_spec.src_blocks]
        tally.add("evictions_unlocked", len(meta.pending_unlocks))
        inputs = runner.step_inputs(plan.writes, keys_of, content) if plan.writes else None
        kv_out, record = runner.execute(worker_side, plan.output, inputs)
        tally.add("steps")
        tally.add("donating_steps", int(record["donated"]))

        for req_id, spec_ in loads:  # landed before the step ran
            hashes = scheduler.requests[req_id].request.block_hashes
            skip = spec_.num_skip_leading_tokens // bs
            tally.add("hit_requests")
            tally.add("hit_blocks", spec_.num_matched_tokens // bs)
            for i, (chunk, block) in enumerate(zip(spec_.src_chunks, spec_.dst_blocks)):
                want = hash_rows[hashes[skip + i]]
                if mirror.chunks.get(chunk) != want:
                    tally.mismatch(f"{where}: load of {req_id} block {skip + i}: the store names host chunk "
                                   f"{chunk}, which holds another block's bytes (or none)")
                mirror.set_block(block, mirror.chunks.get(chunk, [ZERO] * layout.rows))
                tally.add("loads")
        for req_id, pos, block in plan.writes:
            mirror.blocks[block][pos % bs] = keys_of(req_id)[pos]

        stats = kv_out.kv_connector_stats
        saved = stats.data.get("finished_save_chunks", {}) if stats is not None else {}
        new_chunks = []
        for req_id, spec_ in saves:
            chunks = saved.get(req_id)
            if chunks is None:
                tally.add("saves_refused", len(spec_.src_blocks))
                continue
            if len(chunks) != len(spec_.src_blocks):
                tally.mismatch(f"{where}: save of {req_id}: {len(spec_.src_blocks)} blocks, {len(chunks)} chunks")
            for chunk, block, h in zip(chunks, spec_.src_blocks, spec_.block_hashes):
                mirror.chunks[chunk] = list(mirror.blocks[block])
                if mirror.blocks[block] != hash_rows[h]:
                    tally.mismatch(f"{where}: save of {req_id}: block {block} does not hold its hash's rows")
                if host.available:
                    host.check(tally, f"{where}: save of {req_id} block {block}", chunk, mirror.chunks[chunk])
                    tally.transfers_checked += 1
                new_chunks.append((chunk, h))
                tally.add("saves")

        scheduler.update_from_output(plan, kv_out)  # inserts the saved hashes, staging evictions
        device.check(tally, where)
        tally.transfers_checked += sum(len(s.dst_blocks) for _, s in loads)

        # The store as the scheduler half left it, read with lookup (which
        # neither pins nor reorders in kvref.kv_store; the connector's own
        # lookups are the scheduler's). A chunk saved and not stored stays
        # locked: nothing unlocks it.
        for chunk, h in new_chunks:
            found = store.lookup([h])
            if not found or found[0][1].data_replica_idx != chunk:
                tally.add("saved_chunks_not_stored")
        for h, keys in hash_rows.items():  # every stored entry names a chunk holding its block
            found = store.lookup([h])
            if not found:
                continue
            chunk = found[0][1].data_replica_idx
            tally.add("store_entries_checked")
            if mirror.chunks.get(chunk) != keys:
                tally.mismatch(f"{where}: the store names host chunk {chunk} for a hash whose block it does "
                               "not hold")
            elif host.available:
                host.check(tally, f"{where}: stored entry in chunk {chunk}", chunk, keys)

    tally.add("lookups", scheduler.lookups)
    aliasing = runner.aliasing()
    tally.aliasing = {"donating_steps": len(aliasing), "aliased": sum(aliasing),
                      "not_aliased_steps": [i for i, a in enumerate(aliasing) if not a][:5]}
    tally.counts["unfinished_requests"] = len(scheduler.running) + len(scheduler.waiting)

