#include "block_mover.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "checked.h"
#include "stream_copy.h"
#include "thread_pool.h"

namespace kvref {

namespace {

constexpr int64_t kChunkBytes = 256 << 10;  // aim for this much work per task

// "[start, start + count)", the end computed without wrapping.
std::string range_text(int64_t start, int64_t count) {
  const std::string end =
      start >= 0 && count >= 0
          ? std::to_string(static_cast<uint64_t>(start) + static_cast<uint64_t>(count))
          : std::to_string(start + count);
  return "[" + std::to_string(start) + ", " + end + ")";
}

}  // namespace

void DeviceRegion::read(int64_t offset, int64_t n, uint8_t* dst, bool fenced) const {
  if (sim) sim->dma_read(offset, n, dst, fenced);
  else stream_copy(dst, raw + offset, static_cast<size_t>(n));
}

void DeviceRegion::write(int64_t offset, int64_t n, const uint8_t* src, bool fenced) const {
  if (sim) sim->dma_write(offset, n, src, fenced);
  else stream_copy(raw + offset, src, static_cast<size_t>(n));
}

TransferFuture::TransferFuture(int64_t parts)
    : remaining_(parts), done_(parts == 0), creator_pid_(getpid()) {}

void TransferFuture::on_done(std::function<void(bool)> callback) {
  bool now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now = done_;
    if (!now) callbacks_.push_back(std::move(callback));
  }
  if (now) callback(!error_);
}

void TransferFuture::finish_part(std::exception_ptr error) {
  std::vector<std::function<void(bool)>> callbacks;
  bool ok;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error && !error_) error_ = error;
    if (--remaining_ != 0) return;
    callbacks.swap(callbacks_);
    ok = !error_;
  }
  for (auto& callback : callbacks) callback(ok);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

std::exception_ptr TransferFuture::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool TransferFuture::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_ && getpid() != creator_pid_)
    throw DeviceError("this transfer was started in process " + std::to_string(creator_pid_) +
                      " before a fork; its copies do not run in this process (" +
                      std::to_string(getpid()) + "): wait for it in the process that started it");
  auto finished = [this] { return done_; };
  if (timeout_s < 0) {
    cv_.wait(lock, finished);
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), finished);
}

bool TransferFuture::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void TransferFuture::rethrow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

namespace {

std::vector<ShardPlacement> placed(std::vector<ShardPlacement> placements, size_t shards) {
  if (placements.empty())
    for (size_t s = 0; s < shards; ++s)
      placements.push_back({0, static_cast<int64_t>(s), static_cast<int64_t>(shards), true});
  return placements;
}

}  // namespace

LayerAddressing::LayerAddressing(std::vector<DeviceRegion> shards_,
                                 std::vector<ShardPlacement> placements_, int64_t device_blocks_,
                                 int64_t shard_blocks_, int64_t block_bytes_, HostSpan host_)
    : shards(std::move(shards_)),
      placements(placed(std::move(placements_), shards.size())),
      shard_blocks(shard_blocks_),
      device_blocks(device_blocks_),
      block_bytes(block_bytes_),
      host(host_) {
  if (shards.empty()) throw std::invalid_argument("a layer needs at least one shard");
  for (const auto& [value, name] : {std::pair{device_blocks, "device_blocks"},
                                    std::pair{shard_blocks, "shard_blocks"},
                                    std::pair{block_bytes, "block_bytes"},
                                    std::pair{host.base, "the host span's base"},
                                    std::pair{host.blocks, "the host span's blocks"},
                                    std::pair{host.slice, "the host span's slice"}})
    if (value < 0)
      throw std::invalid_argument(std::string(name) + " is " + std::to_string(value) +
                                  "; expected a count of zero or more");
  if (placements.size() != shards.size())
    throw std::invalid_argument("placements has " + std::to_string(placements.size()) +
                                " entries for " + std::to_string(shards.size()) +
                                " shards; expected one per shard");
  for (size_t s = 0; s < shards.size(); ++s) {
    const ShardPlacement& p = placements[s];
    if (p.host_slots != slots() || p.host_slot < 0 || p.host_slot >= p.host_slots)
      throw std::invalid_argument("shard " + std::to_string(s) + " fills part " +
                                  std::to_string(p.host_slot) + " of " + std::to_string(p.host_slots) +
                                  " of a host block; shard 0's blocks have " +
                                  std::to_string(slots()) + " parts");
    if (p.first_block < 0 || p.first_block > device_blocks - shard_blocks)
      throw std::invalid_argument("shard " + std::to_string(s) + "'s blocks " +
                                  range_text(p.first_block, shard_blocks) + " lie outside the layer's " +
                                  std::to_string(device_blocks) + " blocks");
  }
}

