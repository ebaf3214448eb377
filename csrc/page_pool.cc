#include "page_pool.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it and the memset faults pages in
#endif

namespace kvref::page_pool {
namespace {

constexpr int64_t kPage = 4096;
// One buffer larger than this maps its own pages: zeroing it all up front
// would cost more than the pages it touches.
constexpr int64_t kLargestLent = int64_t{256} << 20;

// Never destroyed: buffers are given back until the process's last moment
// (threads and objects that outlive static destructors at exit).
struct State {
  std::mutex mu;
  uint8_t* region = nullptr;
  int slot_count = 0;
  int64_t slot_bytes = 0;
  int attached = -1;
  uint8_t* base = nullptr;           // the attached slot
  std::map<int64_t, int64_t> free;   // offset -> bytes, coalesced
  std::map<int64_t, int64_t> lent_at;  // offset -> bytes of each lent block
  int64_t lent = 0, touched = 0;     // touched: extent this process has faulted in
  uint8_t* fork_copy = nullptr;      // between before_fork and after it
};
State& pool = *new State;

int64_t round_up(int64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// A fork while attached gives the child a private copy of what is lent, so
// parent and child never write each other's buffers. The copy is made before
// the fork, in the parent: a snapshot at the fork, as anonymous memory gives
// (copied after it, the parent's next writes could land in the child's copy).
void before_fork() {
  pool.mu.lock();
  if (pool.attached < 0) return;
  void* copy = mmap(nullptr, static_cast<size_t>(pool.slot_bytes), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (copy == MAP_FAILED) {
    std::fputs("kvref page pool: no memory for a forked child's copy of its slot\n", stderr);
    std::abort();
  }
  for (auto [offset, bytes] : pool.lent_at)
    std::memcpy(static_cast<uint8_t*>(copy) + offset, pool.base + offset, static_cast<size_t>(bytes));
  pool.fork_copy = static_cast<uint8_t*>(copy);
}

void after_fork_in_parent() {
  if (pool.fork_copy) munmap(pool.fork_copy, static_cast<size_t>(pool.slot_bytes));
  pool.fork_copy = nullptr;
  pool.mu.unlock();
}

void after_fork_in_child() {
  if (pool.fork_copy &&
      mremap(pool.fork_copy, pool.slot_bytes, pool.slot_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, pool.base) ==
          MAP_FAILED) {
    std::fputs("kvref page pool: could not make a forked child's slot private\n", stderr);
    std::abort();
  }
  pool.fork_copy = nullptr;
  pool.mu.unlock();
}

}  // namespace

void reserve(int slots, int64_t bytes_per_slot) {
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.region) throw std::logic_error("the page pool is already reserved in this process");
  if (slots < 1 || bytes_per_slot < kPage || bytes_per_slot % kPage)
    throw std::invalid_argument("page pool: slots must be >= 1 and slot_bytes a positive multiple of " +
                                std::to_string(kPage) + ", got " + std::to_string(slots) + " x " +
                                std::to_string(bytes_per_slot));
  int64_t total;
  if (__builtin_mul_overflow(int64_t{slots}, bytes_per_slot, &total))
    throw std::overflow_error("page pool size overflows int64");
  void* p = mmap(nullptr, static_cast<size_t>(total), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("page pool: could not map " + std::to_string(total) + " bytes");
  pool.region = static_cast<uint8_t*>(p);
  pool.slot_count = slots;
  pool.slot_bytes = bytes_per_slot;
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

void attach(int slot) {
  std::lock_guard<std::mutex> lock(pool.mu);
  if (!pool.region) throw std::logic_error("page pool: attach before reserve");
  if (slot < 0 || slot >= pool.slot_count)
    throw std::invalid_argument("page pool: slot " + std::to_string(slot) + " is not in [0, " +
                                std::to_string(pool.slot_count) + ")");
  if (pool.attached >= 0) throw std::logic_error("page pool: this process is already attached");
  pool.attached = slot;
  pool.base = pool.region + slot * pool.slot_bytes;
  pool.free = {{0, pool.slot_bytes}};
  pool.lent_at.clear();
  pool.lent = pool.touched = 0;
}

uint8_t* take(int64_t bytes) {
  if (bytes < kSmallestLent || bytes > kLargestLent) return nullptr;
  const int64_t need = round_up(bytes);
  uint8_t* p;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.attached < 0) return nullptr;
    auto it = pool.free.begin();
    while (it != pool.free.end() && it->second < need) ++it;
    if (it == pool.free.end()) return nullptr;
    const auto [offset, size] = *it;
    pool.free.erase(it);
    if (size > need) pool.free.emplace(offset + need, size - need);
    pool.lent_at.emplace(offset, need);
    pool.lent += need;
    if (offset + need > pool.touched) {
      // One call faults the new pages in, cheaper than a fault per page.
      madvise(pool.base + pool.touched, static_cast<size_t>(offset + need - pool.touched), MADV_POPULATE_WRITE);
      pool.touched = offset + need;
    }
    p = pool.base + offset;
  }
  std::memset(p, 0, static_cast<size_t>(need));  // an earlier worker's bytes are not this buffer's
  return p;
}

int64_t lent_bytes(const uint8_t* p) {
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.attached < 0 || p < pool.base || p >= pool.base + pool.slot_bytes) return 0;
  auto it = pool.lent_at.find(p - pool.base);
  return it == pool.lent_at.end() ? 0 : it->second;
}

bool give_back(uint8_t* p) {
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.attached < 0 || p < pool.base || p >= pool.base + pool.slot_bytes) return false;
  auto lent = pool.lent_at.find(p - pool.base);
  if (lent == pool.lent_at.end()) return false;
  int64_t offset = lent->first, size = lent->second;
  pool.lent_at.erase(lent);
  pool.lent -= size;
  auto next = pool.free.lower_bound(offset);
  if (next != pool.free.end() && offset + size == next->first) {
    size += next->second;
    next = pool.free.erase(next);
  }
  if (next != pool.free.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == offset) {
      before->second += size;
      return true;
    }
  }
  pool.free.emplace(offset, size);
  return true;
}

Stats stats() {
  std::lock_guard<std::mutex> lock(pool.mu);
  return {pool.slot_count, pool.slot_bytes, pool.attached, pool.lent, pool.touched};
}

}  // namespace kvref::page_pool
