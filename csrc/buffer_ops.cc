#include "buffer_ops.h"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "checked.h"
#include "pack.h"

namespace kvref {

namespace {

void check_bytes(const char* what, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want)
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(got) + " bytes, expected " +
                                std::to_string(want));
}

// Bytes of the logical array a layout holds, checked against the caller's.
void check_logical(const TiledLayout& layout, size_t logical_bytes, int itemsize) {
  check_bytes("logical array", logical_bytes, checked_mul(layout.logical_elements(), itemsize, "logical byte count"));
}

void check_compute(const Compute& compute, const char* name) {
  if (compute.us < 0) throw std::invalid_argument(std::string(name) + " must not be negative");
}

// A copy of the caller's bytes an op keeps until it runs.
std::shared_ptr<PageBuffer> kept(ConstSpan bytes) {
  auto copy = std::make_shared<PageBuffer>(static_cast<int64_t>(bytes.size));
  if (bytes.size) std::memcpy(copy->data(), bytes.data, bytes.size);
  return copy;
}

// An op's computation before it writes (see Compute), on `device` from `since`.
void run_compute(SimDevice& device, Compute compute, int64_t since) {
  if (compute.until_needed) device.wait_for_demand(since, compute.us);
  else std::this_thread::sleep_for(std::chrono::microseconds(compute.us));
}

}  // namespace

std::shared_ptr<DeviceBuffer> new_buffer(const std::shared_ptr<SimDevice>& device, const TiledLayout& layout,
                                         ConstSpan logical, int itemsize, Arrival arrival, Compute land) {
  check_logical(layout, logical.size, itemsize);
  check_compute(land, "land_after_us");
  const int64_t since = device->demands();
  auto buffer = std::make_shared<DeviceBuffer>(device, layout.physical_bytes());
  // Packed now, into the new buffer itself, not into a copy that its op packs
  // later: nothing reads a buffer's bytes before its op has run (DMA and reads
  // are refused until it is MATERIALIZED), so the op need only be their arrival,
  // and the caller's array is read during the call, as a copy would read it.
  pack(layout, logical.data, buffer->unsafe_data(), itemsize);
  DeviceBuffer::Op arrived = [](uint8_t*) {};
  if (arrival == Arrival::kDeferred) {
    buffer->defer(std::move(arrived));
  } else if (arrival == Arrival::kComputed) {
    buffer->launch(std::move(arrived), BufferState::kExecuting);
  } else {  // a host-to-device copy: it waits on the DMA engine, then lands
    buffer->launch([device, land, since](uint8_t*) {
      device->before_dma("host-to-device put");
      run_compute(*device, land, since);
    }, BufferState::kMaterializing);
  }
  return buffer;
}

void overwrite(DeviceBuffer& buffer, const TiledLayout& layout, ConstSpan logical, int itemsize, bool defer,
               Compute run) {
  check_logical(layout, logical.size, itemsize);
  check_compute(run, "run_us");
  auto data = kept(logical);
  std::shared_ptr<SimDevice> device = buffer.device().shared_from_this();
  const int64_t since = device->demands();
  DeviceBuffer::Op op = [layout, data, itemsize, run, device, since](uint8_t* dst) {
    run_compute(*device, run, since);  // a long-running computation: it computes, then writes its result
    pack(layout, data->data(), dst, itemsize);
  };
  if (defer) buffer.defer(std::move(op));
  else buffer.launch(std::move(op), BufferState::kExecuting);
}

void overwrite_rows(DeviceBuffer& buffer, int64_t row_bytes, const std::vector<int64_t>& rows, ConstSpan data,
                    Compute run) {
  check_compute(run, "run_us");
  if (row_bytes <= 0) throw std::invalid_argument("row_bytes must be positive");
  check_bytes("row bytes", data.size, checked_mul(static_cast<int64_t>(rows.size()), row_bytes, "row byte count"));
  const int64_t count = buffer.size() / row_bytes;
  for (int64_t row : rows) {
    if (row < 0 || row >= count)
      throw std::out_of_range("row " + std::to_string(row) + " is outside the buffer's " + std::to_string(count) +
                              " rows");
  }
  auto bytes = kept(data);
  std::shared_ptr<SimDevice> device = buffer.device().shared_from_this();
  const int64_t since = device->demands();
  buffer.launch([rows, row_bytes, bytes, run, device, since](uint8_t* dst) {
    run_compute(*device, run, since);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(dst + rows[i] * row_bytes, bytes->data() + static_cast<int64_t>(i) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  }, BufferState::kExecuting);
}

void zero(DeviceBuffer& buffer, bool defer) {
  DeviceBuffer::Op op = [bytes = buffer.size()](uint8_t* dst) {
    if (bytes) std::memset(dst, 0, static_cast<size_t>(bytes));
  };
  if (defer) buffer.defer(std::move(op));
  else buffer.launch(std::move(op), BufferState::kExecuting);
}

namespace {

// The buffer's bytes once every copy into it issued before has landed.
const uint8_t* landed(DeviceBuffer& buffer) {
  buffer.wait_dma_writes();
  if (buffer.state() != BufferState::kMaterialized)
    throw DeviceError("read of a buffer that is not materialized");
  return buffer.unsafe_data();
}

}  // namespace

void read_physical(DeviceBuffer& buffer, Span out) {
  check_bytes("output", out.size, buffer.size());
  std::memcpy(out.data, landed(buffer), out.size);
}

void read_logical(DeviceBuffer& buffer, const TiledLayout& layout, Span out, int itemsize) {
  check_logical(layout, out.size, itemsize);
  check_bytes("buffer", static_cast<size_t>(buffer.size()), layout.physical_bytes());
  unpack(layout, landed(buffer), out.data, itemsize);
}

}  // namespace kvref