int64_t LayerAddressing::host_end(int64_t host_blocks) const {
  if (host_blocks > host.blocks)
    throw std::invalid_argument(std::to_string(host_blocks) + " host blocks do not fit a layer's span of " +
                                std::to_string(host.blocks));
  int64_t end = host.base;
  for (int64_t term : {checked_mul(slots() - 1, checked_mul(host.blocks, host.slice, "host part"),
                                   "host shard offset"),
                       checked_mul(host_blocks - 1, host.slice, "host block offset"), block_bytes})
    end = checked_add(end, term, "host range end");
  return end;
}

int64_t LayerAddressing::host_extent() const {
  return checked_mul(slots(), checked_mul(host.blocks, host.slice, "host part"), "host span");
}

namespace {

// Every layer fits the pool and agrees with the others: checked before a pool is allocated.
void check_layers(const std::vector<LayerAddressing>& layers, int64_t host_blocks, int64_t host_bytes) {
  if (layers.empty()) throw std::invalid_argument("a manager needs at least one layer");
  if (host_blocks <= 0)
    throw std::invalid_argument("host_blocks is " + std::to_string(host_blocks) +
                                "; expected at least one");
  if (host_bytes < 0)
    throw std::invalid_argument("host_bytes is " + std::to_string(host_bytes) +
                                "; expected zero or more");
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].shards.size() != layers[0].shards.size())
      throw std::invalid_argument("layer " + std::to_string(l) + " has " +
                                  std::to_string(layers[l].shards.size()) + " shards, layer 0 " +
                                  std::to_string(layers[0].shards.size()) +
                                  "; expected the same number in every layer");
    const int64_t end = layers[l].host_end(host_blocks);
    if (end > host_bytes)
      throw std::invalid_argument("layer " + std::to_string(l) + "'s host blocks reach byte " +
                                  std::to_string(end) + ", past the " + std::to_string(host_bytes) +
                                  "-byte host pool");
  }
}

}  // namespace

BlockMover::BlockMover(std::vector<LayerAddressing> layers, int64_t host_blocks,
                       int64_t host_bytes, uint8_t* external_host, Owner host_owner,
                       std::shared_ptr<PoolState> pool)
    : layers_(std::move(layers)),
      host_blocks_(host_blocks),
      host_owner_(std::move(host_owner)),
      host_size_(host_bytes),
      pool_(std::move(pool)) {
  check_layers(layers_, host_blocks, host_bytes);
  if (external_host) {
    host_ = external_host;
  } else {
    owned_host_ = std::make_shared<PageBuffer>(host_bytes);
    host_ = owned_host_->data();
  }
  if (!pool_) pool_ = std::make_shared<PoolState>(host_blocks);
}

std::shared_ptr<BlockMover> BlockMover::with_shard(int layer, int shard, DeviceRegion region) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers_.size() || shard < 0 ||
      static_cast<size_t>(shard) >= layers_[layer].shards.size())
    throw std::out_of_range("layer " + std::to_string(layer) + " shard " + std::to_string(shard) +
                            " is not one this mover addresses");
  if (region.size != layers_[layer].shards[shard].size)
    throw std::invalid_argument("the new region is " + std::to_string(region.size) +
                                " bytes; the one it replaces is " +
                                std::to_string(layers_[layer].shards[shard].size));
  std::vector<LayerAddressing> layers = layers_;
  layers[layer].shards[shard] = std::move(region);
  Owner pool = owned_host_ ? Owner(owned_host_) : host_owner_;
  return std::make_shared<BlockMover>(std::move(layers), host_blocks_, host_size_, host_,
                                      std::move(pool), pool_);
}

std::vector<int64_t> PoolState::claim(int64_t n, const std::string& caller) {
  if (n < 1) throw std::invalid_argument(caller + " needs at least one host chunk");
  return chunks.allocate(n, caller.c_str());
}

void PoolState::settle_claim(const int64_t* ids, size_t n, bool ok) {
  const std::vector<int64_t> ones(n, 1);
  chunks.end_writes(ids, ones.data(), n, ok);
}

