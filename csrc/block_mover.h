// The reference manager's data path: a host pool and validated, chunked block
// copies between it and every layer's device buffers, on the shared pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device.h"
#include "host_chunks.h"
#include "transfer_order.h"

namespace kvref {

// Keeps something alive for as long as C++ uses it (a Python object whose
// memory a region or the host pool points into); released on the last drop.
using Owner = std::shared_ptr<void>;

// One shard of one layer: a simulated buffer, or raw memory (a JAX CPU array)
// together with the owner of that memory.
struct DeviceRegion {
  std::shared_ptr<DeviceBuffer> sim;
  uint8_t* raw = nullptr;
  int64_t size = 0;
  Owner owner;
  void read(int64_t offset, int64_t n, uint8_t* dst, bool fenced) const;
  void write(int64_t offset, int64_t n, const uint8_t* src, bool fenced) const;
};

// Where one device's shard of a layer lies (kvref.sharding.ShardPlacement):
// the global id of its first block, the part of a host block its part of a
// block fills (of host_slots), and whether a d2h reads it (a replica holds
// another shard's bytes; an h2d writes every replica).
struct ShardPlacement {
  int64_t first_block = 0;
  int64_t host_slot = 0;
  int64_t host_slots = 1;
  bool reads = true;
};

// Where one layer's blocks lie in the host pool: from `base`, for each part
// of a block, room for `blocks` host blocks of `slice` bytes (part p's block
// b at base + (p * blocks + b) * slice).
struct HostSpan {
  int64_t base = 0;
  int64_t blocks = 0;
  int64_t slice = 0;
};

// How one layer's blocks are addressed on the device and in the host pool.
// Built whole and checked by its constructor: one placement per shard (none
// given: each shard holds every block, in a host slot of its own), every
// shard's blocks inside the layer's `device_blocks` (by global id), every
// size a count.
struct LayerAddressing {
  LayerAddressing(std::vector<DeviceRegion> shards, std::vector<ShardPlacement> placements,
                  int64_t device_blocks, int64_t shard_blocks, int64_t block_bytes, HostSpan host);

  std::vector<DeviceRegion> shards;
  std::vector<ShardPlacement> placements;  // one per shard
  int64_t shard_blocks = 0;   // blocks each shard holds
  int64_t device_blocks = 0;  // the layer's blocks, by global id
  int64_t block_bytes = 0;    // bytes of one block, moved per block and between device blocks
  HostSpan host;

  int64_t first(size_t shard) const { return placements[shard].first_block; }
  int64_t slot(size_t shard) const { return placements[shard].host_slot; }
  bool read_by_d2h(size_t shard) const { return placements[shard].reads; }
  int64_t slots() const { return placements[0].host_slots; }
  // Where part `slot`'s host block `block` starts, from the pool's first byte.
  int64_t host_offset(int64_t slot, int64_t block) const {
    return host.base + (slot * host.blocks + block) * host.slice;
  }
  // The last host byte `host_blocks` of this layer's blocks reach, plus one.
  int64_t host_end(int64_t host_blocks) const;
  // The bytes of the pool this layer's span takes, from its base.
  int64_t host_extent() const;
};

class TransferFuture {
 public:
  explicit TransferFuture(int64_t parts);
  // Runs once every part has finished, before any waiter is woken (so that
  // whoever sees the future done also sees its effects); `ok`: no part failed.
  void on_done(std::function<void(bool ok)> callback);
  void finish_part(std::exception_ptr error);
  // True once every part finished (timeout_s < 0: wait forever).
  bool wait(double timeout_s);
  bool done();
  // Rethrows the first error, if any. Call after wait() returned true.
  void rethrow();
  std::exception_ptr error();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t remaining_;
  bool done_;
  std::exception_ptr error_;
  std::vector<std::function<void(bool)>> callbacks_;
  int creator_pid_;  // a forked child cannot wait for copies its parent runs
};

// Old bugs of the mover and its host chunks, switched on one by one: the
// fault models of kvref.Faults by the same names.
struct MoverFaults {
  bool leaky_refused_allocation = false;  // a refused allocation keeps the chunks it took
  bool unchecked_unlock = false;          // unlock frees any id, however often
  bool unordered_transfers = false;  // no transfer waits for an earlier one on the same blocks
  bool unfenced_copies = false;      // copies are not ordered before later device ops and reads

