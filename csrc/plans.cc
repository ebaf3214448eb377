#include "plans.h"

#include <stdexcept>

#include "transfer.pb.h"

namespace kvref {

namespace {

void check_blocks(const std::vector<int64_t>& ids, int64_t limit, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || (limit >= 0 && ids[i] >= limit))
      throw std::invalid_argument(std::string(what) + " " + std::to_string(ids[i]) +
                                  " at index " + std::to_string(i) + " is out of range" +
                                  (limit >= 0 ? " [0, " + std::to_string(limit) + ")" : ""));
}

}  // namespace

void PlanRegistry::add(const std::string& uuid, const char* data, size_t size, bool is_sender) {
  if (size > kMaxPlanBytes)  // protobuf takes an int size: never let it wrap
    throw std::invalid_argument("a StartTransferRequest of " + std::to_string(size) +
                                " bytes is over the " + std::to_string(kMaxPlanBytes) +
                                "-byte limit");
  StartTransferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size)))
    throw std::invalid_argument("malformed StartTransferRequest (" + std::to_string(size) +
                                " bytes do not parse)");
  // Fields this message does not define are not a plan this manager can carry
  // out (and are how an old protobuf lets some corrupt bytes through).
  if (!request.GetReflection()->GetUnknownFields(request).empty())
    throw std::invalid_argument("malformed StartTransferRequest (" + std::to_string(size) +
                                " bytes hold fields it does not define)");
  Plan plan;
  plan.uuid = uuid;
  plan.peer = request.peer();
  plan.is_sender = is_sender;
  plan.layer_ids.assign(request.layer_ids().begin(), request.layer_ids().end());
  plan.src_block_ids.assign(request.src_block_ids().begin(), request.src_block_ids().end());
  plan.dst_block_ids.assign(request.dst_block_ids().begin(), request.dst_block_ids().end());
  if (uuid.empty()) throw std::invalid_argument("plan uuid must not be empty");
  if (!request.uuid().empty() && request.uuid() != uuid)
    throw std::invalid_argument("plan uuid '" + uuid + "' does not match the request's uuid '" +
                                request.uuid() + "'");
  for (size_t i = 0; i < plan.layer_ids.size(); ++i)
    if (plan.layer_ids[i] < 0 || plan.layer_ids[i] >= num_layers_)
      throw std::invalid_argument("layer id " + std::to_string(plan.layer_ids[i]) +
                                  " at index " + std::to_string(i) + " is out of range [0, " +
                                  std::to_string(num_layers_) + ")");
  if (plan.src_block_ids.size() != plan.dst_block_ids.size())
    throw std::invalid_argument("the request has " + std::to_string(plan.src_block_ids.size()) +
                                " source blocks but " +
                                std::to_string(plan.dst_block_ids.size()) + " destination blocks");
  // Our own device blocks are the source when sending, the destination when receiving.
  check_blocks(plan.src_block_ids, is_sender ? device_blocks_ : -1, "source block id");
  check_blocks(plan.dst_block_ids, is_sender ? -1 : device_blocks_, "destination block id");
  std::lock_guard<std::mutex> lock(mu_);
  if (plans_.count(uuid)) throw std::invalid_argument("a plan with uuid '" + uuid + "' is already active");
  plans_.emplace(uuid, std::move(plan));
}

void PlanRegistry::remove(const std::string& uuid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!plans_.erase(uuid)) throw std::invalid_argument("no active plan with uuid '" + uuid + "'");
}

bool PlanRegistry::contains(const std::string& uuid) {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count(uuid) > 0;
}

Plan PlanRegistry::get(const std::string& uuid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(uuid);
  if (it == plans_.end()) throw std::invalid_argument("no active plan with uuid '" + uuid + "'");
  return it->second;
}

size_t PlanRegistry::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

}  // namespace kvref