void PoolState::release_from_peer(const int64_t* ids, size_t n) {
  const std::vector<int64_t> ones(n, 1);
  chunks.end_reads(ids, ones.data(), n);
}

void PoolState::set_faults(const MoverFaults& switched_on) {
  chunks.set_faults(switched_on.chunks());
  faults = switched_on;
}

void PoolState::set_parallelism(int64_t parts) {
  if (parts < 1) throw std::invalid_argument("parallelism must be at least 1");
  parallelism = parts;
}

void BlockMover::write_host_block(int layer, int shard, int64_t block, const uint8_t* data, size_t size) {
  uint8_t* p = host_block(layer, shard, block);
  const int64_t want = layers_[layer].block_bytes;
  if (static_cast<int64_t>(size) != want)
    throw std::invalid_argument("payload has " + std::to_string(size) + " bytes, expected " + std::to_string(want));
  std::memcpy(p, data, size);
  pool_->chunks.mark_written(block);
}

uint8_t* BlockMover::host_block(int layer, int shard, int64_t block) {
  if (layer < 0 || static_cast<size_t>(layer) >= layers_.size())
    throw std::out_of_range("layer " + std::to_string(layer) + " is out of range [0, " +
                            std::to_string(layers_.size()) + ")");
  const auto& l = layers_[layer];
  if (shard < 0 || shard >= l.slots())
    throw std::out_of_range("shard " + std::to_string(shard) + " is out of range [0, " +
                            std::to_string(l.slots()) + ")");
  if (block < 0 || block >= host_blocks_)
    throw std::out_of_range("host block " + std::to_string(block) + " is out of range [0, " +
                            std::to_string(host_blocks_) + ")");
  return host_ + l.host_offset(shard, block);
}

void BlockMover::validate(Direction dir, const int64_t* src, const int64_t* dst,
                          const int64_t* counts, size_t n, bool check_host) const {
  const bool d2h = dir == Direction::kDeviceToHost;
  const char* src_name = d2h ? "device" : "host";
  const char* dst_name = d2h ? "host" : "device";
  for (size_t i = 0; i < n; ++i) {
    const std::string at = " at index " + std::to_string(i);
    if (counts[i] <= 0)
      throw std::invalid_argument("copy size " + std::to_string(counts[i]) + at +
                                  " must be at least one block");
    for (int side = 0; side < 2; ++side) {
      const bool on_device = (side == 0) == d2h;
      if (!on_device && !check_host) continue;  // (dst is null then: never read it)
      const int64_t start = side == 0 ? src[i] : dst[i];
      const char* name = side == 0 ? src_name : dst_name;
      if (start < 0 || start > INT64_MAX - counts[i])
        throw std::invalid_argument(std::string(name) + " block range " +
                                    range_text(start, counts[i]) + at + " is out of range");
      const int64_t end = start + counts[i];
      if (!on_device) {
        if (end > host_blocks_)
          throw std::invalid_argument("host block range " + range_text(start, counts[i]) + at +
                                      " exceeds the " + std::to_string(host_blocks_) +
                                      " host blocks");
        continue;
      }
      for (size_t l = 0; l < layers_.size(); ++l) {
        const auto& layer = layers_[l];
        for (size_t s = 0; s < layer.shards.size(); ++s) {
          // The part of the range this shard holds, in its own block numbers.
          // Byte ends are formed only for ranges within the block count, so never wrap.
          const int64_t local_end = std::min(end, layer.first(s) + layer.shard_blocks) - layer.first(s);
          if (end > layer.device_blocks ||
              (local_end > 0 && start < layer.first(s) + layer.shard_blocks &&
               (local_end - 1) * layer.block_bytes + layer.block_bytes > layer.shards[s].size))
            throw std::invalid_argument(
                "device block range " + range_text(start, counts[i]) + at + " exceeds layer " +
                std::to_string(l) + " (" + std::to_string(layer.device_blocks) + " blocks of " +
                std::to_string(layer.block_bytes) + " bytes in a " +
                std::to_string(layer.shards[s].size) + "-byte buffer)");
        }
      }
    }
  }
  if (!check_host) return;  // the destinations are chunks the allocator hands out
  // Destinations written by one call must not overlap.
  std::vector<std::pair<int64_t, int64_t>> ranges(n);
  for (size_t i = 0; i < n; ++i) ranges[i] = {dst[i], dst[i] + counts[i]};
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < n; ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw std::invalid_argument(std::string(dst_name) + " block ranges " +
                                  range_text(ranges[i - 1].first,
                                             ranges[i - 1].second - ranges[i - 1].first) +
                                  " and " +
                                  range_text(ranges[i].first, ranges[i].second - ranges[i].first) +
                                  " overlap");
}

