#include "device.h"
#include "stream_copy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <utility>
#include <cstring>

namespace kvref {

PageBuffer::PageBuffer(int64_t bytes) : size_(bytes) {
  if (bytes < 0) throw std::invalid_argument("buffer size must not be negative");
  if (bytes == 0) return;
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  // A hint, as NumPy gives its large arrays: touching a large buffer then
  // faults in 2 MiB pages, not 4 KiB ones (still only where touched).
  if (bytes >= kHugePageHintBytes) madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);
  data_ = static_cast<uint8_t*>(p);
}

PageBuffer::~PageBuffer() {
  if (data_) munmap(data_, static_cast<size_t>(size_));
}

SimDevice::SimDevice(int id)
    : id_(id),
      creator_pid_(getpid()),
      queue_(std::make_shared<ExecutorQueue>()),
      executor_(run_executor, queue_) {}

void SimDevice::check_process() const {
  if (getpid() != creator_pid_)
    throw DeviceError("simulated device " + std::to_string(id_) + " was made in process " +
                      std::to_string(creator_pid_) + " before a fork, and its executor does not " +
                      "run in this process (" + std::to_string(getpid()) +
                      "): make a new SimDevice here");
}

SimDevice::~SimDevice() {
  if (getpid() != creator_pid_) {  // a forked child: the executor thread is the parent's
    new std::thread(std::move(executor_));  // never joined, never destroyed
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  // The last owner may be a task finishing on the executor itself.
  if (executor_.get_id() == std::this_thread::get_id()) executor_.detach();
  else executor_.join();
}

void SimDevice::enqueue(std::function<void()> task) {
  check_process();
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->tasks.push_back(std::move(task));
  }
  queue_->cv.notify_all();
}

void SimDevice::run_executor(std::shared_ptr<ExecutorQueue> q) {
  std::unique_lock<std::mutex> lock(q->mu);
  for (;;) {
    q->cv.wait(lock, [&q] { return q->stop || !q->tasks.empty(); });
    if (q->tasks.empty()) return;  // stopping, and nothing left to run
    {
      auto task = std::move(q->tasks.front());
      q->tasks.pop_front();
      q->busy = true;
      lock.unlock();
      task();
    }  // the task (and whatever it owned) is released without the lock held
    lock.lock();
    q->busy = false;
    q->cv.notify_all();
  }
}

void SimDevice::track_deferred(const std::shared_ptr<DeviceBuffer>& buffer) {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  deferred_.push_back(buffer);
}

void SimDevice::sync() {
  check_process();
  std::vector<std::weak_ptr<DeviceBuffer>> pending;
  {
    std::lock_guard<std::mutex> lock(deferred_mu_);
    pending.swap(deferred_);
  }
  for (auto& weak : pending)
    if (auto buffer = weak.lock()) buffer->materialize();
  Waiting waiting(*this);
  std::unique_lock<std::mutex> lock(queue_->mu);
  queue_->cv.wait(lock, [this] { return queue_->tasks.empty() && !queue_->busy; });
}

void SimDevice::set_dma_faults(int64_t delay_us, int64_t fail_every) {
  if (delay_us < 0 || fail_every < 0)
    throw std::invalid_argument("DMA delay and failure period must not be negative");
  delay_us_ = delay_us;
  fail_every_ = fail_every;
}

void SimDevice::before_dma(const char* what) {
  const int64_t n = ++dma_count_;
  if (const int64_t delay = delay_us_.load())
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
  const int64_t every = fail_every_.load();
  if (every > 0 && n % every == 0)
    throw DeviceError(std::string("injected DMA failure on device ") + std::to_string(id_) +
                      " (" + what + " #" + std::to_string(n) + ")");
}

int64_t SimDevice::demands() const {
  std::lock_guard<std::mutex> lock(demand_mu_);
  return demands_;
}

void SimDevice::demand() {
  {
    std::lock_guard<std::mutex> lock(demand_mu_);
    ++demands_;
  }
  demand_cv_.notify_all();
}

void SimDevice::wait_for_demand(int64_t since, int64_t max_us) {
  std::unique_lock<std::mutex> lock(demand_mu_);
  demand_cv_.wait_for(lock, std::chrono::microseconds(max_us),
                      [&] { return demands_ > since || waiting_ > 0; });
}

SimDevice::Waiting::Waiting(SimDevice& device) : device_(device) {
  {
    std::lock_guard<std::mutex> lock(device_.demand_mu_);
    ++device_.waiting_;
    ++device_.demands_;
  }
  device_.demand_cv_.notify_all();
}

SimDevice::Waiting::~Waiting() {
  std::lock_guard<std::mutex> lock(device_.demand_mu_);
  --device_.waiting_;
}

DeviceBuffer::DeviceBuffer(std::shared_ptr<SimDevice> device, int64_t bytes)
    : device_(std::move(device)), bytes_(bytes) {}

BufferState DeviceBuffer::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void DeviceBuffer::defer(Op op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::move(op);
    state_ = BufferState::kDeferred;
  }
  device_->track_deferred(shared_from_this());
}

