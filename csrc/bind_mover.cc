// Bindings of the block mover (the manager's data path) and its futures.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <pthread.h>

#include <cstring>
#include <mutex>
#include <string>
#include <new>
#include <vector>

#include "bindings.h"
#include "block_mover.h"
#include "thread_pool.h"

namespace kvref_bind {

namespace {

// References C++ lets go of are dropped by the interpreter's main thread, at
// its next chance (Py_AddPendingCall), never by the copy thread that let go:
// a thread that takes the GIL while the interpreter finalizes is ended under
// it, which aborts the process. At the interpreter's end they are left to it.
std::mutex g_release_mu;
std::vector<PyObject*> g_release;
bool g_release_scheduled = false;

int release_pending(void*) {
  std::vector<PyObject*> drop;
  {
    std::lock_guard<std::mutex> lock(g_release_mu);
    drop.swap(g_release);
    g_release_scheduled = false;
  }
  for (PyObject* object : drop) Py_DECREF(object);
  return 0;
}

// A forked child has none of its parent's threads, one of which may have held the lock.
void forget_releases_in_child() { new (&g_release_mu) std::mutex(); }

// A reference to a Python object for C++ to hold: taken now, with the GIL,
// and dropped as above whichever thread lets go of it last.
kvref::Owner python_owner(nb::handle object) {
  if (!object.is_valid() || object.is_none()) return nullptr;
  object.inc_ref();
  return kvref::Owner(object.ptr(), [](void* p) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone, and its objects with it
    std::lock_guard<std::mutex> lock(g_release_mu);
    g_release.push_back(static_cast<PyObject*>(p));
    // Py_AddPendingCall needs no GIL; it fails only when its queue is full,
    // and then the next release asks again.
    if (!g_release_scheduled) g_release_scheduled = Py_AddPendingCall(release_pending, nullptr) == 0;
  });
}

// Whether an ndarray's elements are laid out row-major with no gaps.
bool dense_row_major(const nb::ndarray<>& a) {
  int64_t expected = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(d));
  }
  return true;
}

kvref::DeviceRegion region_of_array(nb::object array) {
  uint8_t* data;
  int64_t size;
  if (nb::hasattr(array, "unsafe_buffer_pointer") && nb::hasattr(array, "on_device_size_in_bytes")) {
    // A jax.Array: its buffer as the runtime reports it (DLPack would pin it
    // against donation, which a serving step does to its caches).
    data = reinterpret_cast<uint8_t*>(nb::cast<uintptr_t>(array.attr("unsafe_buffer_pointer")()));
    size = nb::cast<int64_t>(array.attr("on_device_size_in_bytes")());
  } else {
    nb::ndarray<> a;
    if (!nb::try_cast(array, a, /*convert=*/false))
      throw nb::type_error(("a device region needs a jax.Array or an array exporting DLPack or the "
                            "buffer protocol, got " + std::string(nb::type_name(array.type()).c_str()))
                               .c_str());
    if (a.device_type() != nb::device::cpu::value)
      throw std::invalid_argument("a device region's array must be in CPU memory");
    if (!dense_row_major(a))
      throw std::invalid_argument("a device region's array must be dense and row-major");
    data = static_cast<uint8_t*>(a.data());
    size = static_cast<int64_t>(a.nbytes());
  }
  if (!data && size) throw std::invalid_argument("the array has " + std::to_string(size) +
                                                 " bytes at a null address");
  return kvref::DeviceRegion{nullptr, data, size, python_owner(array)};
}

// A list of Python ints (exactly int: not bool, not NumPy scalars) that fit
// in int64, as an int64 array; None for anything else, which
// kvref.offsets.block_list checks one element at a time to name what is wrong.
nb::object exact_int64s(nb::handle values) {
  PyObject* list = values.ptr();
  if (!PyList_Check(list)) return nb::none();
  std::vector<int64_t> out(static_cast<size_t>(PyList_GET_SIZE(list)));
  for (size_t i = 0; i < out.size(); ++i) {
    PyObject* item = PyList_GET_ITEM(list, static_cast<Py_ssize_t>(i));
    int overflow = 0;
    if (!PyLong_CheckExact(item)) return nb::none();
    out[i] = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow) return nb::none();
  }
  return nb::cast(to_numpy(std::move(out)));
}

}  // namespace

using kvref::BlockMover;
using kvref::Direction;
using kvref::DeviceRegion;
using kvref::LayerAddressing;
using kvref::TransferFuture;

