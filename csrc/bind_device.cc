// Bindings of the simulated device and its buffers.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <vector>

#include "bindings.h"
#include "buffer_ops.h"
#include "device.h"
#include "tiled_layout.h"

namespace kvref_bind {

using kvref::Arrival;
using kvref::BufferState;
using kvref::Compute;
using kvref::DeviceBuffer;
using kvref::SimDevice;

namespace {

kvref::ConstSpan span(ReadOnlyBytes bytes) { return {bytes.data(), bytes.size()}; }
kvref::Span span(Bytes bytes) { return {bytes.data(), bytes.size()}; }

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
          [](SimDevice& device, const kvref::TiledLayout& layout, ReadOnlyBytes logical, int itemsize,
             Arrival arrival, int64_t land_after_us, bool until_needed) {
            ReleasedGil released;  // the caller's array is packed straight into the new buffer
            return kvref::new_buffer(device.shared_from_this(), layout, span(logical), itemsize, arrival,
                                     Compute{land_after_us, until_needed});
          },
          nb::arg("device"), nb::arg("layout"), nb::arg("logical"), nb::arg("itemsize"),
          nb::arg("arrival").noconvert(), nb::arg("land_after_us") = 0, nb::arg("until_needed") = false)
      .def("overwrite",
           [](DeviceBuffer& b, const kvref::TiledLayout& layout, ReadOnlyBytes logical, int itemsize, bool defer,
              int64_t run_us, bool until_needed) {
             kvref::overwrite(b, layout, span(logical), itemsize, defer, Compute{run_us, until_needed});
           },
           nb::arg("layout"), nb::arg("logical"), nb::arg("itemsize"), nb::arg("defer"),
           nb::arg("run_us") = 0, nb::arg("until_needed") = false, "An in-place device op writing new contents.")
      .def("overwrite_rows",
           [](DeviceBuffer& b, int64_t row_bytes, const std::vector<int64_t>& rows, ReadOnlyBytes data,
              int64_t run_us, bool until_needed) {
             kvref::overwrite_rows(b, row_bytes, rows, span(data), Compute{run_us, until_needed});
           },
           nb::arg("row_bytes"), nb::arg("rows"), nb::arg("data"), nb::arg("run_us") = 0,
           nb::arg("until_needed") = false, "An in-place device op writing some rows' physical bytes alone.")
      .def("zero", &kvref::zero, nb::arg("defer"), "An in-place device op writing zeros over every byte, padding too.")
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
             ReleasedGil released;  // a copy into the buffer issued before this read lands first
             kvref::read_physical(b, span(out));
           },
           nb::arg("out"), "Copy the physical bytes out (a debugging read; no DMA faults).")
      .def("read_logical",
           [](DeviceBuffer& b, const kvref::TiledLayout& layout, Bytes out, int itemsize) {
             ReleasedGil released;
             kvref::read_logical(b, layout, span(out), itemsize);
           },
           nb::arg("layout"), nb::arg("out"), nb::arg("itemsize"),
           "Unpack the physical bytes into the logical array `out` (read_physical, without "
           "the copy of the physical bytes in between).");
}

}  // namespace kvref_bind