void DeviceBuffer::run(const Op& op) {
  bool placed = false;  // whether it waited for earlier copies (its place in program order taken)
  {  // copies issued before this op was launched come first
    std::unique_lock<std::mutex> lock(mu_);
    if (dma_reads_ || dma_writes_) {
      placed = true;
      ++ops_placed_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return dma_reads_ == 0 && dma_writes_ == 0; });
    }
  }
  std::string error;
  try {
    op(bytes_.data());
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error.empty()) error_ = error;
    if (!placed) ++ops_placed_;  // it ran past every copy: a hold until the next op ends here
    // Ready only when no launched op is left; an op recorded meanwhile keeps it DEFERRED.
    if (--in_flight_ == 0 && state_ != BufferState::kDeferred)
      state_ = error_.empty() ? BufferState::kMaterialized : BufferState::kFailed;
  }
  cv_.notify_all();
}

void DeviceBuffer::launch(Op op, BufferState running) {
  device_->check_process();  // before anything changes: an op that cannot run leaves no trace
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_++ == 0) error_.clear();  // a new op sequence starts clean
    state_ = running;
  }
  auto self = shared_from_this();
  device_->enqueue([self, op = std::move(op)] { self->run(op); });
}

void DeviceBuffer::materialize() {
  Op op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != BufferState::kDeferred) return;
    op = std::move(pending_);
    pending_ = nullptr;
  }
  launch(std::move(op), BufferState::kExecuting);
}

bool DeviceBuffer::await(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [this] {
    return state_ == BufferState::kMaterialized || state_ == BufferState::kFailed;
  };
  if (!ready()) device_->check_process();  // an op its parent launched never ends here
  std::optional<SimDevice::Waiting> waiting;  // asked for a result: gated ops compute no longer
  if (ready()) device_->demand();
  else waiting.emplace(*device_);
  if (timeout_s < 0) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
    return false;
  }
  if (state_ == BufferState::kFailed) throw DeviceError("device op failed: " + error_);
  return true;
}

void DeviceBuffer::fail_dma_in(int64_t start, int64_t end) {
  if (start < 0 || end < start || end > size())
    throw std::invalid_argument("failure range must lie within the buffer");
  std::lock_guard<std::mutex> lock(mu_);
  failing_ranges_.emplace_back(start, end);
}

void DeviceBuffer::hold_next_dma(int64_t delay_us, bool until_next_op) {
  if (delay_us < 0) throw std::invalid_argument("a DMA hold must not be negative");
  std::lock_guard<std::mutex> lock(mu_);
  hold_us_ = delay_us;
  hold_until_op_ = until_next_op;
  hold_ops_ = ops_placed_;
}

void DeviceBuffer::release_dma_hold() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_us_ = 0;  // a hold not yet met by a copy
    hold_until_op_ = false;
    ++releases_;   // and one a copy waits in
  }
  cv_.notify_all();
}

void DeviceBuffer::begin_dma(bool write) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != BufferState::kMaterialized)
    throw BufferNotReady(std::string(write ? "host-to-device" : "device-to-host") +
                         " copy of a buffer that is not materialized");
  ++(write ? dma_writes_ : dma_reads_);
}

void DeviceBuffer::end_dma(bool write) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --(write ? dma_writes_ : dma_reads_);
  }
  cv_.notify_all();
}

void DeviceBuffer::wait_dma_writes() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return dma_writes_ == 0; });
}

void DeviceBuffer::check_dma(int64_t offset, int64_t size, const char* what, bool fenced) {
  device_->demand();
  int64_t delay_us = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!fenced && state_ != BufferState::kMaterialized)
      throw BufferNotReady(std::string(what) + " of a buffer that is not materialized");
    if (offset < 0 || size < 0 || offset + size > bytes_.size())
      throw std::out_of_range(std::string(what) + " range is outside the buffer");
    for (const auto& [start, end] : failing_ranges_)
      if (offset < end && start < offset + size)
        throw DeviceError(std::string("injected DMA failure: ") + what + " of bytes [" +
                          std::to_string(offset) + ", " + std::to_string(offset + size) +
                          ") touches failing range [" + std::to_string(start) + ", " +
                          std::to_string(end) + ")");
    std::swap(delay_us, hold_us_);
    if (delay_us) {
      const bool until_op = std::exchange(hold_until_op_, false);
      const int64_t placed = hold_ops_, released = releases_;
      std::optional<SimDevice::Waiting> waiting;
      if (until_op) waiting.emplace(*device_);  // it waits for an op: a gated one computes no longer
      cv_.wait_for(lock, std::chrono::microseconds(delay_us),
                   [&] { return (until_op && ops_placed_ > placed) || releases_ > released; });
    }
  }
  device_->before_dma(what);
}

void DeviceBuffer::dma_read(int64_t offset, int64_t size, uint8_t* dst, bool fenced) {
  check_dma(offset, size, "device-to-host copy", fenced);
  stream_copy(dst, bytes_.data() + offset, static_cast<size_t>(size));
}

void DeviceBuffer::dma_write(int64_t offset, int64_t size, const uint8_t* src, bool fenced) {
  check_dma(offset, size, "host-to-device copy", fenced);
  stream_copy(bytes_.data() + offset, src, static_cast<size_t>(size));
}

}  // namespace kvref
