"""tpu-sync-jax 0.0.1rc20261023185136 (defaults): CORRUPT: call 0 {'d2h': False, 'src': [], 'dst': [], 'sizes': None}: layer 0: device blocks [0, 1, 2, 3, 4, 5, 6, 7] differ from the model

Found by `kvprobe fuzz --iut tpu-sync-jax` (in cpu/call_sequence/fuzz-0-1) and shrunk to 1 call(s):
call 0 {'d2h': False, 'src': [], 'dst': [], 'sizes': None}: layer 0: device blocks [0, 1, 2, 3, 4, 5, 6, 7] differ from the model

Run: .venv-peer/bin/python reports/cpu/findings/fuzz-tpu-sync-jax-corrupt-1.py
It replays the sequence against the library alone (the harness's block model
and reading of the library's refusals copied in), prints the verdict and
exits non-zero (or crashes, or hangs until its watchdog), as it did then."""

# The library listens on every interface and connects to the host's own
# address, so this runs in a network namespace whose only interface is lo:
# outside one, it re-executes itself under `unshare -rn` and brings lo up
# before the library is imported; where none can be made, it prints SKIP
# and exits 77, having run nothing. (The standard library alone.)
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys

ENTERED = "KVPROBE_NETNS"  # set in a process re-executed inside a namespace
SKIP_EXIT = 77  # a script that could not enter one exits with this, having run nothing
NONE_HERE = "no loopback-only network namespace can be made here"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the 24-byte union


def interfaces() -> list[str]:
    """The network interfaces this process sees (its network namespace's)."""
    with open("/proc/net/dev") as f:
        return [line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line]


def lo_flags(s: socket.socket) -> int:
    return struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]


