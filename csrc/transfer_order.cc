#include "transfer_order.h"

#include <algorithm>

namespace kvref {

BlockRanges::BlockRanges(const int64_t* start, const int64_t* count, size_t n) {
  ranges_.reserve(n);
  for (size_t i = 0; i < n; ++i) ranges_.emplace_back(start[i], start[i] + count[i]);
  std::sort(ranges_.begin(), ranges_.end());
  size_t kept = 0;
  for (const auto& r : ranges_) {
    if (kept && r.first <= ranges_[kept - 1].second)
      ranges_[kept - 1].second = std::max(ranges_[kept - 1].second, r.second);
    else
      ranges_[kept++] = r;
  }
  ranges_.resize(kept);
}

bool BlockRanges::overlaps(const BlockRanges& other) const {
  size_t i = 0, j = 0;
  while (i < ranges_.size() && j < other.ranges_.size()) {
    const auto &a = ranges_[i], &b = other.ranges_[j];
    if (a.first < b.second && b.first < a.second) return true;
    (a.second <= b.second ? i : j)++;
  }
  return false;
}

std::pair<uint64_t, std::vector<Dependency>> TransferOrder::enter(
    BlockAccess access, std::shared_ptr<TransferFuture> future) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Dependency> after;
  for (const auto& [id, earlier] : in_flight_) {
    const BlockAccess& e = earlier.access;
    // A side conflicts where the two overlap and either writes it: d2h writes
    // host blocks and reads device blocks, h2d the reverse.
    const bool host = (access.host_write || e.host_write) && access.host.overlaps(e.host);
    const bool device = (!access.host_write || !e.host_write) && access.device.overlaps(e.device);
    if (!host && !device) continue;
    // This one reads what the earlier one writes: its bytes depend on that one's success.
    const bool reads_result = access.host_write ? (!e.host_write && device) : (e.host_write && host);
    after.push_back({earlier.future, reads_result});
  }
  const uint64_t id = next_id_++;
  in_flight_.emplace(id, Entry{std::move(access), std::move(future)});
  return {id, std::move(after)};
}

void TransferOrder::leave(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.erase(id);
}

}  // namespace kvref
