"""The serving engine around a connector, as vLLM and tpu-inference's model
runner drive it, small enough to follow: a scheduler (blocks, requests,
the connector's scheduler-side calls in vLLM's order), a model runner (the
worker-side calls around a jitted model step that takes the caches
donated), and a mirror of what every cache row and host chunk must hold.

The model step writes, for each token it computes, that token's row of
its block in every layer: bytes drawn from the token's prefix (a chain hash
of the tokens up to it) and the layer. So a row's bytes are known wherever
they came from (a model step, a load from the host, a pull from another
engine), and two requests that share a prefix write the same rows."""

from __future__ import annotations

import collections
import hashlib
import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from vllm.forward_context import get_forward_context
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

ZERO = b""  # the key of a row nothing wrote: create_kv_caches fills the caches with zeros
NULL_BLOCK = 0  # vLLM's null block: never given to a request; padding writes land here


# --- the caches -------------------------------------------------------------

@dataclass(frozen=True)
class CacheSpec:
    """One serving configuration of the KV cache, built by create_kv_caches."""
    name: str
    dtype: str  # "bfloat16" | "float8_e4m3fn"
    data: int  # DP
    model: int  # TP
    num_kv_heads: int
    head_size: int
    use_mla: bool = False
    num_blocks: int = 48
    block_size: int = 16
    layers: int = 2


SHAPES = {
    "bf16-tp4": CacheSpec("bf16-tp4", "bfloat16", 1, 4, num_kv_heads=4, head_size=128),
    "bf16-dp2-tp4": CacheSpec("bf16-dp2-tp4", "bfloat16", 2, 4, num_kv_heads=4, head_size=128),
    "fp8-tp4": CacheSpec("fp8-tp4", "float8_e4m3fn", 1, 4, num_kv_heads=8, head_size=128),
    # MLA: one latent per token (kv_lora_rank 128 + rope 64), replicated over TP
    "mla-tp4": CacheSpec("mla-tp4", "bfloat16", 1, 4, num_kv_heads=1, head_size=192, use_mla=True),
}


def make_mesh(spec: CacheSpec) -> Mesh:
    devices = jax.devices()[:spec.data * spec.model]
    return Mesh(np.array(devices).reshape(spec.data, spec.model), ("data", "model"))


def create_caches(spec: CacheSpec, mesh: Mesh) -> list[jax.Array]:
    """The caches as serving allocates them: tpu-inference's own create_kv_caches."""
    from tpu_inference.runner.kv_cache import create_kv_caches
    return create_kv_caches(spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size, mesh,
                            [f"layer.{i}" for i in range(spec.layers)], getattr(jnp, spec.dtype),
                            use_mla=spec.use_mla)


class RowLayout:
    """Where a block's token rows are in a cache of this shape: RPA caches
    (blocks, block_size, heads, packing, head_dim) have token t at [b, t];
    MLA caches (blocks, rows, packing, dim) at [b, t // packing, t % packing],
    with rows * packing >= block_size (the rest is padding)."""

    def __init__(self, shape: tuple[int, ...], dtype, block_size: int, mla: bool):
        self.shape, self.mla, self.block_size = tuple(shape), mla, block_size
        self.dtype = np.dtype(dtype)
        self.uint = np.dtype(f"uint{8 * self.dtype.itemsize}")
        if mla:
            self.packing = shape[2]
            self.rows = shape[1] * shape[2]
            self.row_shape = tuple(shape[3:])
        else:
            self.packing = 1
            self.rows = shape[1]
            self.row_shape = tuple(shape[2:])
        assert self.rows >= block_size
        self.row_elems = math.prod(self.row_shape)

    def block_from_rows(self, rows: np.ndarray) -> np.ndarray:
        """(rows, *row_shape) -> one block as the cache holds it."""
        return rows.reshape(self.shape[1:])

    def rows_of(self, blocks: np.ndarray) -> np.ndarray:
        """(n, *block) -> (n, rows, *row_shape)."""
        return blocks.reshape((blocks.shape[0], self.rows) + self.row_shape)


