"""Unpacking what a caller hands a manager into raw device regions.

Every unpack caller (the manager, the raw transfer functions) goes through
`unpack_buffer`: resolve the base buffer, materialize it in place, then await
it. Awaiting alone waits for materialization but never triggers it; on a
deferred tensor nothing else would, so it would wait forever (holding the GIL).

A manager holds its views across transfers, and the caller's arrays move on
meanwhile (a serving step writes the cache in place, or donates it, and an
XLA tensor updated in place gets a new buffer). Before every transfer
`check_live` brings each view up to date (a re-resolved view where the
storage moved), or refuses.

Donation (jax.Array, simulated arrays): what PJRT guarantees is that a
donated array is deleted when the step is dispatched, and that the step's
output either aliases the donated buffer (XLA's input-output alias: the same
device memory, written in place) or lives in fresh memory while the donated
buffer is freed. So a deleted array's storage is the cache's still exactly
when a live array on the same device holds that storage with the same shape
and layout: the step's output, which the view then follows (waiting for the
step to end). Where none does, the storage was given up and the view is
refused, before any byte is moved.

Freed storage is handed out again: an array made after a step that did not
alias (another manager's cache, another layer's step output) may sit at the
donated address with the same shape. Every jax.Array a view holds is noted
with its cache's lineage (the array a manager was built over, and each
output followed from it), and a view never follows into an array another
lineage holds. An array nobody holds yet cannot be told apart by its address.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

from kvref import _core, xla_tensors
from kvref.dtypes import element_type
from kvref.faults import Faults
from kvref.shape import Layout, Shape
from kvref.sharding import ShardPlacement, placements_of
from kvref.sim import DeviceArray


@dataclass(frozen=True)
class DeviceBufferView:
    region: _core.DeviceRegion  # what the block mover reads and writes
    shape: Shape
    device: object  # identity of the device holding it
    keepalive: object  # the caller's array, kept alive while in use
    address: int = 0  # where raw storage (not a simulated buffer) was found
    lineage: object = None  # a jax.Array's cache: the array built over and the outputs followed from it


def unpack_buffer(array, faults: Faults = Faults()) -> DeviceBufferView:
    if isinstance(array, DeviceArray):
        _materialize_and_await(array, faults)
        return DeviceBufferView(_core.DeviceRegion.of_buffer(array._buffer), array.shape,
                                array.device, array)
    if _is_jax_array(array):
        return _unpack_jax(array)
    if xla_tensors.is_xla_tensor(array):
        return _unpack_xla(array, faults)
    raise TypeError(f"expected a kvref.sim.DeviceArray, a single-device jax.Array or an XLA CPU "
                    f"torch tensor, got {type(array).__module__}.{type(array).__name__}")


def split_shards(array) -> tuple[list, list[ShardPlacement] | None]:
    """One layer's array as its per-device shards, in device order, and where
    each lies; an array on one device is its own single shard. Anything with
    `addressable_shards` (a jax.Array, a kvref.sim_mesh.ShardedArray) is split."""
    shards = getattr(array, "addressable_shards", None)
    if shards is None or len(shards) <= 1:
        return [array], None
    shards = sorted(shards, key=lambda shard: shard.device.id)
    starts = [tuple(s.start or 0 for s in shard.index) for shard in shards]
    return [shard.data for shard in shards], placements_of(starts)


def is_simulated(view: DeviceBufferView) -> bool:
    """Whether the view is a simulated buffer, whose ops wait for the copies
    issued before them (raw storage cannot be fenced that way)."""
    return isinstance(view.keepalive, DeviceArray)


FOLLOW_SECONDS = 1.0  # for a donating step's output to appear, once its input is gone
CHASE_SECONDS = 10.0  # following outputs each donated in turn by the next step


def check_live(view: DeviceBufferView, faults: Faults = Faults(), follow: bool = True) -> DeviceBufferView:
    """The view, its storage holding its array's current contents: in-place
    ops recorded since are run (in place, so the storage stays the same) and
    waited for; an XLA tensor whose buffer changed since is re-resolved (a new
    view). A jax.Array deleted since (donated to a computation) no longer owns
    its storage: its step's output is followed (a new view), or ValueError.

    `follow=False` leaves a deleted jax.Array's view as it is, for the
    manager's own threads: following asks live arrays for their buffers, and
    a step dispatched on another thread at that moment silently gives up its
    donation and moves the cache (the caller's threads are the ones that
    dispatch steps, and follow)."""
    array = view.keepalive
    if _deleted(array) and not faults.stale_storage_address:
        return view if not follow and _is_jax_array(array) else _donation_output(view, faults)
    if isinstance(array, DeviceArray):
        if not faults.buffer_resolved_once:
            _materialize_and_await(array, faults)
    elif xla_tensors.is_xla_tensor(array) and not faults.buffer_resolved_once:
        fresh = _unpack_xla(array, faults)
        if fresh.shape != view.shape:
            raise ValueError(f"an XLA tensor the manager took as {view.shape} is {fresh.shape} now; "
                             "build the manager over the arrays as they are")
        return view if fresh.address == view.address else fresh
    return view


def is_still(view: DeviceBufferView) -> bool:
    """Whether the view's jax.Array is live and ready, asked without holding
    its buffer: no step has taken it, and the one that made it has ended.
    Simulated arrays fence their own ops, and XLA tensors are re-resolved:
    always still."""
    array = view.keepalive
    if not _is_jax_array(array):
        return True
    try:
        return not array.is_deleted() and array.is_ready()
    except Exception:  # noqa: BLE001 (deleted by a step between the two questions)
        return False


def _deleted(array) -> bool:
    return (isinstance(array, DeviceArray) or _is_jax_array(array)) and array.is_deleted()


def _donation_output(view: DeviceBufferView, faults: Faults) -> DeviceBufferView:
    """The view of the live array that holds a deleted array's storage (a
    donating step's aliased output), ready; ValueError where none does.

    A JAX step being dispatched on another thread has deleted its input
    before its output exists, and the output may itself be donated to the
    next step while it is awaited: so the output is looked for, and awaited,
    following each next step's, until none has been found for FOLLOW_SECONDS
    or CHASE_SECONDS have passed (a simulated step's output exists before its
    input is deleted: it is looked for once, and followed)."""
    kind = "simulated array" if isinstance(view.keepalive, DeviceArray) else "jax.Array"
    started = time.monotonic()
    deadline = started + FOLLOW_SECONDS
    while not faults.refuses_donated_storage:
        output = _aliased_output(view)
        if output is not None:
            try:
                return _unpack_jax(output, view.lineage) if view.lineage else unpack_buffer(output, faults)
            except Exception:  # donated in turn while it was awaited: follow that step's output
                if not output.is_deleted():
                    raise
            deadline = min(time.monotonic() + FOLLOW_SECONDS, started + CHASE_SECONDS)
        elif isinstance(view.keepalive, DeviceArray):
            break  # a simulated step's output is live before its input is deleted: none will come
        if time.monotonic() > deadline:
            break
        time.sleep(0.001)
    raise ValueError(f"the {view.shape} {kind} the manager addresses was deleted (donated to a step "
                     "whose output does not alias its storage, or deleted) and no live array on "
                     f"{view.device} holds that storage now (or only another cache's array): it is no longer the "
                     "cache's, so nothing was moved; build the manager over the live arrays")


def _aliased_output(view: DeviceBufferView):
    array = view.keepalive
    if isinstance(array, DeviceArray):
        return next((a for a in array.device.live_arrays() if a.holds_storage_of(array)), None)
    import jax  # a jax.Array's: jax is imported already

    # The output may be one device's array, or one shard of an array over a
    # mesh (a sharded cache's step output): each device's part is its own buffer.
    # Another thread's step may donate any listed array while it is read:
    # JAX then raises, or has no layout, part way, and that one is passed over
    # (a step that holds it donated may be running: the caller looks again).
    for candidate in jax.live_arrays(view.device.platform):
        try:
            part = _part_holding(candidate, view)
        except Exception:  # noqa: BLE001 (whichever read found it gone, or being donated: looked at again)
            continue
        if part is not None and not _held_by_another(part, view):
            return part
    return None


def _part_holding(candidate, view: DeviceBufferView):
    """The one-device part of `candidate` whose buffer is the view's storage, laid out as it; None if none is."""
    if candidate.is_deleted() or view.device not in candidate.devices():
        return None
    for shard in candidate.addressable_shards:
        part = shard.data
        if shard.device == view.device and part.unsafe_buffer_pointer() == view.address \
                and _jax_shape(part) == view.shape:
            return part
    return None