def bring_lo_up() -> None:
    """Set IFF_UP on lo (a new namespace's lo is down): an ioctl, else `ip link set lo up`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = lo_flags(s)
        if flags & IFF_UP:
            return
        try:
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
            return
        except OSError as e:
            failed = e
    ip = shutil.which("ip")
    if ip is None or subprocess.run([ip, "link", "set", "lo", "up"], capture_output=True).returncode:
        raise OSError(f"could not bring lo up: {failed}")


def enter() -> str | None:
    """Put this process in a loopback-only network namespace before it imports
    the library: inside one already, bring lo up and return None; else re-exec
    this interpreter, its flags and arguments under `unshare -rn` (no return).
    Returns why none can be made here: the caller then runs nothing of the library."""
    seen = interfaces()
    if seen == ["lo"]:
        try:
            bring_lo_up()
        except OSError as e:
            return f"{NONE_HERE}: {e}"
        return None
    if os.environ.get(ENTERED):
        return f"{NONE_HERE}: re-executed under `unshare -rn`, this process still sees {seen}"
    unshare = shutil.which("unshare")
    if unshare is None:
        return f"{NONE_HERE}: `unshare` (util-linux) is not installed"
    tried = subprocess.run([unshare, "-rn", sys.executable, "-S", "-c", ""], capture_output=True, text=True)
    if tried.returncode:
        return f"{NONE_HERE}: `unshare -rn` refused ({' '.join((tried.stderr or '').split())[-300:]})"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(unshare, [unshare, "-rn", sys.executable, *sys.orig_argv[1:]], {**os.environ, ENTERED: "1"})


if NO_NAMESPACE := enter():
    print("SKIP", NO_NAMESPACE)
    sys.exit(SKIP_EXIT)

import faulthandler  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", 'cpu')
faulthandler.dump_traceback_later(120.0, exit=True)

CASE = '{"probe": "call_sequence", "generation": "cpu", "iut": "tpu-sync-jax", "name": "fuzz-0-1", "shape": "bf16[128,2,128]", "faults": [], "timeout": 60.0, "startup_timeout": 60.0, "seed": 1, "kind": "", "iut_options": [], "calls": {"shape": "bf16[128,2,128]", "layers": 1, "host_blocks": 227, "mode": "put", "calls": [{"d2h": false, "src": [], "dst": [], "sizes": null}]}}'
SEQUENCE = json.loads(CASE)["calls"]
# How the manager is built: keyword arguments, and (upper case) variables set before the library is imported.
OPTIONS = dict(json.loads(CASE)["iut_options"])
os.environ.update({name: str(value) for name, value in OPTIONS.items() if name.isupper()})

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

DIMS, DTYPE = (128, 2, 128), jnp.dtype('bfloat16')  # SEQUENCE["shape"]

# The harness's own definitions (probes.suite.block_model, probes.iut.tpu_sync, probes.suite.refusals, probes.iut.jax_arrays), as it judged the sequence:
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class BlockModel:
    device: list[list[bytes]]  # per layer, per device block
    host: list[list[bytes | None]] = field(default_factory=list)  # per layer, per host block
    host_blocks: int = 0
    zeroed_pool: bool = True  # False: a new pool's contents are unknown (None) until written

    def __post_init__(self):
        if not self.host:
            self.host = [[bytes(len(layer[0])) if self.zeroed_pool else None] * self.host_blocks
                         for layer in self.device]

    @property
    def rows(self) -> int:
        return len(self.device[0])

    def problem(self, d2h: bool, src, dst, sizes) -> str | None:
        """Why a request is invalid, or None when a correct manager must do it."""
        sizes = [1] * len(src) if sizes is None else sizes
        if not (len(src) == len(dst) == len(sizes)):
            return "lists of different lengths"
        for values in (src, dst, sizes):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX:
                    return f"{v!r} is not an int64 block number"
        src_limit, dst_limit = (self.rows, self.host_blocks) if d2h else (self.host_blocks, self.rows)
        for s, d, n in zip(src, dst, sizes):
            if n < 1:
                return f"copy size {n}"
            if s < 0 or d < 0 or s + n > src_limit or d + n > dst_limit:
                return f"range out of bounds ({s}, {d}, {n})"
        spans = sorted((d, d + n) for d, n in zip(dst, sizes))
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
            return "overlapping destinations"
        return None

    def apply(self, d2h: bool, src, dst, sizes) -> None:
        """Carry out a valid request."""
        sizes = [1] * len(src) if sizes is None else sizes
        for layer in range(len(self.device)):
            source = self.device[layer] if d2h else self.host[layer]
            target = self.host[layer] if d2h else self.device[layer]
            moved = [(d + k, source[s + k]) for s, d, n in zip(src, dst, sizes) for k in range(n)]
            for index, block in moved:
                target[index] = block


class AsyncFailure(RuntimeError):
    """A transfer the library accepted failed while it ran: never a refusal."""


# The refusals each wheel gives, read from the wheels; anything else a call
# raises is a failure. Both wheels share the C++ that checks a request.
REFUSAL_CODES = ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION", "UNIMPLEMENTED")
# RESOURCE_EXHAUSTED refuses only a save the host pool cannot hold; elsewhere it is the runtime's.
POOL_FULL = re.compile(r"Insufficient available blocks|exceed total blocks")
# The jax wheel: the call's absl status, after "absl::StatusOr not ok: " (d2h, h2d),
# "absl::Status not ok: " (unlock_blocks) or nothing (d2h_auto_allocate).
JAX_STATUS = re.compile(r"(?:absl::Status(?:Or)? not ok: )?([A-Z][A-Z_]+[A-Z]): ")
JAX_UNCODED = re.compile(r"Layer \d+ has major dimension \d+ but layer 0 has \d+")  # mixed layers, at construction
# The torch wheel: "KVCacheManager <Method> failed: <the check's message>", no code.
TORCH_WRAPPED = re.compile(r"KVCacheManager \w+ failed: (.*)", re.DOTALL)
CHECKS = re.compile(r"must have the same length|must be non-negative|Copy range exceeds|Invalid block ID|"
                    r"Cannot unlock unallocated block ID|invalid StartTransferRequest bytes|"
                    r"Insufficient available blocks|exceed total blocks|Lengths of offset and size lists must match")
# Their Python layers' own refusals, and the bindings' refusal of an argument of the wrong type.
PYTHON_REFUSALS = re.compile(r"Must specify either \(max_blocks, num_slots\) or host_blocks_to_allocate|"
                             r"request must be bytes or a protobuf message|incompatible function arguments")


def refuses(e: BaseException, wheel: str = "jax") -> bool:
    """Whether `e` is one of the wheel's ("jax" or "torch") clean refusals of
    the input given."""
    message = str(e)
    if isinstance(e, AsyncFailure):
        return False
    if isinstance(e, (ValueError, TypeError)):
        return bool(PYTHON_REFUSALS.search(message))
    if type(e) is not RuntimeError:
        return False
    if wheel == "torch":
        wrapped = TORCH_WRAPPED.match(message)
        return bool(wrapped and CHECKS.search(wrapped.group(1)))
    status = JAX_STATUS.match(message)
    if status is None:
        return bool(JAX_UNCODED.match(message))
    code = status.group(1)
    return code in REFUSAL_CODES or (code == "RESOURCE_EXHAUSTED" and bool(POOL_FULL.search(message)))


def layer_block_sizes(impl, layers: int) -> tuple[int, ...]:
    """Each layer's block size as the library reports it: block_bytes(i) per
    layer where the wheel has it (layers of different sizes differ), else
    its one slice_byte_size for every layer."""
    if hasattr(impl, "block_bytes") and int(getattr(impl, "num_block_arrays", layers)) == layers:
        return tuple(int(impl.block_bytes(i)) for i in range(layers))
    return (int(impl.slice_byte_size),) * layers


class SyncPending:
    """A tpu-sync future. A failure while the copy runs is an AsyncFailure,
    whichever way the future reports it: Await raising, or (tpu-sync-torch's
    future) Await returning while ok() is False."""

    def __init__(self, future):
        self.future = future

    def wait(self) -> None:
        try:
            self.future.Await()
        except Exception as e:  # the copy failed after it was accepted
            raise AsyncFailure(f"Await raised {type(e).__name__}: {e}") from e
        ok = getattr(self.future, "ok", None)
        if ok is not None and not ok():
            raise AsyncFailure(f"Await returned, but the future reports an error: "
                               f"{self.future.error_message()}")


def first_line(e: BaseException) -> str:
    """The exception as `Type: first line of its message`, for one-line details."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