class Content:
    """The bytes of a row: drawn from (row key, layer); the zero key is zeros."""

    def __init__(self, layout: RowLayout):
        self.layout = layout
        self._rows: dict[tuple[bytes, int], np.ndarray] = {}

    def row(self, key: bytes, layer: int) -> np.ndarray:
        found = self._rows.get((key, layer))
        if found is None:
            shape = self.layout.row_shape
            if key == ZERO:
                found = np.zeros(shape, self.layout.uint)
            else:
                seed = int.from_bytes(hashlib.sha256(key + bytes([layer])).digest()[:8], "little")
                info = np.iinfo(self.layout.uint)
                found = np.random.default_rng(seed).integers(0, int(info.max) + 1, size=shape,
                                                             dtype=self.layout.uint)
            self._rows[(key, layer)] = found
        return found

    def known(self):
        """((key, layer), row) for every row drawn so far."""
        return self._rows.items()

    def block(self, keys: list[bytes], layer: int) -> np.ndarray:
        """One block (as the cache holds it) whose rows have these keys."""
        return self.layout.block_from_rows(np.stack([self.row(k, layer) for k in keys]))


# --- requests ---------------------------------------------------------------

def chain(parent: bytes, tokens) -> bytes:
    return hashlib.sha256(parent + np.asarray(list(tokens), np.int64).tobytes()).digest()


class Sequence:
    """A request's tokens with vLLM's block hashes (bytes, over whole blocks)
    and each token's row key (the chain hash of the tokens up to it)."""

    def __init__(self, request: Request, block_size: int):
        self.request, self.block_size = request, block_size
        self.token_keys: list[bytes] = []
        self.refresh()

    def refresh(self) -> None:
        tokens = self.request.all_token_ids
        while len(self.token_keys) < len(tokens):
            parent = self.token_keys[-1] if self.token_keys else b"root"
            self.token_keys.append(chain(parent, [tokens[len(self.token_keys)]]))
        hashes = self.request.block_hashes
        while (len(hashes) + 1) * self.block_size <= len(tokens):
            i = len(hashes)
            hashes.append(chain(hashes[-1] if hashes else b"blocks",
                                tokens[i * self.block_size:(i + 1) * self.block_size]))

    def next_token(self) -> int:
        return int.from_bytes(self.token_keys[-1][:4], "little") % 32000


# --- the mirror of what caches and host chunks hold ---------------------------

class Mirror:
    """Per block, per row: the key of what the row holds; per host chunk the
    same for a saved block. Blocks being written by a pull are `in_flux`
    (not checked until the pull is reported done); a block found wrong is
    `tainted` (said once, then not checked until wholly rewritten)."""

    def __init__(self, num_blocks: int, rows: int):
        self.rows = rows
        self.blocks = [[ZERO] * rows for _ in range(num_blocks)]
        self.chunks: dict[int, list[bytes]] = {}
        self.in_flux: set[int] = set()
        self.tainted: set[int] = set()  # found wrong once; not checked again until wholly rewritten

    def set_block(self, block: int, keys: list[bytes]) -> None:
        """The block wholly rewritten (a load, a pull)."""
        self.blocks[block] = list(keys)
        self.tainted.discard(block)


# --- the scheduler ------------------------------------------------------------

@dataclass
class StepPlan:
    """What one schedule() decided, beside the SchedulerOutput."""
    output: SchedulerOutput
    writes: list[tuple[str, int, int]] = field(default_factory=list)  # (req, token position, block)


