#include "host_chunks.h"

#include <algorithm>
#include <stdexcept>

namespace kvref {

const char* chunk_state_name(ChunkState state) {
  switch (state) {
    case ChunkState::kFree: return "FREE";
    case ChunkState::kWriting: return "WRITING";
    case ChunkState::kCached: return "CACHED";
    case ChunkState::kSaving: return "SAVING";
    case ChunkState::kSaved: return "SAVED";
    case ChunkState::kFailed: return "FAILED";
  }
  return "?";
}

HostChunks::HostChunks(int64_t chunks) : chunks_(static_cast<size_t>(chunks)) {
  for (int64_t id = 0; id < chunks; ++id) push_back(id, kFreeList);
}

ChunkState HostChunks::state_locked(const Chunk& c) const {
  if (c.locked)
    return c.writers ? ChunkState::kSaving : c.has_bytes ? ChunkState::kSaved : ChunkState::kFailed;
  return c.writers ? ChunkState::kWriting : c.has_bytes ? ChunkState::kCached : ChunkState::kFree;
}

ChunkState HostChunks::state(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  check_id(id, "host chunk");
  return state_locked(chunks_[id]);
}

void HostChunks::check_id(int64_t id, const char* what) const {
  if (id < 0 || id >= static_cast<int64_t>(chunks_.size()))
    throw std::invalid_argument(std::string(what) + " " + std::to_string(id) +
                                " is out of range [0, " + std::to_string(chunks_.size()) + ")");
}

int64_t HostChunks::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lists_[kFreeList].size + lists_[kCachedList].size + static_cast<int64_t>(unchecked_.size());
}

void HostChunks::set_faults(ChunkFaults faults) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = faults;
}

bool HostChunks::leaks_refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return faults_.leak_refused;
}

std::string HostChunks::counts_text() const {
  int64_t locked = 0, busy = 0;
  for (const auto& c : chunks_) {
    locked += c.locked;
    busy += !c.locked && (c.writers || c.readers);
  }
  return "of " + std::to_string(chunks_.size()) + ": " + std::to_string(lists_[kFreeList].size) +
         " free, " + std::to_string(lists_[kCachedList].size) + " cached, " +
         std::to_string(locked) + " locked, " + std::to_string(busy) + " in use by copies";
}

std::vector<int64_t> HostChunks::allocate(int64_t n, const char* caller) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t free = lists_[kFreeList].size + lists_[kCachedList].size;
  std::vector<int64_t> ids;
  auto take = [&](int64_t id) {
    if (chunks_[id].list != kNone) remove(id);
    chunks_[id].locked = true;
    ++chunks_[id].writers;  // its save
    ids.push_back(id);
  };
  while (!unchecked_.empty() && static_cast<int64_t>(ids.size()) < n) {
    take(unchecked_.front());  // the fault: freed twice, handed out twice
    unchecked_.pop_front();
  }
  if (n - static_cast<int64_t>(ids.size()) > free) {
    const std::string message = std::string(caller) + " needs " + std::to_string(n) +
                                " host chunks but only " + std::to_string(free) + " are free (" +
                                counts_text() + "); no chunk was taken";
    if (faults_.leak_refused)
      while (lists_[kFreeList].size + lists_[kCachedList].size) take(
          lists_[kFreeList].size ? lists_[kFreeList].head : lists_[kCachedList].head);
    else
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
        chunks_[*it].locked = false;
        --chunks_[*it].writers;
        unchecked_.push_front(*it);
      }
    throw PoolExhausted(message);
  }
  while (static_cast<int64_t>(ids.size()) < n)
    take(lists_[kFreeList].size ? lists_[kFreeList].head : lists_[kCachedList].head);
  return ids;
}

void HostChunks::unallocate(const std::vector<int64_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    Chunk& c = chunks_[*it];
    c.locked = false;
    --c.writers;
    push_front(*it, c.has_bytes ? kCachedList : kFreeList);  // back where it was taken from
  }
}

void HostChunks::unlock(const int64_t* ids, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t call = ++unlocks_;
  const auto at = [](size_t i) { return " (unlock_blocks index " + std::to_string(i) + ")"; };
  for (size_t i = 0; i < n; ++i) {
    check_id(ids[i], "host chunk");
    if (faults_.unchecked_unlock) continue;
    Chunk& c = chunks_[ids[i]];
    if (!c.locked)
      throw std::invalid_argument("host chunk " + std::to_string(ids[i]) + " is not locked (" +
                                  chunk_state_name(state_locked(c)) + ")" + at(i) +
                                  "; nothing was unlocked");
    if (c.writers)
      throw std::invalid_argument("host chunk " + std::to_string(ids[i]) +
                                  " is still being saved (SAVING)" + at(i) +
                                  "; await its future first; nothing was unlocked");
    if (c.unlock_seen == call)
      throw std::invalid_argument("host chunk " + std::to_string(ids[i]) +
                                  " appears twice in unlock_blocks; nothing was unlocked");
    c.unlock_seen = call;  // marks only: nothing is unlocked until every id passed
  }
  for (size_t i = 0; i < n; ++i) {
    Chunk& c = chunks_[ids[i]];
    if (!c.locked) {  // only with faults_.unchecked_unlock
      unchecked_.push_back(ids[i]);
      continue;
    }
    c.locked = false;
    relist(ids[i]);
  }
}

