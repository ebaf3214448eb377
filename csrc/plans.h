// Active transfer plans, parsed from serialized StartTransferRequest bytes.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kvref {

// Plans are a few block lists; anything near protobuf's 2 GiB limit is not one.
constexpr size_t kMaxPlanBytes = 64u << 20;

struct Plan {
  std::string uuid, peer;
  std::vector<int32_t> layer_ids;
  std::vector<int64_t> src_block_ids, dst_block_ids;
  bool is_sender = false;
};

class PlanRegistry {
 public:
  PlanRegistry(int num_layers, int64_t device_blocks)
      : num_layers_(num_layers), device_blocks_(device_blocks) {}
  // Parses and checks a plan; nothing is registered unless all of it is valid.
  void add(const std::string& uuid, const char* data, size_t size, bool is_sender);
  void remove(const std::string& uuid);
  bool contains(const std::string& uuid);
  Plan get(const std::string& uuid);
  size_t size();

 private:
  const int num_layers_;
  const int64_t device_blocks_;
  std::mutex mu_;
  std::map<std::string, Plan> plans_;
};

}  // namespace kvref