void bind_mover(nb::module_& m) {
  pthread_atfork(nullptr, nullptr, forget_releases_in_child);
  m.def("exact_int64s", &exact_int64s, nb::arg("values"),
        "A list of plain ints that fit in int64 as an int64 array, read at C speed; None otherwise.");
  m.def("keep_copy_pool_across_fork", &kvref::ThreadPool::keep_across_fork, nb::arg("kept"),
        "The fault model pool_kept_across_fork, for the whole process: a forked child keeps the "
        "parent's copy pool, without its threads.");
  nb::class_<DeviceRegion>(m, "DeviceRegion")
      .def_static("of_buffer", [](kvref::DeviceBuffer& b) {
        return DeviceRegion{b.shared_from_this(), nullptr, b.size()};
      })
      .def_static("of_array", &region_of_array, nb::arg("array"),
                  "The memory of a dense CPU array (a jax.Array on one CPU device, or anything "
                  "that exports DLPack or the buffer protocol), its address and size read from "
                  "the array itself, which is held for as long as C++ uses the region.")
      .def_prop_ro("size", [](const DeviceRegion& r) { return r.size; });

  nb::class_<kvref::ShardPlacement>(m, "ShardPlacement")
      .def(nb::init<>())
      .def("__init__",
           [](kvref::ShardPlacement* p, int64_t first_block, int64_t host_slot, int64_t host_slots,
              bool reads) { new (p) kvref::ShardPlacement{first_block, host_slot, host_slots, reads}; },
           nb::kw_only(), nb::arg("first_block"), nb::arg("host_slot"), nb::arg("host_slots"),
           nb::arg("reads"))
      .def_ro("first_block", &kvref::ShardPlacement::first_block)
      .def_ro("host_slot", &kvref::ShardPlacement::host_slot)
      .def_ro("host_slots", &kvref::ShardPlacement::host_slots)
      .def_ro("reads", &kvref::ShardPlacement::reads);

  nb::class_<kvref::HostSpan>(m, "HostSpan")
      .def("__init__",
           [](kvref::HostSpan* h, int64_t base, int64_t blocks, int64_t slice) {
             new (h) kvref::HostSpan{base, blocks, slice};
           },
           nb::kw_only(), nb::arg("base"), nb::arg("blocks"), nb::arg("slice"))
      .def_ro("base", &kvref::HostSpan::base)
      .def_ro("blocks", &kvref::HostSpan::blocks)
      .def_ro("slice", &kvref::HostSpan::slice);

  nb::class_<LayerAddressing>(m, "LayerAddressing")
      .def(nb::init<std::vector<DeviceRegion>, std::vector<kvref::ShardPlacement>, int64_t, int64_t,
                    int64_t, kvref::HostSpan>(),
           nb::kw_only(), nb::arg("shards"), nb::arg("placements"), nb::arg("device_blocks"),
           nb::arg("shard_blocks"), nb::arg("block_bytes"), nb::arg("host"))
      .def_prop_ro("shard_count", [](const LayerAddressing& a) { return a.shards.size(); })
      .def_ro("placements", &LayerAddressing::placements)
      .def_ro("shard_blocks", &LayerAddressing::shard_blocks)
      .def_ro("device_blocks", &LayerAddressing::device_blocks)
      .def_ro("block_bytes", &LayerAddressing::block_bytes)
      .def_ro("host", &LayerAddressing::host)
      .def_prop_ro("host_extent", &LayerAddressing::host_extent)
      .def("host_end", &LayerAddressing::host_end, nb::arg("host_blocks"));

  nb::class_<kvref::MoverFaults>(m, "MoverFaults")
      .def("__init__",
           [](kvref::MoverFaults* f, bool leaky_refused_allocation, bool unchecked_unlock,
              bool unordered_transfers, bool unfenced_copies) {
             new (f) kvref::MoverFaults{leaky_refused_allocation, unchecked_unlock, unordered_transfers,
                                        unfenced_copies};
           },
           nb::kw_only(), nb::arg("leaky_refused_allocation") = false, nb::arg("unchecked_unlock") = false,
           nb::arg("unordered_transfers") = false, nb::arg("unfenced_copies") = false)
      .def_ro("leaky_refused_allocation", &kvref::MoverFaults::leaky_refused_allocation)
      .def_ro("unchecked_unlock", &kvref::MoverFaults::unchecked_unlock)
      .def_ro("unordered_transfers", &kvref::MoverFaults::unordered_transfers)
      .def_ro("unfenced_copies", &kvref::MoverFaults::unfenced_copies);

  nb::enum_<kvref::ChunkState>(m, "ChunkState")
      .value("FREE", kvref::ChunkState::kFree, "unlocked, no bytes (never written, or its save failed)")
      .value("WRITING", kvref::ChunkState::kWriting, "unlocked, a d2h into it in flight")
      .value("CACHED", kvref::ChunkState::kCached, "unlocked, holding bytes until handed out again")
      .value("SAVING", kvref::ChunkState::kSaving, "locked, its save in flight")
      .value("SAVED", kvref::ChunkState::kSaved, "locked, holding its save's bytes")
      .value("FAILED", kvref::ChunkState::kFailed, "locked, its save failed: no bytes");

  nb::enum_<Direction>(m, "Direction")
      .value("DEVICE_TO_HOST", Direction::kDeviceToHost)
      .value("HOST_TO_DEVICE", Direction::kHostToDevice);

  nb::class_<TransferFuture>(m, "TransferFuture")
      .def("wait", &TransferFuture::wait, nb::arg("timeout_s") = -1.0,
           nb::call_guard<ReleasedGil>())
      .def("done", &TransferFuture::done)
      .def("rethrow", &TransferFuture::rethrow);

  nb::class_<BlockMover>(m, "BlockMover")
      // Made through a shared_ptr: transfer tasks keep the mover alive.
      .def(nb::new_([](std::vector<LayerAddressing> layers, int64_t host_blocks,
                       int64_t host_bytes, nb::object external_host) {
             uint8_t* host = nullptr;
             kvref::Owner owner;
             if (!external_host.is_none()) {  // the caller's array, held while the mover lives
               Bytes bytes = nb::cast<Bytes>(external_host);
               check_size("external host array", bytes.size(), host_bytes);
               host = bytes.data();
               owner = python_owner(external_host);
             }
             return std::make_shared<BlockMover>(std::move(layers), host_blocks, host_bytes, host,
                                                 std::move(owner));
           }),
           nb::arg("layers"), nb::arg("host_blocks"), nb::arg("host_bytes"),
           nb::arg("external_host") = nb::none())
      .def("copy",
           [](BlockMover& mover, Direction direction, Int64s src, Int64s dst, Int64s counts) {
             if (src.size() != dst.size() || src.size() != counts.size())
               throw std::invalid_argument("offset and size lists differ in length");
             return mover.copy(direction, src.data(), dst.data(), counts.data(), src.size());
           },
           nb::arg("direction").noconvert(), nb::arg("src"), nb::arg("dst"), nb::arg("counts"))
      .def("save",
           [](BlockMover& mover, Int64s src, Int64s counts) {
             if (src.size() != counts.size())
               throw std::invalid_argument("src_offsets and copy_sizes differ in length");
             return mover.save(src.data(), counts.data(), src.size());
           },
           nb::arg("src"), nb::arg("counts"),
           "d2h into chunks it allocates: (chunk ids, future). Refused requests take no chunk.")
      .def("unlock",
           [](BlockMover& mover, Int64s ids) { mover.pool().chunks.unlock(ids.data(), ids.size()); },
           nb::arg("ids"))
      .def("claim", [](BlockMover& mover, int64_t n, const std::string& caller) { return mover.pool().claim(n, caller); },
           nb::arg("n"), nb::arg("caller"),
           "Locks `n` chunks to be written from elsewhere (SAVING): their ids. PoolExhausted takes none.")
      .def("settle_claim",
           [](BlockMover& mover, Int64s ids, bool ok) { mover.pool().settle_claim(ids.data(), ids.size(), ok); },
           nb::arg("ids"), nb::arg("ok"), "Claimed chunks written (SAVED) or not (FAILED).")
      .def("hold_for_peer",
           [](BlockMover& mover, Int64s ids) { mover.pool().chunks.begin_peer_reads(ids.data(), ids.size()); },
           nb::arg("ids"), "Keeps chunks that hold bytes from being written or handed out while a peer reads them.")
      .def("release_from_peer",
           [](BlockMover& mover, Int64s ids) { mover.pool().release_from_peer(ids.data(), ids.size()); },
           nb::arg("ids"))
      .def("adopt",
           [](BlockMover& mover, Int64s ids) { mover.pool().chunks.adopt(ids.data(), ids.size()); },
           nb::arg("ids"), "Locks FREE chunks of a recovered pool as SAVED.")
      .def("chunk_state", [](BlockMover& mover, int64_t id) { return mover.pool().chunks.state(id); },
           nb::arg("id"))
      .def_prop_ro("chunks_available", [](BlockMover& m) { return m.pool().chunks.available(); })
      .def_prop_rw(
          "faults", [](BlockMover& mover) { return mover.pool().faults; },
          [](BlockMover& mover, const kvref::MoverFaults& faults) { mover.pool().set_faults(faults); },
          "The old bugs this mover's pool has switched on (every mover of the pool shares them).")
      .def("set_parallelism", [](BlockMover& mover, int64_t parts) { mover.pool().set_parallelism(parts); },
           nb::arg("parts"))
      .def("with_shard", &BlockMover::with_shard, nb::arg("layer"), nb::arg("shard"),
           nb::arg("region"))
      .def_prop_ro("host_bytes", &BlockMover::host_bytes)
      .def("read_host_block",
           [](BlockMover& mover, int layer, int shard, int64_t block) {
             const uint8_t* p = mover.host_block(layer, shard, block);
             return nb::bytes(reinterpret_cast<const char*>(p), mover.layers()[layer].block_bytes);
           },
           nb::arg("layer"), nb::arg("shard"), nb::arg("block"))
      .def("write_host_block",
           [](BlockMover& mover, int layer, int shard, int64_t block, ReadOnlyBytes payload) {
             mover.write_host_block(layer, shard, block, payload.data(), payload.size());
           },
           nb::arg("layer"), nb::arg("shard"), nb::arg("block"), nb::arg("payload"))
      .def("host_pool",
           [](nb::handle_t<BlockMover> self) {
             BlockMover& mover = nb::cast<BlockMover&>(self);
             // The view keeps the mover (and so its pool) alive.
             return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(
                 mover.host_data(), {static_cast<size_t>(mover.host_bytes())}, self);
           },
           "A NumPy view of the whole host pool (no copy).");
}

}  // namespace kvref_bind
