// The host pool's blocks as chunks a manager hands out (d2h_auto_allocate)
// and takes back (unlock_blocks), and what each chunk holds.
//
// A chunk is locked (handed out by an allocation, until unlocked) or not,
// holds bytes or not, and is in use by copies still in flight. Its state:
//   FREE     unlocked, no bytes (never written, or its save failed)
//   WRITING  unlocked, a d2h into it in flight
//   CACHED   unlocked, holding bytes until it is handed out again
//   SAVING   locked, its save in flight
//   SAVED    locked, holding its save's bytes
//   FAILED   locked, its save failed: no bytes
// Allocation hands out only unlocked chunks no copy is using: FREE ones
// first, then CACHED ones, least recently written first.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvref {

enum class ChunkState { kFree, kWriting, kCached, kSaving, kSaved, kFailed };
const char* chunk_state_name(ChunkState state);

// An allocation the pool cannot hold: nothing was taken.
class PoolExhausted : public std::length_error {
 public:
  using std::length_error::length_error;
};

// Old allocator bugs, switched on one by one (kvref.Faults).
struct ChunkFaults {
  bool leak_refused = false;     // a refused allocation keeps the chunks it took
  bool unchecked_unlock = false;  // unlock frees any id, however often
};

class HostChunks {
 public:
  explicit HostChunks(int64_t chunks);

  // Takes `n` chunks for a save (now SAVING), or throws PoolExhausted
  // naming `caller`, how many were asked and how many are free, taking none.
  std::vector<int64_t> allocate(int64_t n, const char* caller = "d2h_auto_allocate");
  // Gives back chunks allocate() took for a save that never started.
  void unallocate(const std::vector<int64_t>& ids);
  // Unlocks every id, or throws std::invalid_argument naming the first id
  // that is not locked (or repeated, or still being saved) and unlocks none.
  void unlock(const int64_t* ids, size_t n);

  // A copy starts or ends on host blocks [start, start + count) of each run.
  // begin_* checks first and throws std::invalid_argument, changing nothing,
  // for a d2h into a locked chunk or an h2d from a FAILED one.
  void begin_writes(const int64_t* start, const int64_t* count, size_t n);
  void begin_reads(const int64_t* start, const int64_t* count, size_t n);
  void end_writes(const int64_t* start, const int64_t* count, size_t n, bool ok);
  void end_reads(const int64_t* start, const int64_t* count, size_t n);
  // Reads of whole chunks by a peer (a host-to-host transfer): each must hold
  // a block no copy is writing (CACHED or SAVED), else std::invalid_argument
  // naming the first that does not, and none is held.
  void begin_peer_reads(const int64_t* ids, size_t n);
  // Locks FREE chunks as SAVED: blocks saved into a pool that outlived its
  // process (a recovered shared-memory pool). Throws std::invalid_argument
  // naming the first that is not FREE, or repeated, and adopts none.
  void adopt(const int64_t* ids, size_t n);
  // A direct write of one chunk's bytes (write_block_bytes).
  void mark_written(int64_t id);

  ChunkState state(int64_t id) const;
  int64_t available() const;
  void set_faults(ChunkFaults faults);
  bool leaks_refused() const;

 private:
  enum List : int8_t { kNone = -1, kFreeList = 0, kCachedList = 1 };
  struct Chunk {
    bool locked = false, has_bytes = false;
    int32_t writers = 0, readers = 0;
    int64_t prev = -1, next = -1;
    List list = kNone;
    uint64_t unlock_seen = 0;  // the last unlock() call that named it (a repeat within one is refused)
  };
  struct Ends { int64_t head = -1, tail = -1, size = 0; };

  ChunkState state_locked(const Chunk& c) const;
  void check_id(int64_t id, const char* what) const;
  void push_back(int64_t id, List list);
  void push_front(int64_t id, List list);
  void remove(int64_t id);
  void relist(int64_t id);  // onto its list, if it may be handed out
  std::string counts_text() const;

  mutable std::mutex mu_;
  uint64_t unlocks_ = 0;  // unlock() calls so far
  std::vector<Chunk> chunks_;
  Ends lists_[2];
  ChunkFaults faults_;
  std::deque<int64_t> unchecked_;  // ids freed without a check (faults_.unchecked_unlock)
};

}  // namespace kvref
