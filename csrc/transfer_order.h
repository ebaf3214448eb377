// Program order between the transfers of one host pool: a transfer that
// touches blocks an earlier one, still in flight, writes (or writes blocks
// the earlier one reads) starts only after that one has ended.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace kvref {

class TransferFuture;

// Block numbers as sorted, disjoint [start, end) ranges.
class BlockRanges {
 public:
  BlockRanges(const int64_t* start, const int64_t* count, size_t n);
  bool overlaps(const BlockRanges& other) const;

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

// Which blocks a transfer reads and writes, on each side.
struct BlockAccess {
  BlockRanges host, device;
  bool host_write;  // d2h writes host blocks and reads device blocks; h2d the reverse
};

struct Dependency {
  std::shared_ptr<TransferFuture> future;
  bool reads_its_result;  // the earlier transfer writes what this one reads
};

class TransferOrder {
 public:
  // Records a transfer in flight and returns the earlier ones it must follow.
  std::pair<uint64_t, std::vector<Dependency>> enter(BlockAccess access,
                                                     std::shared_ptr<TransferFuture> future);
  void leave(uint64_t id);

 private:
  struct Entry {
    BlockAccess access;
    std::shared_ptr<TransferFuture> future;
  };
  std::mutex mu_;
  std::map<uint64_t, Entry> in_flight_;
  uint64_t next_id_ = 0;
};

}  // namespace kvref