def _materialize_and_await(array: DeviceArray, faults: Faults) -> None:
    if faults.no_await_before_transfer:
        return
    if not faults.no_materialize_before_await:
        array.materialize()
    array._buffer.await_()


def _is_jax_array(obj) -> bool:
    return type(obj).__module__.startswith("jax") and hasattr(obj, "unsafe_buffer_pointer")


def _unpack_xla(tensor, faults: Faults) -> DeviceBufferView:
    address, alias, shape, device = xla_tensors.resolve(tensor, faults)
    return DeviceBufferView(region_of(alias, shape), shape, device, tensor, address)


def region_of(array, shape: Shape) -> _core.DeviceRegion:
    """The memory `array` owns (C++ reads its address and size from it, and
    holds it), which must be as large as `shape`'s layout says."""
    region = _core.DeviceRegion.of_array(array)
    if region.size != shape.physical_size_bytes:
        raise ValueError(f"a {shape} array whose buffer takes {region.size:,} bytes; its layout takes "
                         f"{shape.physical_size_bytes:,}, so its blocks cannot be addressed")
    return region


def _jax_shape(array) -> Shape:
    return Shape(element_type(array.dtype).name, tuple(array.shape), Layout.from_jax(array.format.layout))


def _unpack_jax(array, lineage: object = None) -> DeviceBufferView:
    """The view of a one-device jax.Array; `lineage`: the cache whose donated array it follows."""
    devices = array.devices()
    if len(devices) != 1:
        raise ValueError(f"a jax.Array on {len(devices)} devices; pass each shard as its own array")
    (device,) = devices
    if device.platform != "cpu":
        raise ValueError(f"jax.Array on {device.platform}: only CPU arrays are read in place here")
    # JAX's asynchronous dispatch always runs the computation: waiting suffices.
    array.block_until_ready()
    shape = _jax_shape(array)
    address = array.unsafe_buffer_pointer()
    if lineage is None:  # built over: two managers over one cache share its lineage
        holder = _HOLDERS.get((device, address))
        lineage = holder[0] if holder is not None and holder[1]() is array else object()
    return _held(DeviceBufferView(region_of(array, shape), shape, device, array, address, lineage))


# (device, address) -> (lineage, weak reference to the jax.Array holding it)
_HOLDERS: dict[tuple, tuple[object, weakref.ref]] = {}
_HOLDERS_LOCK = threading.Lock()


def _held(view: DeviceBufferView) -> DeviceBufferView:
    """The view, its array noted as its lineage's (the entry goes with the array)."""
    key = (view.device, view.address)

    def forget(ref, key=key):
        with _HOLDERS_LOCK:
            if _HOLDERS.get(key, (None, None))[1] is ref:
                del _HOLDERS[key]

    with _HOLDERS_LOCK:
        _HOLDERS[key] = (view.lineage, weakref.ref(view.keepalive, forget))
    return view


def _held_by_another(part, view: DeviceBufferView) -> bool:
    """Whether a live array another cache's view holds is `part` (so it is not this cache's step output)."""
    lineage, ref = _HOLDERS.get((view.device, view.address), (None, None))
    return ref is not None and lineage is not view.lineage and ref() is part and not part.is_deleted()