  ChunkFaults chunks() const { return {leaky_refused_allocation, unchecked_unlock}; }
};

// What every mover of one host pool shares (with_shard makes more of them).
struct PoolState {
  explicit PoolState(int64_t host_blocks) : chunks(host_blocks) {}
  // Locks `n` (at least one) chunks to be written from elsewhere (SAVING): their
  // ids; PoolExhausted takes none. `caller` names the call in its refusals.
  std::vector<int64_t> claim(int64_t n, const std::string& caller);
  // Claimed chunks written (SAVED, `ok`) or not (FAILED).
  void settle_claim(const int64_t* ids, size_t n, bool ok);
  // Chunks a peer read through begin_peer_reads, released.
  void release_from_peer(const int64_t* ids, size_t n);
  // The old bugs switched on, for every mover of the pool and its chunks.
  void set_faults(const MoverFaults& switched_on);
  // Most parts one transfer is split into (at least 1).
  void set_parallelism(int64_t parts);

  HostChunks chunks;
  TransferOrder order;
  MoverFaults faults;
  // Held from entering a transfer in `order` until its parts are queued, so
  // an earlier transfer's parts are always queued before a later one's.
  std::mutex queue_mu;
  int64_t parallelism = 0;  // most parts one transfer is split into (0: the pool's threads)
};

enum class Direction { kDeviceToHost, kHostToDevice };

class BlockMover : public std::enable_shared_from_this<BlockMover> {
 public:
  // host_bytes: the pool to allocate (or, with external_host, memory that
  // host_owner keeps alive while the mover, and so every task using it,
  // exists); every host range the layers address must fit in it (checked here).
  BlockMover(std::vector<LayerAddressing> layers, int64_t host_blocks, int64_t host_bytes,
             uint8_t* external_host = nullptr, Owner host_owner = nullptr,
             std::shared_ptr<PoolState> pool = nullptr);

  // src/dst/counts in blocks. Validates everything before moving a byte.
  std::shared_ptr<TransferFuture> copy(Direction dir, const int64_t* src, const int64_t* dst,
                                       const int64_t* counts, size_t n);
  // d2h into host chunks it allocates (locked until unlocked): the chunk ids,
  // one per block in order, and the future. Refused requests take no chunk.
  std::pair<std::vector<int64_t>, std::shared_ptr<TransferFuture>> save(const int64_t* src,
                                                                        const int64_t* counts,
                                                                        size_t n);
  PoolState& pool() const { return *pool_; }
  // A mover of the same host pool with one shard's device region replaced (an
  // array whose storage moved since); the pool lives while either mover does,
  // and transfers already running keep using this one.
  std::shared_ptr<BlockMover> with_shard(int layer, int shard, DeviceRegion region) const;
  uint8_t* host_block(int layer, int shard, int64_t block);
  // A block's bytes written into its host chunk from elsewhere (`size`: the
  // layer's block bytes), the chunk then holding bytes.
  void write_host_block(int layer, int shard, int64_t block, const uint8_t* data, size_t size);
  int64_t host_bytes() const { return host_size_; }
  uint8_t* host_data() const { return host_; }
  const std::vector<LayerAddressing>& layers() const { return layers_; }

 private:
  void validate(Direction dir, const int64_t* src, const int64_t* dst, const int64_t* counts,
                size_t n, bool check_host = true) const;
  // Fences, chunk states and program order, then the copy on the pool.
  std::shared_ptr<TransferFuture> submit(Direction dir, std::shared_ptr<std::vector<int64_t>> ops,
                                         size_t n, bool save);
  void move(Direction dir, const int64_t* src, const int64_t* dst, const int64_t* counts,
            int64_t first, int64_t last, bool fenced) const;
  // Each simulated shard's fence, begun (or ended) for a transfer's copies.
  void begin_fences(bool write) const;
  void end_fences(bool write) const;

  std::vector<LayerAddressing> layers_;
  int64_t host_blocks_;
  std::shared_ptr<PageBuffer> owned_host_;
  Owner host_owner_;
  uint8_t* host_;
  int64_t host_size_;
  std::shared_ptr<PoolState> pool_;
};

}  // namespace kvref
