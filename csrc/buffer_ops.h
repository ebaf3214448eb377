// What a simulated device buffer's contents do, as a caller's array asks:
// arrive (recorded, computed or copied from the host), get overwritten in
// place (whole or by rows, or zeroed), and be read back. Plain bytes and
// layouts only; the bindings hand the caller's arrays in as spans.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "device.h"
#include "tiled_layout.h"

namespace kvref {

// A caller's bytes, read during the call that takes them.
struct ConstSpan {
  const uint8_t* data;
  size_t size;
};
struct Span {
  uint8_t* data;
  size_t size;
};

// How a new buffer's contents arrive.
enum class Arrival { kDeferred, kComputed, kPut };

// How long an op computes before it writes: `us`, or until the device's
// results are needed after its launch when `until_needed`
// (SimDevice::wait_for_demand).
struct Compute {
  int64_t us = 0;
  bool until_needed = false;
};

// A buffer of `layout` on `device` holding the logical array `logical` once
// it arrives as `arrival` says (a put waits on the DMA engine and lands after
// `land`). The array is packed during the call, straight into the buffer.
std::shared_ptr<DeviceBuffer> new_buffer(const std::shared_ptr<SimDevice>& device, const TiledLayout& layout,
                                         ConstSpan logical, int itemsize, Arrival arrival, Compute land);

// An in-place op writing the logical array `logical` over `buffer` after it
// computes; recorded (`defer`) or launched now.
void overwrite(DeviceBuffer& buffer, const TiledLayout& layout, ConstSpan logical, int itemsize, bool defer,
               Compute run);

// An in-place op, launched now, writing whole rows of physical bytes
// (`data`: each row's `row_bytes`, in the order of `rows`) and nothing else.
void overwrite_rows(DeviceBuffer& buffer, int64_t row_bytes, const std::vector<int64_t>& rows, ConstSpan data,
                    Compute run);

// An in-place op writing zeros over every byte, padding too.
void zero(DeviceBuffer& buffer, bool defer);

// The physical bytes, or the logical array they hold, once every copy into
// the buffer issued before has landed; DeviceError unless it is materialized.
void read_physical(DeviceBuffer& buffer, Span out);
void read_logical(DeviceBuffer& buffer, const TiledLayout& layout, Span out, int itemsize);

}  // namespace kvref
