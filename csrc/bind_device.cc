// Bindings of the simulated device and its buffers.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "checked.h"
#include "device.h"
#include "pack.h"
#include "tiled_layout.h"

namespace kvref_bind {

using kvref::BufferState;
using kvref::DeviceBuffer;
using kvref::SimDevice;

namespace {

// How a new buffer's contents arrive.
enum class Arrival { kDeferred, kComputed, kPut };

// Bytes of the logical array a layout holds, checked against the caller's.
void check_logical(const kvref::TiledLayout& layout, size_t logical_bytes, int itemsize) {
  check_size("logical array", logical_bytes,
             kvref::checked_mul(layout.logical_elements(), itemsize, "logical byte count"));
}

// An op that packs a logical host array into the buffer's physical bytes.
DeviceBuffer::Op pack_op(const kvref::TiledLayout& layout, ReadOnlyBytes logical, int itemsize) {
  auto data = std::make_shared<kvref::PageBuffer>(static_cast<int64_t>(logical.size()));
  if (logical.size()) std::memcpy(data->data(), logical.data(), logical.size());
  return [layout, data, itemsize](uint8_t* dst) { kvref::pack(layout, data->data(), dst, itemsize); };
}

// An op that writes whole rows of physical bytes (`data`: each row's
// `row_bytes`, in the order of `rows`) at row * row_bytes, nothing else.
DeviceBuffer::Op rows_op(int64_t buffer_bytes, int64_t row_bytes, const std::vector<int64_t>& rows,
                         ReadOnlyBytes data) {
  if (row_bytes <= 0) throw std::invalid_argument("row_bytes must be positive");
  check_size("row bytes", data.size(),
             kvref::checked_mul(static_cast<int64_t>(rows.size()), row_bytes, "row byte count"));
  for (int64_t row : rows) {
    if (row < 0 || row >= buffer_bytes / row_bytes) {
      throw std::out_of_range("row " + std::to_string(row) + " is outside the buffer's " +
                              std::to_string(buffer_bytes / row_bytes) + " rows");
    }
  }
  auto bytes = std::make_shared<kvref::PageBuffer>(static_cast<int64_t>(data.size()));
  if (data.size()) std::memcpy(bytes->data(), data.data(), data.size());
  return [rows, row_bytes, bytes](uint8_t* dst) {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(dst + rows[i] * row_bytes, bytes->data() + static_cast<int64_t>(i) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  };
}

// An op's computation before it writes: `us`, or until the device's results
// are needed after `since` when `until_needed` (SimDevice::wait_for_demand).
void compute(SimDevice& device, int64_t us, bool until_needed, int64_t since) {
  if (until_needed) device.wait_for_demand(since, us);
  else std::this_thread::sleep_for(std::chrono::microseconds(us));
}

}  // namespace

void bind_device(nb::module_& m) {
  nb::enum_<Arrival>(m, "Arrival")
      .value("DEFERRED", Arrival::kDeferred, "recorded, run when materialized")
      .value("COMPUTED", Arrival::kComputed, "a device computation, launched now")
      .value("PUT", Arrival::kPut, "a host-to-device copy, launched now");

  nb::enum_<BufferState>(m, "BufferState")
      .value("PLACEHOLDER", BufferState::kPlaceholder)
      .value("DEFERRED", BufferState::kDeferred)
      .value("EXECUTING", BufferState::kExecuting)
      .value("MATERIALIZING", BufferState::kMaterializing)
      .value("MATERIALIZED", BufferState::kMaterialized)
      .value("FAILED", BufferState::kFailed);

  // C++ owns every device and buffer through std::shared_ptr, so releasing one
  // from a C++ thread never needs the GIL.
  nb::class_<SimDevice>(m, "SimDevice")
      .def(nb::new_([](int id) { return std::make_shared<SimDevice>(id); }), nb::arg("id"))
      .def_prop_ro("id", &SimDevice::id)
      .def("sync", &SimDevice::sync, nb::call_guard<ReleasedGil>())
      .def("set_dma_faults", &SimDevice::set_dma_faults, nb::arg("delay_us"), nb::arg("fail_every"))
      .def_prop_ro("dma_count", &SimDevice::dma_count);

  nb::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def_static(
          "create",
          [](SimDevice& device_ref, const kvref::TiledLayout& layout, ReadOnlyBytes logical,
             int itemsize, Arrival arrival, int64_t land_after_us, bool until_needed) {
            std::shared_ptr<SimDevice> device = device_ref.shared_from_this();
            check_logical(layout, logical.size(), itemsize);
            if (land_after_us < 0) throw std::invalid_argument("land_after_us must not be negative");
            const int64_t since = device->demands();
            auto buffer = std::make_shared<DeviceBuffer>(device, layout.physical_bytes());
            {
              // Packed now, into the new buffer itself, not into a copy that its op packs
              // later: nothing reads a buffer's bytes before its op has run (DMA and reads
              // are refused until it is MATERIALIZED), so the op need only be their arrival,
              // and the caller's array is read during the call, as a copy would read it.
              ReleasedGil released;
              kvref::pack(layout, logical.data(), buffer->unsafe_data(), itemsize);
            }
            DeviceBuffer::Op arrived = [](uint8_t*) {};
            if (arrival == Arrival::kDeferred) {
              buffer->defer(std::move(arrived));
            } else if (arrival == Arrival::kComputed) {
              buffer->launch(std::move(arrived), BufferState::kExecuting);
            } else {
              // A host-to-device copy: it waits on the DMA engine, then lands.
              buffer->launch([device, land_after_us, until_needed, since](uint8_t*) {
                device->before_dma("host-to-device put");
                compute(*device, land_after_us, until_needed, since);
              }, BufferState::kMaterializing);
            }
            return buffer;
          },
          nb::arg("device"), nb::arg("layout"), nb::arg("logical"), nb::arg("itemsize"),
          nb::arg("arrival").noconvert(), nb::arg("land_after_us") = 0, nb::arg("until_needed") = false)
      .def("overwrite",
           [](DeviceBuffer& b, const kvref::TiledLayout& layout, ReadOnlyBytes logical,
              int itemsize, bool defer, int64_t run_us, bool until_needed) {
             check_logical(layout, logical.size(), itemsize);
             if (run_us < 0) throw std::invalid_argument("run_us must not be negative");
             auto pack = pack_op(layout, logical, itemsize);
             std::shared_ptr<SimDevice> device = b.device().shared_from_this();
             const int64_t since = device->demands();
             DeviceBuffer::Op op = [pack, run_us, until_needed, device, since](uint8_t* dst) {
               // A long-running computation: it computes, then writes its result.
               compute(*device, run_us, until_needed, since);
               pack(dst);
             };
             if (defer) b.defer(std::move(op));
             else b.launch(std::move(op), BufferState::kExecuting);
           },
           nb::arg("layout"), nb::arg("logical"), nb::arg("itemsize"), nb::arg("defer"),
           nb::arg("run_us") = 0, nb::arg("until_needed") = false, "An in-place device op writing new contents.")
      .def("overwrite_rows",
           [](DeviceBuffer& b, int64_t row_bytes, const std::vector<int64_t>& rows, ReadOnlyBytes data,
              int64_t run_us, bool until_needed) {
             if (run_us < 0) throw std::invalid_argument("run_us must not be negative");
             auto write = rows_op(b.size(), row_bytes, rows, data);
             std::shared_ptr<SimDevice> device = b.device().shared_from_this();
             const int64_t since = device->demands();
             b.launch([write, run_us, until_needed, device, since](uint8_t* dst) {
               compute(*device, run_us, until_needed, since);
               write(dst);
             }, BufferState::kExecuting);
           },
           nb::arg("row_bytes"), nb::arg("rows"), nb::arg("data"), nb::arg("run_us") = 0,
           nb::arg("until_needed") = false, "An in-place device op writing some rows' physical bytes alone.")
      .def("zero",
           [](DeviceBuffer& b, bool defer) {
             DeviceBuffer::Op op = [bytes = b.size()](uint8_t* dst) {
               if (bytes) std::memset(dst, 0, static_cast<size_t>(bytes));
             };
             if (defer) b.defer(std::move(op));
             else b.launch(std::move(op), BufferState::kExecuting);
           },
           nb::arg("defer"), "An in-place device op writing zeros over every byte, padding too.")
      .def_prop_ro("state", &DeviceBuffer::state)
      .def_prop_ro("size", &DeviceBuffer::size)
      .def("materialize", &DeviceBuffer::materialize)
      // Deliberately keeps the GIL while waiting: a wait that nothing will end
      // hangs the whole interpreter, exactly as the unpack bug did.
      .def("await_", &DeviceBuffer::await, nb::arg("timeout_s") = -1.0)
      .def("fail_dma_in", &DeviceBuffer::fail_dma_in, nb::arg("start"), nb::arg("end"))
      .def("hold_next_dma", &DeviceBuffer::hold_next_dma, nb::arg("delay_us"), nb::arg("until_next_op"))
      .def("release_dma_hold", &DeviceBuffer::release_dma_hold)
      .def("read_physical",
           [](DeviceBuffer& b, Bytes out) {
             check_size("output", out.size(), b.size());
             {  // a copy into the buffer issued before this read lands first
               ReleasedGil released;
               b.wait_dma_writes();
             }
             if (b.state() != BufferState::kMaterialized)
               throw kvref::DeviceError("read of a buffer that is not materialized");
             std::memcpy(out.data(), b.unsafe_data(), out.size());
           },
           "Copy the physical bytes out (a debugging read; no DMA faults).")
      .def("read_logical",
           [](DeviceBuffer& b, const kvref::TiledLayout& layout, Bytes out, int itemsize) {
             check_logical(layout, out.size(), itemsize);
             check_size("buffer", static_cast<size_t>(b.size()), layout.physical_bytes());
             {
               ReleasedGil released;
               b.wait_dma_writes();
             }
             if (b.state() != BufferState::kMaterialized)
               throw kvref::DeviceError("read of a buffer that is not materialized");
             kvref::unpack(layout, b.unsafe_data(), out.data(), itemsize);
           },
           nb::arg("layout"), nb::arg("out"), nb::arg("itemsize"),
           "Unpack the physical bytes into the logical array `out` (read_physical, without "
           "the copy of the physical bytes in between).");
}

}  // namespace kvref_bind