class Scheduler:
    """vLLM's scheduler, reduced to what a connector sees: FIFO admission,
    one token per running request per step, prefix lookups through the
    connector (no local prefix cache), async loads (WAITING_FOR_REMOTE_KVS),
    request_finished when a request stops, blocks held while the connector
    sends them, and update_connector_output with each step's output."""

    def __init__(self, connector, block_size: int, num_blocks: int, name: str):
        self.connector, self.block_size, self.name = connector, block_size, name
        self.free = collections.deque(range(1, num_blocks))  # block 0 is the null block
        self.requests: dict[str, Sequence] = {}
        self.blocks: dict[str, list[int]] = {}
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.finished_since_last: set[str] = set()
        self.recv_done: set[str] = set()
        self.held: dict[str, list[int]] = {}  # blocks kept while the connector sends them
        self.finished_params: dict[str, dict | None] = {}
        self.external_tokens: dict[str, int] = {}  # what get_num_new_matched_tokens answered, last time
        self.lookups = 0
        self.hit_requests = 0

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = Sequence(request, self.block_size)
        self.waiting.append(request.request_id)

    def _allocate(self, req_id: str, num_tokens: int) -> list[int]:
        have = self.blocks.setdefault(req_id, [])
        need = -(-num_tokens // self.block_size) - len(have)
        if need > len(self.free):
            raise RuntimeError(f"{self.name}: out of blocks ({need} wanted, {len(self.free)} free); "
                               "the workload is sized so this never happens")
        new = [self.free.popleft() for _ in range(max(need, 0))]
        have.extend(new)
        return new

    def _free(self, blocks: list[int]) -> None:
        self.free.extend(blocks)

    def schedule(self) -> StepPlan:
        new_reqs, cached, counts = [], CachedRequestData(), {}
        for req_id in self.running:
            seq = self.requests[req_id]
            r = seq.request
            n = r.num_tokens - r.num_computed_tokens
            new_blocks = self._allocate(req_id, r.num_computed_tokens + n)
            cached.req_ids.append(req_id)
            cached.new_token_ids.append(list(r.all_token_ids[r.num_computed_tokens:]))
            cached.all_token_ids[req_id] = list(r.all_token_ids)
            cached.new_block_ids.append((new_blocks,) if new_blocks else None)
            cached.num_computed_tokens.append(r.num_computed_tokens)
            cached.num_output_tokens.append(r.num_output_tokens)
            counts[req_id] = n
        for req_id in list(self.waiting):
            seq = self.requests[req_id]
            r = seq.request
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if req_id not in self.recv_done:
                    continue
                self.recv_done.discard(req_id)
                r.num_computed_tokens = len(self.blocks[req_id]) * self.block_size
                if r.num_computed_tokens >= r.num_tokens:
                    r.num_computed_tokens = r.num_tokens - 1
                r.status = RequestStatus.WAITING
            local = r.num_computed_tokens
            external, load_async = self.connector.get_num_new_matched_tokens(r, local)
            self.lookups += 1
            self.external_tokens[req_id] = external
            if external:
                self.hit_requests += 1
            if load_async:
                self._allocate(req_id, local + external)
                self.connector.update_state_after_alloc(r, KVCacheBlocks(self.blocks[req_id]), external)
                r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                continue
            self._allocate(req_id, r.num_tokens)
            self.connector.update_state_after_alloc(r, KVCacheBlocks(self.blocks[req_id]), external)
            r.num_computed_tokens = local + external
            self.waiting.remove(req_id)
            self.running.append(req_id)
            r.status = RequestStatus.RUNNING
            new_reqs.append(NewRequestData(req_id, list(r.prompt_token_ids), (list(self.blocks[req_id]),),
                                           r.num_computed_tokens))
            counts[req_id] = r.num_tokens - r.num_computed_tokens
        output = SchedulerOutput(new_reqs, cached, counts, sum(counts.values()), self.finished_since_last)
        self.finished_since_last = set()
        output.kv_connector_metadata = self.connector.build_connector_meta(output)
        plan = StepPlan(output)
        for req_id, n in counts.items():  # vLLM's _update_after_schedule
            r = self.requests[req_id].request
            for pos in range(r.num_computed_tokens, r.num_computed_tokens + n):
                plan.writes.append((req_id, pos, self.blocks[req_id][pos // self.block_size]))
            r.num_computed_tokens += n
        return plan

    def update_from_output(self, plan: StepPlan, kv_output: KVConnectorOutput | None) -> list[str]:
        """Sample, stop, free; then the connector's output. Returns the requests that finished."""
        finished = []
        for req_id in plan.output.num_scheduled_tokens:
            seq = self.requests[req_id]
            r = seq.request
            if r.num_computed_tokens < r.num_tokens:
                continue
            r.append_output_token_ids(seq.next_token())
            seq.refresh()
            if r.num_output_tokens >= r.max_tokens:
                r.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(req_id)
                self._finish(req_id)
                finished.append(req_id)
        if kv_output is not None:
            self.connector.update_connector_output(kv_output)
            for req_id in kv_output.finished_recving or ():
                self.recv_done.add(req_id)
            for req_id in kv_output.finished_sending or ():
                if req_id in self.held:
                    self._free(self.held.pop(req_id))
        return finished

    def _finish(self, req_id: str) -> None:
        r = self.requests[req_id].request
        delay, params = self.connector.request_finished(r, list(self.blocks[req_id]))
        self.finished_params[req_id] = params
        self.finished_since_last.add(req_id)
        blocks = self.blocks.pop(req_id)
        if delay:
            self.held[req_id] = blocks
        else:
            self._free(blocks)


# --- the model runner -----------------------------------------------------------

def buffer_pointers(caches) -> list[list[int]]:
    return [[s.data.unsafe_buffer_pointer() for s in c.addressable_shards] for c in caches]


class ModelRunner:
    """The TPUModelRunner the connectors' register_runner reads (kv_caches,
    mesh, topology_order_id), with execute_model's connector calls in the
    runner's order: bind metadata, start_load_kv, dispatch the model step
    (caches donated), wait_for_save, get_finished, stats, clear."""

    def __init__(self, caches, mesh: Mesh, layout: RowLayout, max_tokens_per_step: int):
        self.kv_caches = caches
        self.mesh = mesh
        self.topology_order_id = 0
        self.layout = layout
        self.max_tokens = max_tokens_per_step
        self.pointers_before: list[list[list[int]]] = []  # per donating step, per layer, per device
        shardings = [c.sharding for c in caches]
        uint = jnp.dtype(layout.uint)
        mla, packing = layout.mla, layout.packing

        def step(caches, blocks, rows, values):
            out = []
            for layer, cache in enumerate(caches):
                bits = lax.bitcast_convert_type(cache, uint)
                if mla:
                    bits = bits.at[blocks, rows // packing, rows % packing].set(values[layer])
                else:
                    bits = bits.at[blocks, rows].set(values[layer])
                out.append(lax.bitcast_convert_type(bits, cache.dtype))
            return out

        self._step = jax.jit(step, donate_argnums=(0,), out_shardings=shardings)
        self._read = jax.jit(lambda caches: [lax.bitcast_convert_type(c, uint) for c in caches])

    def step_inputs(self, writes, keys_of, content: Content):
        """The step's arguments: the (block, row) of each token computed, and its rows per layer."""
        n = self.max_tokens
        if len(writes) > n:
            raise RuntimeError(f"{len(writes)} tokens in one step; the step takes {n}")
        blocks = np.full(n, NULL_BLOCK, np.int32)
        rows = np.zeros(n, np.int32)
        values = np.zeros((len(self.kv_caches), n) + self.layout.row_shape, self.layout.uint)
        for i, (req_id, pos, block) in enumerate(writes):
            blocks[i], rows[i] = block, pos % self.layout.block_size
            key = keys_of(req_id)[pos]
            for layer in range(len(self.kv_caches)):
                values[layer, i] = content.row(key, layer)
        return blocks, rows, values

    def execute(self, connector, scheduler_output: SchedulerOutput, inputs) -> tuple[KVConnectorOutput, dict]:
        """One step. `inputs` is None for a step with no tokens (the runner's
        kv_connector_no_forward: no model, no wait_for_save)."""
        record = {"donated": False}
        output = KVConnectorOutput()
        connector.bind_connector_metadata(scheduler_output.kv_connector_metadata)
        connector.start_load_kv(get_forward_context())
        try:
            if inputs is not None:
                # The donated arrays' buffer pointers, read just before they are
                # donated (see pointers_before). The step's outputs are not read
                # here: asking an output for its per-device buffers makes
                # per-device arrays a library may then find among the live
                # arrays, which tpu-inference's runner never does.
                self.pointers_before.append(buffer_pointers(self.kv_caches))
                self.kv_caches = self._step(self.kv_caches, *inputs)  # dispatched, not awaited
                record["donated"] = True
        finally:
            if inputs is not None:
                connector.wait_for_save()
            output.finished_sending, output.finished_recving = connector.get_finished(
                scheduler_output.finished_req_ids)
            output.invalid_block_ids = connector.get_block_ids_with_load_errors()
            output.kv_connector_stats = connector.get_kv_connector_stats()
            connector.clear_connector_metadata()
        return output, record

    def aliasing(self) -> list[bool]:
        """Per donating step, whether its outputs kept the donated buffers:
        step k's outputs are step k+1's inputs, whose pointers are read just
        before step k+1 donates them; the last step's outputs are read now."""
        pointers = self.pointers_before + [buffer_pointers(self.kv_caches)]
        return [a == b for a, b in zip(pointers, pointers[1:])]

    def read(self) -> tuple[list[np.ndarray], list[tuple[int, list[int], str, str]]]:
        """Every layer's cache as unsigned integers of the element's width (a
        fresh copy), assembled device by device; and where a device's copy of
        a replicated part differs from the first device's: (layer, blocks,
        device, first device). (The per-device arrays read are the copy's,
        never the caches'.)"""
        layers, replicas = [], []
        for layer, copy in enumerate(self._read(self.kv_caches)):
            full = np.empty(copy.shape, copy.dtype)
            seen: dict[tuple, str] = {}
            for shard in copy.addressable_shards:
                part = np.asarray(shard.data)
                key = tuple((s.start, s.stop) for s in shard.index)
                if key not in seen:
                    full[shard.index] = part
                    seen[key] = str(shard.device)
                elif not np.array_equal(full[shard.index], part):
                    blocks = np.nonzero((full[shard.index] != part).reshape(part.shape[0], -1).any(axis=1))[0]
                    start = shard.index[0].start or 0
                    replicas.append((layer, [start + int(b) for b in blocks], str(shard.device), seen[key]))
            layers.append(full)
        return layers, replicas