void HostChunks::begin_writes(const int64_t* start, const int64_t* count, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i)
    for (int64_t id = start[i]; id < start[i] + count[i]; ++id)
      if (chunks_[id].locked)
        throw std::invalid_argument(
            "host block " + std::to_string(id) + " is locked (" +
            chunk_state_name(state_locked(chunks_[id])) +
            ") by d2h_auto_allocate; unlock it before writing it with d2h; nothing was moved");
  for (size_t i = 0; i < n; ++i)
    for (int64_t id = start[i]; id < start[i] + count[i]; ++id) {
      if (chunks_[id].list != kNone) remove(id);
      ++chunks_[id].writers;
    }
}

void HostChunks::begin_reads(const int64_t* start, const int64_t* count, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i)
    for (int64_t id = start[i]; id < start[i] + count[i]; ++id)
      if (state_locked(chunks_[id]) == ChunkState::kFailed)
        throw std::invalid_argument("host chunk " + std::to_string(id) +
                                    "'s save failed (FAILED): it holds no block; unlock it; "
                                    "nothing was moved");
  for (size_t i = 0; i < n; ++i)
    for (int64_t id = start[i]; id < start[i] + count[i]; ++id) {
      if (chunks_[id].list != kNone) remove(id);
      ++chunks_[id].readers;
    }
}

void HostChunks::begin_peer_reads(const int64_t* ids, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) {
    check_id(ids[i], "host block");
    const ChunkState state = state_locked(chunks_[ids[i]]);
    if (state != ChunkState::kCached && state != ChunkState::kSaved)
      throw std::invalid_argument("host block " + std::to_string(ids[i]) + " is " +
                                  chunk_state_name(state) +
                                  ": only a block that holds bytes no copy is writing (CACHED or "
                                  "SAVED) is read by a peer; nothing was read");
  }
  for (size_t i = 0; i < n; ++i) {
    if (chunks_[ids[i]].list != kNone) remove(ids[i]);
    ++chunks_[ids[i]].readers;
  }
}

void HostChunks::end_writes(const int64_t* start, const int64_t* count, size_t n, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i)
    for (int64_t id = start[i]; id < start[i] + count[i]; ++id) {
      --chunks_[id].writers;
      chunks_[id].has_bytes = ok;
      relist(id);
    }
}

void HostChunks::end_reads(const int64_t* start, const int64_t* count, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i)
    for (int64_t id = start[i]; id < start[i] + count[i]; ++id) {
      --chunks_[id].readers;
      relist(id);
    }
}

void HostChunks::adopt(const int64_t* ids, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> seen(ids, ids + n);
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < n; ++i) {
    check_id(ids[i], "host chunk");
    const Chunk& c = chunks_[ids[i]];
    if (c.locked || c.writers || c.readers || c.has_bytes)
      throw std::invalid_argument("host chunk " + std::to_string(ids[i]) + " is " +
                                  chunk_state_name(state_locked(c)) +
                                  (c.readers ? " and being read" : "") +
                                  ": only a FREE chunk of a recovered pool is adopted; none was");
  }
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
    throw std::invalid_argument("host chunk " + std::to_string(*std::adjacent_find(seen.begin(), seen.end())) +
                                " is named twice; none was adopted");
  for (size_t i = 0; i < n; ++i) {
    Chunk& c = chunks_[ids[i]];
    if (c.list != kNone) remove(ids[i]);
    c.locked = true;
    c.has_bytes = true;
  }
}

void HostChunks::mark_written(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  check_id(id, "host block");
  Chunk& c = chunks_[id];
  c.has_bytes = true;
  if (c.list == kFreeList) {
    remove(id);
    push_back(id, kCachedList);
  }
}

void HostChunks::relist(int64_t id) {
  const Chunk& c = chunks_[id];
  if (!c.locked && !c.writers && !c.readers && c.list == kNone)
    push_back(id, c.has_bytes ? kCachedList : kFreeList);
}

void HostChunks::push_back(int64_t id, List list) {
  Chunk& c = chunks_[id];
  Ends& e = lists_[list];
  c.list = list;
  c.prev = e.tail;
  c.next = -1;
  (e.tail >= 0 ? chunks_[e.tail].next : e.head) = id;
  e.tail = id;
  ++e.size;
}

void HostChunks::push_front(int64_t id, List list) {
  Chunk& c = chunks_[id];
  Ends& e = lists_[list];
  c.list = list;
  c.prev = -1;
  c.next = e.head;
  (e.head >= 0 ? chunks_[e.head].prev : e.tail) = id;
  e.head = id;
  ++e.size;
}

void HostChunks::remove(int64_t id) {
  Chunk& c = chunks_[id];
  Ends& e = lists_[c.list];
  (c.prev >= 0 ? chunks_[c.prev].next : e.head) = c.next;
  (c.next >= 0 ? chunks_[c.next].prev : e.tail) = c.prev;
  --e.size;
  c.list = kNone;
  c.prev = c.next = -1;
}

}  // namespace kvref