void BlockMover::move(Direction dir, const int64_t* src, const int64_t* dst,
                      const int64_t* counts, int64_t first, int64_t last, bool fenced) const {
  const int64_t shards = static_cast<int64_t>(layers_[0].shards.size());
  const int64_t per_op = static_cast<int64_t>(layers_.size()) * shards;
  for (int64_t item = first; item < last; ++item) {
    const int64_t op = item / per_op;
    const auto& layer = layers_[(item % per_op) / shards];
    const int64_t shard = item % shards;
    const DeviceRegion& region = layer.shards[shard];
    if (dir == Direction::kDeviceToHost && !layer.read_by_d2h(shard)) continue;
    const int64_t global_block = dir == Direction::kDeviceToHost ? src[op] : dst[op];
    // Only the part of the run this shard holds, at its own block numbers.
    const int64_t begin = std::max(global_block, layer.first(shard));
    const int64_t end = std::min(global_block + counts[op], layer.first(shard) + layer.shard_blocks);
    if (begin >= end) continue;
    const int64_t count = end - begin;
    const int64_t dev_block = begin - layer.first(shard);
    const int64_t host_block = (dir == Direction::kDeviceToHost ? dst[op] : src[op]) + (begin - global_block);
    uint8_t* host = host_ + layer.host_offset(layer.slot(shard), 0);
    const bool contiguous = layer.host.slice == layer.block_bytes;
    // A run of blocks contiguous on both sides moves as one copy.
    const int64_t pieces = contiguous ? 1 : count;
    const int64_t bytes = contiguous ? count * layer.block_bytes : layer.block_bytes;
    for (int64_t k = 0; k < pieces; ++k) {
      const int64_t dev_off = (dev_block + k) * layer.block_bytes;
      uint8_t* host_ptr = host + (host_block + k) * layer.host.slice;
      if (dir == Direction::kDeviceToHost) region.read(dev_off, bytes, host_ptr, fenced);
      else region.write(dev_off, bytes, host_ptr, fenced);
    }
  }
}

std::shared_ptr<TransferFuture> BlockMover::copy(Direction dir, const int64_t* src,
                                                 const int64_t* dst, const int64_t* counts,
                                                 size_t n) {
  validate(dir, src, dst, counts, n);
  auto ops = std::make_shared<std::vector<int64_t>>();
  ops->reserve(3 * n);
  ops->insert(ops->end(), src, src + n);
  ops->insert(ops->end(), dst, dst + n);
  ops->insert(ops->end(), counts, counts + n);
  return submit(dir, std::move(ops), n, false);
}

std::pair<std::vector<int64_t>, std::shared_ptr<TransferFuture>> BlockMover::save(
    const int64_t* src, const int64_t* counts, size_t n) {
  if (n == 0)
    throw std::invalid_argument("d2h_auto_allocate got no source blocks; expected at least one");
  HostChunks& chunks = pool_->chunks;
  int64_t blocks = 0;
  for (size_t i = 0; i < n; ++i)
    blocks = counts[i] > 0 ? checked_add(blocks, counts[i], "blocks to save") : blocks;
  std::vector<int64_t> ids;
  const bool leaks = chunks.leaks_refused();
  if (leaks) ids = chunks.allocate(blocks);  // the old order: chunks first, checks after
  validate(Direction::kDeviceToHost, src, nullptr, counts, n, /*check_host=*/false);
  if (!leaks) ids = chunks.allocate(blocks);
  // One op per block (chunks need not be consecutive), joined where both sides are.
  auto ops = std::make_shared<std::vector<int64_t>>();
  std::vector<int64_t> s, d, c;
  size_t next = 0;
  for (size_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < counts[i]; ++k, ++next) {
      if (!s.empty() && s.back() + c.back() == src[i] + k && d.back() + c.back() == ids[next]) {
        ++c.back();
        continue;
      }
      s.push_back(src[i] + k);
      d.push_back(ids[next]);
      c.push_back(1);
    }
  ops->insert(ops->end(), s.begin(), s.end());
  ops->insert(ops->end(), d.begin(), d.end());
  ops->insert(ops->end(), c.begin(), c.end());
  try {
    return {ids, submit(Direction::kDeviceToHost, std::move(ops), s.size(), true)};
  } catch (...) {
    chunks.unallocate(ids);
    throw;
  }
}

