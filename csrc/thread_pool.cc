#include "thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <new>

namespace kvref {

namespace {

std::atomic<ThreadPool*> g_pool{nullptr};
std::mutex g_pool_mu;
std::atomic<bool> g_kept_across_fork{false};

// A forked child has none of the parent's threads: it forgets the pool (and
// the lock, which a parent thread may have held) and makes its own on first
// use. The parent's pool object is left as it was; nothing in the child can
// use it.
void forget_pool_in_child() {
  if (g_kept_across_fork.load()) return;
  g_pool.store(nullptr);
  new (&g_pool_mu) std::mutex();
}

}  // namespace

void ThreadPool::keep_across_fork(bool kept) { g_kept_across_fork.store(kept); }

ThreadPool& ThreadPool::shared() {
  if (ThreadPool* pool = g_pool.load()) return *pool;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  ThreadPool* pool = g_pool.load();
  if (!pool) {
    static const bool registered = pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0;
    (void)registered;
    pool = new ThreadPool(std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8));
    g_pool.store(pool);
  }
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