# Bytes a deferred cache's computation churns through: about half a second
# on one core, long enough to be still running when the manager is built.
PENDING_BYTES = 10 * 2**30


def _rounds(nbytes: int, pending_bytes: int = PENDING_BYTES) -> int:
    return 2 * max(1, min(100_000, pending_bytes // max(1, 2 * nbytes)))


@functools.cache
def _identity_churn():
    import jax
    import jax.numpy as jnp
    from jax import lax

    @jax.jit
    def churn(x, rounds, key):
        bits = x if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer) else \
            lax.bitcast_convert_type(x, key.dtype)
        bits = lax.fori_loop(0, rounds, lambda i, v: v ^ key, bits)
        return bits if bits.dtype == x.dtype else lax.bitcast_convert_type(bits, x.dtype)

    return churn


def _key(dtype: np.dtype):
    """The XOR key, in the type the computation works in."""
    import jax.numpy as jnp

    if dtype == np.bool_:
        return jnp.bool_(True)
    if np.issubdtype(dtype, np.integer) or dtype.kind in "iu" or "int" in dtype.name:
        return jnp.asarray(1, dtype=dtype)
    return jnp.asarray(0x5A, dtype={1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[dtype.itemsize])


def finish(verdict: str, detail: str):
    print(verdict, detail)
    sys.exit(0 if verdict == "PASS" else 1)


# Each layer's contents: small integers, which survive the library's float32 reads of its pool.
hosts = [np.random.default_rng(json.loads(CASE)["seed"] + layer).integers(-8, 8, DIMS).astype(DTYPE)
         for layer in range(SEQUENCE["layers"])]
caches = [jax.device_put(host.copy(), jax.devices("cpu")[0]) for host in hosts]
if SEQUENCE["mode"] == "deferred":  # the outputs of computations still running when the manager is built
    for cache in caches:
        cache.block_until_ready()
    caches = [_identity_churn()(cache, _rounds(host.nbytes * len(hosts)), _key(host.dtype))
              for cache, host in zip(caches, hosts)]
try:
    manager = KVCacheManager(caches, 0, host_blocks_to_allocate=SEQUENCE["host_blocks"],
                             **{name: value for name, value in OPTIONS.items() if not name.isupper()})
except Exception as e:  # a clean refusal here is a finding too: these layouts are addressable
    finish("ERROR", f"construction refused or failed: {first_line(e)}")
block_bytes = layer_block_sizes(manager._impl, int(manager._impl.num_layers))


def blocks(array) -> list[bytes]:
    """A dense CPU array's blocks, as the manager addresses them."""
    data = np.asarray(array).tobytes()
    return [data[i:i + block_bytes[0]] for i in range(0, len(data), block_bytes[0])]


def host_block(layer: int, block: int) -> bytes:
    """One block of the pool, read as the jax wheel offers: the first n float32 values of a layer's pool."""
    floats = block_bytes[layer] // 4
    values = manager._impl.read_host_memory(layer, 0, (block + 1) * floats)
    return np.asarray(values[block * floats:], dtype=np.float32).tobytes()


def transfer(request: dict) -> None:
    """The request's lists as they are (JSON's ints, bools and None): the library's bindings judge them."""
    move = manager.d2h if request["d2h"] else manager.h2d
    SyncPending(move(request["src"], request["dst"], request["sizes"])).wait()


def one(call: dict):
    """What is wrong with one call (a request, or two at once on two threads), or None."""
    if "concurrent" in call:
        errors = []

        def run(request):
            try:
                transfer(request)
            except Exception as e:  # collected: a valid request must not fail
                errors.append(first_line(e))

        threads = [threading.Thread(target=run, args=(r,)) for r in call["concurrent"]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            return "ERROR", f"a valid request on one of two threads failed: {errors[0]}"
        for request in call["concurrent"]:
            model.apply(request["d2h"], request["src"], request["dst"], request["sizes"])
        return None
    problem = model.problem(call["d2h"], call["src"], call["dst"], call["sizes"])
    try:
        transfer(call)
    except Exception as e:  # a refusal, judged against the model
        if problem is None:
            return "ERROR", f"a valid request was refused: {first_line(e)}"
        if not refuses(e):
            return "ERROR", f"refused with a failure, not a clean refusal: {first_line(e)}"
        return None
    if problem is not None:
        return "ERROR", f"accepted silently; it should be refused: {problem}"
    model.apply(call["d2h"], call["src"], call["dst"], call["sizes"])
    return None


def check():
    """Every device block and every host block written so far, against the model, or None."""
    for layer, cache in enumerate(caches):
        wrong = [i for i, (got, want) in enumerate(zip(blocks(np.asarray(cache)), model.device[layer]))
                 if want is not None and got != want]
        if wrong:
            return "CORRUPT", f"layer {layer}: device blocks {wrong[:8]} differ from the model"
        host = [i for i in range(model.host_blocks)
                if model.host[layer][i] is not None and host_block(layer, i) != model.host[layer][i]]
        if host:
            return "CORRUPT", f"layer {layer}: host blocks {host[:8]} differ from the model"
    return None


model = BlockModel([blocks(host) for host in hosts], host_blocks=SEQUENCE["host_blocks"], zeroed_pool=False)
for index, call in enumerate(SEQUENCE["calls"]):
    wrong = one(call) or check()
    if wrong:
        finish(wrong[0], f"call {index} {call}: {wrong[1]}")
finish("PASS", f"{len(SEQUENCE['calls'])} calls held to the model")
