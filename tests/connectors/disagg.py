"""tpu-inference's disaggregated prefill/decode connector
(distributed/tpu_raiden_connector.py, TPUConnector), a producer engine and a
consumer engine in one process, each with its own caches, manager and
control port on 127.0.0.1. Each round the producer prefills a request
(max_tokens=1) and registers the previous one's blocks (register_read, in
its next step's start_load_kv); the consumer takes that request with the
producer's kv_transfer_params and pulls its blocks (start_read) while both
engines go on running donating steps; each pull reported done (poll_stats)
is checked byte for byte against the producer's blocks."""

from __future__ import annotations

import os
import random
import socket
import time

from tests.connectors.checks import Describer, DeviceCheck, Tally, quiet_compare
from tests.connectors.engine import CacheSpec, Content, Mirror, ModelRunner, RowLayout, Scheduler, create_caches, \
    make_mesh

MAX_MODEL_LEN = 128  # the consumer's manager gets max_blocks = MAX_MODEL_LEN // block_size per pull slot
MAX_TOKENS_PER_STEP = 128
DRAIN_SECONDS = 60.0
DRAIN_ROUNDS = 400
STALL_SECONDS = 5.0  # a drain with nothing settling for this long stops (a failed pull stays pending: see run)
IDLE_SLEEP = 0.02


