// A simulated TPU device: buffers in physical byte order, an executor thread
// that runs recorded ops, and a DMA model with injectable delays and failures.
//
// Buffer lifecycle (as in TorchTPU): PLACEHOLDER -> DEFERRED (op recorded, not
// run) -> EXECUTING (op launched) -> MATERIALIZED; a host->device put is
// MATERIALIZING until its copy lands. await() waits and never launches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvref {

enum class BufferState : int {
  kPlaceholder = 0,
  kDeferred = 1,
  kExecuting = 2,
  kMaterializing = 3,
  kMaterialized = 4,
  kFailed = 5,
};

// A device-side copy failed (an injected fault, or a buffer not ready).
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A copy issued while the buffer is not materialized (an op still computing
// it): nothing was copied, and the same copy can be made once it is.
class BufferNotReady : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

// Page-aligned, zero-filled memory that is only committed when touched.
class PageBuffer {
 public:
  static constexpr int64_t kHugePageHintBytes = int64_t{4} << 20;
  explicit PageBuffer(int64_t bytes);
  ~PageBuffer();
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

class DeviceBuffer;

// The queue a device's executor thread drains. Shared with the thread, so the
// thread may outlive the device when the device's last owner is its own task.
struct ExecutorQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  bool busy = false;
  bool stop = false;
};

// Always owned by a std::shared_ptr (buffers and their ops keep it alive).
class SimDevice : public std::enable_shared_from_this<SimDevice> {
 public:
  explicit SimDevice(int id);
  ~SimDevice();
  int id() const { return id_; }
  // DeviceError in a forked child: this device's executor is its parent's.
  void check_process() const;

  void enqueue(std::function<void()> task);
  // Launches every deferred buffer and waits until the executor is idle.
  void sync();
  void track_deferred(const std::shared_ptr<DeviceBuffer>& buffer);

  // DMA model: every copy waits `delay_us`; every `fail_every`-th copy fails.
  void set_dma_faults(int64_t delay_us, int64_t fail_every);
  void before_dma(const char* what);  // throws DeviceError for injected failures
  int64_t dma_count() const { return dma_count_.load(); }

  // Demand for this device's results. An op launched `until_needed` computes
  // until the device is asked for a result after its launch (a copy, an
  // await, a sync) or while something waits on it, at most `max_us`: a step
  // that is still running whenever its caller looks, and ends as soon as
  // anything needs it, on any machine.
  int64_t demands() const;
  void demand();  // a copy touched one of its buffers
  void wait_for_demand(int64_t since, int64_t max_us);
  // While a thread waits for one of its results (RAII).
  class Waiting {
   public:
    explicit Waiting(SimDevice& device);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    SimDevice& device_;
  };

 private:
  static void run_executor(std::shared_ptr<ExecutorQueue> queue);

  const int id_;
  const int creator_pid_;  // its executor thread runs in this process only
  std::shared_ptr<ExecutorQueue> queue_;
  std::mutex deferred_mu_;
  std::vector<std::weak_ptr<DeviceBuffer>> deferred_;
  std::atomic<int64_t> delay_us_{0}, fail_every_{0}, dma_count_{0};
  mutable std::mutex demand_mu_;  // a leaf: taken with a buffer's lock held, never the other way
  std::condition_variable demand_cv_;
  int64_t demands_ = 0, waiting_ = 0;
  std::thread executor_;
};

class DeviceBuffer : public std::enable_shared_from_this<DeviceBuffer> {
 public:
  using Op = std::function<void(uint8_t*)>;

  DeviceBuffer(std::shared_ptr<SimDevice> device, int64_t bytes);
  BufferState state() const;
  int64_t size() const { return bytes_.size(); }
  SimDevice& device() const { return *device_; }

  // Records the op that produces this buffer; it runs on materialize(). Ops
  // write the whole buffer, so a later recorded op replaces an earlier one.
  void defer(Op op);
  // Runs the op on the executor now; the buffer is `running` until it ends.
  void launch(Op op, BufferState running);
  // Launches the recorded op in place; does nothing unless DEFERRED.
  void materialize();
  // Waits until MATERIALIZED (true) or the timeout passes (false; < 0: never).
  // Throws DeviceError if the op failed. Never launches anything.
  bool await(double timeout_s);

  // Raw copies of materialized bytes (the DMA engine). A `fenced` copy was
  // registered with begin_dma() and may run while a later op waits for it.
  void dma_read(int64_t offset, int64_t size, uint8_t* dst, bool fenced = false);
  void dma_write(int64_t offset, int64_t size, const uint8_t* src, bool fenced = false);
  // Any later DMA touching [start, end) of this buffer fails.
  void fail_dma_in(int64_t start, int64_t end);
  // The next DMA of this buffer first waits `delay_us` (a slow link that
  // holds one copy in flight). `until_next_op`: it waits only until an op
  // launched after the hold has reached its place in program order (it
  // waits for the copies issued before it, or it has run), at most `delay_us`:
  // a window that opens and closes on events, not on the machine's speed.
  void hold_next_dma(int64_t delay_us, bool until_next_op = false);
  // Ends the hold now, whether its copy is waiting in it or yet to come: a
  // window a caller closes when it has seen what it held open.
  void release_dma_hold();

  // Program order between copies and ops: a copy issued before an op is
  // launched is registered here (the buffer must be MATERIALIZED then), and
  // the op waits until every registered copy has ended; a read of the buffer
  // waits for registered writes. DeviceError if the buffer is not ready.
  void begin_dma(bool write);
  void end_dma(bool write);
  // Waits until no registered copy writes the buffer.
  void wait_dma_writes();
  uint8_t* unsafe_data() { return bytes_.data(); }

 private:
  void check_dma(int64_t offset, int64_t size, const char* what, bool fenced);
  void run(const Op& op);

  std::shared_ptr<SimDevice> device_;
  PageBuffer bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  BufferState state_ = BufferState::kPlaceholder;
  int64_t in_flight_ = 0;  // launched ops not yet finished (the executor runs them in order)
  int64_t dma_reads_ = 0, dma_writes_ = 0;  // registered copies not yet ended
  Op pending_;
  std::string error_;
  std::vector<std::pair<int64_t, int64_t>> failing_ranges_;
  int64_t hold_us_ = 0;
  bool hold_until_op_ = false;
  int64_t ops_placed_ = 0;  // ops that have waited for earlier copies or run past them
  int64_t hold_ops_ = 0;    // ops_placed_ when the hold was set
  int64_t releases_ = 0;    // release_dma_hold calls
};

}  // namespace kvref
