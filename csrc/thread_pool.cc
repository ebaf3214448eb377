#include "thread_pool.h"

#include <algorithm>

namespace kvref {

ThreadPool& ThreadPool::shared() {
  static ThreadPool* pool =
      new ThreadPool(std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8));
  return *pool;
}

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this] { work(); });
    workers_.back().detach();
  }
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !tasks_.empty(); });
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace kvref