void BlockMover::begin_fences(bool write) const {
  std::vector<DeviceBuffer*> begun;
  try {
    for (const auto& layer : layers_)
      for (const auto& shard : layer.shards)
        if (shard.sim) {
          shard.sim->begin_dma(write);
          begun.push_back(shard.sim.get());
        }
  } catch (...) {
    for (DeviceBuffer* buffer : begun) buffer->end_dma(write);
    throw;
  }
}

void BlockMover::end_fences(bool write) const {
  for (const auto& layer : layers_)
    for (const auto& shard : layer.shards)
      if (shard.sim) shard.sim->end_dma(write);
}

std::shared_ptr<TransferFuture> BlockMover::submit(Direction dir,
                                                   std::shared_ptr<std::vector<int64_t>> ops,
                                                   size_t n, bool save) {
  const int64_t* src = ops->data();
  const int64_t* dst = src + n;
  const int64_t* counts = src + 2 * n;
  const int64_t per_op = static_cast<int64_t>(layers_.size() * layers_[0].shards.size());
  const int64_t items = static_cast<int64_t>(n) * per_op;
  if (items == 0) return std::make_shared<TransferFuture>(0);

  const bool d2h = dir == Direction::kDeviceToHost;
  const MoverFaults faults = pool_->faults;
  const bool fenced = !faults.unfenced_copies;
  const int64_t* host_start = d2h ? dst : src;
  const int64_t* device_start = d2h ? src : dst;
  // Everything that can refuse comes first, each undone if a later one refuses.
  if (fenced) begin_fences(!d2h);
  try {
    if (!save) {
      if (d2h) pool_->chunks.begin_writes(host_start, counts, n);
      else pool_->chunks.begin_reads(host_start, counts, n);
    }
  } catch (...) {
    if (fenced) end_fences(!d2h);
    throw;
  }

  int64_t total_bytes = 0;
  for (size_t i = 0; i < n; ++i) total_bytes += counts[i] * layers_[0].block_bytes * per_op;
  ThreadPool& threads = ThreadPool::shared();
  int64_t parts = std::clamp<int64_t>(std::max<int64_t>(total_bytes / kChunkBytes, threads.size()),
                                      1, items);
  if (pool_->parallelism > 0) parts = std::min(parts, pool_->parallelism);
  auto future = std::make_shared<TransferFuture>(parts);
  std::lock_guard<std::mutex> queueing(pool_->queue_mu);
  std::vector<Dependency> after;
  uint64_t order_id = 0;
  if (!faults.unordered_transfers) {
    BlockAccess access{BlockRanges(host_start, counts, n), BlockRanges(device_start, counts, n), d2h};
    std::tie(order_id, after) = pool_->order.enter(std::move(access), future);
  }
  auto self = shared_from_this();
  future->on_done([self, ops, n, d2h, fenced, order_id, ordered = !faults.unordered_transfers](bool ok) {
    const int64_t* base = ops->data();
    const int64_t* host = d2h ? base + n : base;
    if (fenced) self->end_fences(!d2h);
    if (d2h) self->pool_->chunks.end_writes(host, base + 2 * n, n, ok);
    else self->pool_->chunks.end_reads(host, base + 2 * n, n);
    if (ordered) self->pool_->order.leave(order_id);
  });
  auto deps = std::make_shared<std::vector<Dependency>>(std::move(after));
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t first = items * p / parts, last = items * (p + 1) / parts;
    threads.submit([self, ops, deps, future, dir, n, first, last, fenced] {
      std::exception_ptr error;
      try {
        // Earlier transfers on the same blocks end first; they were queued
        // earlier, so waiting here never waits on a task queued behind this one.
        for (const Dependency& dep : *deps) {
          dep.future->wait(-1.0);
          if (dep.reads_its_result && dep.future->error())
            throw DeviceError("an earlier transfer whose blocks this one reads failed");
        }
        const int64_t* base = ops->data();
        self->move(dir, base, base + n, base + 2 * n, first, last, fenced);
      } catch (...) {
        error = std::current_exception();
      }
      future->finish_part(error);
    });
  }
  return future;
}

}  // namespace kvref