def free_ports(n: int) -> list[int]:
    """Ports free on 127.0.0.1 now (bound and released): each engine's TPU_KV_TRANSFER_PORT."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Engine:
    """One side: both halves of a TPUConnector, its scheduler and runner."""

    def __init__(self, name: str, role: str, port: int, spec: CacheSpec, tally: Tally):
        from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.kv_cache_interface import KVCacheConfig

        from tpu_inference.distributed.tpu_raiden_connector import TPUConnector

        self.name, self.tally, self.bs = name, tally, spec.block_size
        # Each engine is a process of its own in serving, with its own
        # TPU_KV_TRANSFER_PORT: both halves read it when built.
        os.environ["TPU_KV_TRANSFER_PORT"] = str(port)
        config = VllmConfig(cache_config=CacheConfig(block_size=spec.block_size),
                            model_config=ModelConfig(max_model_len=MAX_MODEL_LEN),
                            kv_transfer_config=KVTransferConfig("TPUConnector", role))
        self.scheduler_side = TPUConnector(config, KVConnectorRole.SCHEDULER, KVCacheConfig())
        self.worker_side = TPUConnector(config, KVConnectorRole.WORKER, KVCacheConfig())
        mesh = make_mesh(spec)
        caches = create_caches(spec, mesh)
        self.layout = RowLayout(caches[0].shape, caches[0].dtype, spec.block_size, spec.use_mla)
        self.content = Content(self.layout)
        self.runner = ModelRunner(caches, mesh, self.layout, MAX_TOKENS_PER_STEP)
        self.worker_side.register_runner(self.runner)
        self.manager = self.worker_side.connector_worker.kv_manager
        self.mirror = Mirror(spec.num_blocks, self.layout.rows)
        self.describer = Describer(self.content)
        self.device = DeviceCheck(name, self.runner, self.mirror, self.content, self.describer)
        self.scheduler = Scheduler(self.scheduler_side, spec.block_size, spec.num_blocks, name)
        self.pulling: dict[str, list[int]] = {}  # consumer: request -> local blocks being pulled into
        self.recheck: list[int] = []  # pulled blocks found wrong when reported done: looked at once more

    def add(self, request) -> None:
        self.scheduler.add(request)
        seq = self.scheduler.requests[request.request_id]
        for pos, key in enumerate(seq.token_keys):
            self.describer.name(key, f"the row of token {pos} of {request.request_id} on {self.name}")

    def keys_of(self, req_id):
        return self.scheduler.requests[req_id].token_keys

    def step(self, where: str, expected_pulls: dict) -> tuple[list[str], set, set]:
        """One engine step; returns the requests finished, received (pull done) and sent."""
        if self.recheck:  # a pull reported done with wrong bytes: did they land since?
            still = quiet_compare(self.runner, self.mirror, self.content, self.recheck)
            self.tally.add("pulled_blocks_right_one_step_later", len(self.recheck) - len(still))
            self.tally.add("pulled_blocks_still_wrong_one_step_later", len(still))
            self.recheck = []
        plan = self.scheduler.schedule()
        meta = plan.output.kv_connector_metadata
        for req_id, load in meta.reqs_to_load.items():
            if load.remote_block_ids is not None and req_id not in self.pulling:
                self.pulling[req_id] = list(load.local_block_ids)
                self.mirror.in_flux.update(load.local_block_ids)
                self.tally.add("pulls_started")
        self.tally.add("registrations", len(meta.reqs_to_send))
        inputs = self.runner.step_inputs(plan.writes, self.keys_of, self.content) if plan.writes else None
        kv_out, record = self.runner.execute(self.worker_side, plan.output, inputs)
        self.tally.add(f"{self.name}_steps")
        self.tally.add(f"{self.name}_donating_steps", int(record["donated"]))
        for req_id, pos, block in plan.writes:
            self.mirror.blocks[block][pos % self.bs] = self.keys_of(req_id)[pos]
        received = set(kv_out.finished_recving or ())
        for req_id in received:
            self.check_pull(where, req_id, expected_pulls)
        sent = set(kv_out.finished_sending or ())
        self.tally.add("sends_done", len(sent))
        finished = self.scheduler.update_from_output(plan, kv_out)
        self.device.check(self.tally, f"{where} ({self.name})")
        return finished, received, sent

    def check_pull(self, where: str, req_id: str, expected_pulls: dict) -> None:
        local = self.pulling.pop(req_id, None)
        if local is None:
            self.tally.mismatch(f"{where}: {req_id} reported received, but no pull of it was started")
            return
        rows = expected_pulls[req_id]
        if len(rows) != len(local):
            self.tally.mismatch(f"{where}: {req_id}: {len(rows)} blocks sent, {len(local)} local blocks")
        previous = {block: list(self.mirror.blocks[block]) for block in local}
        for block, keys in zip(local, rows):
            self.mirror.set_block(block, keys)
            self.mirror.in_flux.discard(block)
        bad_before = self.tally.mismatches
        bad = self.device.check(self.tally, f"{where}: pull of {req_id}", blocks=local, previous=previous)
        if self.tally.mismatches != bad_before:
            self.recheck = quiet_compare(self.runner, self.mirror, self.content, local)
        self.tally.transfers_checked += len(local)
        self.tally.add("pulls_done")
        self.tally.add("pulled_blocks", len(local))
        self.tally.add("pulled_blocks_mismatching", bad)

    @property
    def idle(self) -> bool:
        s = self.scheduler
        return not (s.running or s.waiting or s.held or self.pulling)


def run(spec: CacheSpec, steps: int, tally: Tally) -> None:
    from vllm.v1.request import Request

    tally.at = "building both engines"
    producer_port, consumer_port = free_ports(2)
    tally.counts.update(producer_port=producer_port, consumer_port=consumer_port)
    producer = Engine("producer", "kv_producer", producer_port, spec, tally)
    consumer = Engine("consumer", "kv_consumer", consumer_port, spec, tally)
    cache = producer.runner.kv_caches[0]
    tally.counts["cache"] = (f"{cache.dtype}{list(cache.shape)} x{len(producer.runner.kv_caches)} "
                             f"{cache.sharding.spec} over {dict(producer.runner.mesh.shape)}")
    tally.counts["producer_endpoints"] = repr(producer.manager.get_local_endpoints())
    rng = random.Random(11)
    bs = spec.block_size
    registered_next: list[tuple[str, dict, list]] = []  # finished on the producer; registered in its next step
    settled = 0  # requests finished, pulled or sent so far: what a drain waits on
    expected: dict[str, list[list[bytes]]] = {}  # consumer request -> the producer's rows of each block sent

    def producer_step(where):
        nonlocal registered_next, settled
        finished, _, sent = producer.step(where, expected)
        settled += len(finished) + len(sent)
        handed = registered_next
        registered_next = []
        for req_id in finished:
            params = producer.scheduler.finished_params.get(req_id) or {}
            if params.get("remote_block_ids"):
                rows = [list(producer.mirror.blocks[b]) for b in params["remote_block_ids"]]
                registered_next.append((req_id, params, rows))
                tally.add("producer_requests_to_send")
        return handed  # finished before this step: this step's start_load_kv registered them

    def hand_over(registered):
        """The proxy's part: each request the producer registered goes to the
        consumer, same prompt, with the producer's kv_transfer_params."""
        for req_id, params, rows in registered:
            d_id = f"d-{req_id}"  # the engines' request ids differ; the pull is keyed by uuid
            expected[d_id] = rows
            consumer.add(Request(d_id, producer.scheduler.requests[req_id].request.prompt_token_ids, 2,
                                 kv_transfer_params=dict(params)))

    for t in range(steps):
        where = tally.at = f"round {t}"
        blocks = 2 + t % 2
        prompt = [rng.randrange(32000) for _ in range(blocks * bs + (7 if t % 3 == 1 else 0))]
        producer.add(Request(f"p-{t}", prompt, 1))
        hand_over(producer_step(where))
        consumer.add(Request(f"d-local-{t}", [rng.randrange(32000) for _ in range(bs + 4)], 2))
        finished, received, _ = consumer.step(where, expected)
        settled += len(finished) + len(received)

    # Drain: both engines step (no new requests) until every request has
    # finished and every pull and send settled. A pull that failed is left
    # pending by the connector (get_finished logs failed_recving and never
    # reports it), so a drain that sees nothing settle for STALL_SECONDS stops.
    deadline = time.monotonic() + DRAIN_SECONDS
    rounds, last_settled, last_change = 0, settled, time.monotonic()
    stop = "drained"
    while True:
        if producer.idle and consumer.idle and not registered_next:
            break
        now = time.monotonic()
        if settled != last_settled:
            last_settled, last_change = settled, now
        if now - last_change > STALL_SECONDS:
            stop = f"stalled: nothing settled for {STALL_SECONDS:.0f} s"
            break
        if rounds >= DRAIN_ROUNDS or now > deadline:
            stop = f"limit: {rounds} rounds, {DRAIN_SECONDS:.0f} s"
            break
        rounds += 1
        where = tally.at = f"drain {rounds}"
        hand_over(producer_step(where))
        finished, received, _ = consumer.step(where, expected)
        settled += len(finished) + len(received)
        if not (producer.scheduler.running or consumer.scheduler.running):
            time.sleep(IDLE_SLEEP)
    tally.counts["drain_rounds"] = rounds
    tally.counts["drain_ended"] = stop
    tally.counts["pulls_unsettled"] = sorted(consumer.pulling)
    reasons = {}
    reference = getattr(consumer.manager, "reference", None)
    for req_id in consumer.pulling:
        if reference is not None and hasattr(reference, "failure_reason"):
            try:
                reasons[req_id] = reference.failure_reason(req_id)
            except Exception as e:  # noqa: BLE001 (a reason we could not get is said as such)
                reasons[req_id] = f"failure_reason raised {type(e).__name__}: {e}"
    if reasons:
        tally.counts["unsettled_reasons"] = reasons
    tally.counts["producer_blocks_held_at_end"] = sum(len(b) for b in producer.scheduler.held.values())
    for engine in (producer, consumer):
        aliasing = engine.runner.aliasing()
        tally.aliasing[engine.name] = {"donating_steps": len(aliasing), "aliased": sum(aliasing),
                                       "not_aliased_steps": [i for i, a in enumerate(aliasing) if not a][:5]}
