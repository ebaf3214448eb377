// One process-wide pool of worker threads for block transfers.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvref {

class ThreadPool {
 public:
  // The shared pool; created on first use and kept for the process's life so
  // that no worker ever joins itself while finishing a manager's last task.
  // A forked child gets a pool of its own on first use.
  static ThreadPool& shared();
  // The fault model pool_kept_across_fork: a forked child keeps the parent's
  // pool, whose threads it does not have, so every copy it queues waits forever.
  static void keep_across_fork(bool kept);
  void submit(std::function<void()> task);
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  explicit ThreadPool(int threads);
  void work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> workers_;
};

}  // namespace kvref
