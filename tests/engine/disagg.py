"""A disaggregated producer and consumer under the engine: two vLLM engines,
each a process of its own in one loopback-only namespace, each with
tpu-inference's TPUConnector (distributed/tpu_raiden_connector.py) over
kvref.compat.tpu_sync, as a serving proxy drives them.

For each round of prompts the producer prefills them (max_tokens=1) and
hands back each request's kv_transfer_params (its blocks, uuid and
address); it runs its engine's next step, where the connector registers
those blocks (register_read), as a serving engine's loop does (the next
round's steps report what was pulled, poll_stats, and free it). The consumer
generates each prompt with those params: its scheduler takes the prompt's
full blocks as external, the connector pulls them (start_read) while the
engine waits, and it decodes from them. Its tokens must be the baseline's,
token for token.

`consume` runs in the namespace's first process and starts the producer
(`python -m tests.engine.disagg --produce MODEL`), which speaks one JSON
line per round on its stdin and stdout."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.engine import driver

CONNECTOR = dict(kv_connector="TPUConnector", kv_connector_module_path="tpu_inference.distributed.tpu_raiden_connector")
# A pull the consumer waits for longer than this fails (the connector then
# leaves its request waiting for good: docs/engine.md); the engine's every
# step here takes well under it.
PULL_TIMEOUT_S = "60"
ROUND_SECONDS = 600  # a round that has not returned by then ends the process with every thread's stack
# Where each engine's manager listens. The namespace is the mode's own, so these are free; they lie below
# the ephemeral range, where vLLM's own free-port picks (its distributed init) cannot take them first.
PRODUCER_PORT, CONSUMER_PORT = 9100, 9101  # 9100: tpu-inference's default TPU_KV_TRANSFER_PORT
REGISTER_STEPS = 50  # producer steps after a prefill, at most, until its connector has registered its blocks


def environment(port: int) -> None:
    os.environ["TPU_KV_TRANSFER_PORT"] = str(port)  # where this engine's manager listens and is found
    os.environ["TPU_P2P_WAIT_PULL_TIMEOUT"] = PULL_TIMEOUT_S
    os.environ["RAIDEN_UNSAFE_SKIP_BUFFER_LOCK"] = "false"  # the donation path a serving engine takes


def side(model: Path, mode: driver.Mode, role: str, port: int):
    """An engine of `role` with the disaggregated connector over the facade:
    (llm, tally of the facade's calls, stand-ins, external hits)."""
    environment(port)
    tally, applied = driver.prepare(mode)
    from vllm.config import KVTransferConfig
    from tpu_inference.distributed import tpu_raiden_connector
    hits: list[dict] = []
    driver.count_hits(tpu_raiden_connector.TPUConnector, hits)
    llm = driver.engine(model, mode, kv_transfer_config=KVTransferConfig(kv_role=role, **CONNECTOR))
    return llm, tally, applied, hits


def produce(model: Path, mode: driver.Mode, port: int) -> int:
    """The producer's process: a round of prompts per stdin line (null ends
    it), its outputs and kv_transfer_params per stdout line."""
    # The reply channel is stdout as it was; the engine's own output (Python's
    # and its libraries') goes to stderr from here on.
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    llm, tally, _, _ = side(model, mode, "kv_producer", port)
    print(json.dumps({"ready": True}), file=reply, flush=True)
    while True:
        batch = json.loads(sys.stdin.readline() or "null")
        # A producer stuck in a round must not outlive the consumer, whose own watchdog ends it.
        faulthandler.dump_traceback_later(ROUND_SECONDS, exit=True)
        if batch is None:
            print(json.dumps({"facade_calls": dict(tally.calls), "caches": tally.caches}), file=reply, flush=True)
            return 0
        registered = tally.calls["KVCacheManager.register_read"]
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], driver.greedy(1), use_tqdm=False)
        sent = [o.kv_transfer_params for o in outs]
        steps = 0  # the connector registers a request's blocks in the step after it finished
        while tally.calls["KVCacheManager.register_read"] - registered < sum(bool(p) for p in sent) \
                and steps < REGISTER_STEPS:
            llm.llm_engine.step()
            steps += 1
        print(json.dumps({"outputs": driver.outputs(outs), "kv_transfer_params": sent, "steps": steps}),
              file=reply, flush=True)
        faulthandler.cancel_dump_traceback_later()


def consume(model: Path, mode: driver.Mode, started: float) -> dict:
    """The consumer's run, in this process, against a producer it starts."""
    producer = subprocess.Popen([sys.executable, "-m", "tests.engine.disagg", "--produce", str(model),
                                 "--mode", mode.text, "--port", str(PRODUCER_PORT)],
                                cwd=driver.REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        faulthandler.dump_traceback_later(ROUND_SECONDS, exit=True)
        llm, tally, applied, hits = side(model, mode, "kv_consumer", CONSUMER_PORT)
        up = time.monotonic() - started
        ask(producer, None)  # the producer is up too
        rounds, prefills = [], []
        for batch in driver.prompts(driver.vocab_of(model), mode.block):
            faulthandler.dump_traceback_later(ROUND_SECONDS, exit=True)
            made = ask(producer, batch)
            prefills.append(made)
            params = [driver.greedy(kv_transfer_params=p or None) for p in made["kv_transfer_params"]]
            rounds.append(driver.outputs(llm.generate([{"prompt_token_ids": p} for p in batch], params,
                                                      use_tqdm=False)))
        produced = ask(producer, "end")
        faulthandler.cancel_dump_traceback_later()
        return {"mode": mode.text, "startup_s": round(up, 1),
                "run_s": round(time.monotonic() - started, 1), "standins": applied, "rounds": rounds,
                "external_hits": hits, "facade_calls": dict(tally.calls), "caches": tally.caches,
                "producer": {**produced, "prefills": prefills}}
    finally:
        producer.kill()
        producer.wait()


def ask(producer: subprocess.Popen, batch) -> dict:
    """One request of the producer: None waits for it to be up, "end" ends it."""
    if batch is not None:
        producer.stdin.write(json.dumps(None if batch == "end" else batch) + "\n")
        producer.stdin.flush()
    line = producer.stdout.readline()
    if not line:
        raise RuntimeError(f"the producer exited {producer.wait()} without answering")
    return json.loads(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The producer's side of the disaggregated mode.")
    parser.add_argument("--produce", type=Path, required=True, metavar="MODEL")
    parser.add_argument("--mode", type=driver.Mode.parse, required=True, help="KIND[@CONFIG...][+FAULT], as the consumer's")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    return produce(args.produce, args.mode, args.port)


if __name__ == "__main__":
    sys.exit(main())
