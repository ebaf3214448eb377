#include "pack.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace kvref {
namespace {

// Walks the physical loop nest, skipping padding and handing each innermost
// run of valid elements to Op::run(phys, log, n, phys_stride, log_stride).
// Op::pad(phys, count) receives every padding range (in elements).
constexpr size_t kMaxAncestors = 32;
constexpr int64_t kMaxThreads = 4;
constexpr int64_t kBytesPerThread = 4 << 20;  // below this a thread costs more than it saves

template <class Op>
class Walker {
 public:
  Walker(const TiledLayout& layout, Op& op)
      : layout_(layout), loops_(layout.loops()), op_(op),
        value_(layout.digits().size(), 0) {}

  void run() {
    if (layout_.logical_elements() == 0) return;
    for (const Loop& loop : loops_)
      if (loop.ancestors.size() > kMaxAncestors)
        throw std::invalid_argument("too many tile levels");
    if (loops_.empty()) {
      op_.run(0, 0, 1, 1, 1);
      return;
    }
    const int64_t bytes = layout_.physical_bytes();
    const int64_t top = valid_count(loops_[0]);
    const int threads = static_cast<int>(std::min<int64_t>(
        {kMaxThreads, static_cast<int64_t>(std::thread::hardware_concurrency()), top,
         bytes / kBytesPerThread}));
    if (!Op::kParallel || loops_.size() < 2 || threads < 2) {
      walk(0, 0, 0);
      return;
    }
    // Big buffers: split the outermost loop's valid range between threads,
    // each with a walker of its own; padding past that range stays here.
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t)
      workers.emplace_back([this, t, threads, top] {
        Walker other(layout_, op_);
        other.walk_top(top * t / threads, top * (t + 1) / threads);
      });
    walk_top(0, top / threads);
    for (auto& w : workers) w.join();
    const Loop& loop = loops_[0];
    if (top < loop.extent) op_.pad(top * loop.phys_stride, (loop.extent - top) * loop.phys_stride);
  }

 private:
  // Outermost coordinates [begin, end), all valid, each walked in full.
  void walk_top(int64_t begin, int64_t end) {
    const Loop& loop = loops_[0];
    int64_t saved[kMaxAncestors];
    for (size_t i = 0; i < loop.ancestors.size(); ++i) saved[i] = value_[loop.ancestors[i].first];
    for (int64_t k = begin; k < end; ++k) {
      set(loop, k, saved);
      walk(1, k * loop.phys_stride, k * loop.logical_stride);
    }
    set(loop, 0, saved);
  }

  // Number of leading coordinates of loop `l` that are not padding, given the
  // coordinates already fixed further out.
  int64_t valid_count(const Loop& loop) const {
    int64_t n = loop.extent;
    for (const auto& [digit, mult] : loop.ancestors) {
      const int64_t room = layout_.digits()[digit].extent - value_[digit];
      if (room <= 0) return 0;
      n = std::min(n, (room + mult - 1) / mult);
    }
    return n;
  }

  void set(const Loop& loop, int64_t k, const int64_t* saved) {
    for (size_t i = 0; i < loop.ancestors.size(); ++i) {
      const auto& [digit, mult] = loop.ancestors[i];
      value_[digit] = saved[i] + k * mult;
    }
  }

  void walk(size_t l, int64_t phys, int64_t log) {
    const Loop& loop = loops_[l];
    const int64_t n = valid_count(loop);
    const size_t last = loops_.size() - 1;
    if (l == last) {
      op_.run(phys, log, n, loop.phys_stride, loop.logical_stride);
    } else if (l + 1 == last && loops_[last].root != loop.root) {
      // The inner loop's valid count does not depend on this loop: one 2-D run.
      const Loop& inner = loops_[last];
      const int64_t m = valid_count(inner);
      if (m == inner.extent) {
        op_.run2(phys, log, n, loop.phys_stride, loop.logical_stride, m, inner.phys_stride,
                 inner.logical_stride);
      } else {
        for (int64_t k = 0; k < n; ++k) {
          const int64_t p = phys + k * loop.phys_stride;
          op_.run(p, log + k * loop.logical_stride, m, inner.phys_stride, inner.logical_stride);
          op_.pad(p + m * inner.phys_stride, (inner.extent - m) * inner.phys_stride);
        }
      }
    } else {
      int64_t saved[kMaxAncestors];
      for (size_t i = 0; i < loop.ancestors.size(); ++i) saved[i] = value_[loop.ancestors[i].first];
      for (int64_t k = 0; k < n; ++k) {
        set(loop, k, saved);
        walk(l + 1, phys + k * loop.phys_stride, log + k * loop.logical_stride);
      }
      set(loop, 0, saved);
    }
    if (n < loop.extent) op_.pad(phys + n * loop.phys_stride, (loop.extent - n) * loop.phys_stride);
  }

  const TiledLayout& layout_;
  const std::vector<Loop>& loops_;
  Op& op_;
  std::vector<int64_t> value_;
};

template <class T, bool kPack>
struct CopyOp {
  static constexpr bool kParallel = true;  // threads write disjoint elements
  T* phys;
  T* log;
  void run(int64_t p, int64_t l, int64_t n, int64_t ps, int64_t ls) {
    T* pp = phys + p;
    T* lp = log + l;
    if (ps == 1 && ls == 1) {
      if (kPack) std::memcpy(pp, lp, n * sizeof(T));
      else std::memcpy(lp, pp, n * sizeof(T));
      return;
    }
    for (int64_t k = 0; k < n; ++k) {
      if (kPack) pp[k * ps] = lp[k * ls];
      else lp[k * ls] = pp[k * ps];
    }
  }
  // n x m elements: outer steps (ps, ls), inner steps (ips, ils).
  void run2(int64_t p, int64_t l, int64_t n, int64_t ps, int64_t ls, int64_t m, int64_t ips,
            int64_t ils) {
    if (ips == 1 && ps == m && ls == 1) {
      // Sub-tiles: m rows interleaved element by element, e.g. bf16 (2,1).
      switch (m) {
        case 2: return interleave<2>(phys + p, log + l, n, ils);
        case 4: return interleave<4>(phys + p, log + l, n, ils);
        case 8: return interleave<8>(phys + p, log + l, n, ils);
      }
    }
    for (int64_t k = 0; k < n; ++k) run(p + k * ps, l + k * ls, m, ips, ils);
  }
  template <int M>
  static void interleave(T* __restrict pp, T* __restrict lp, int64_t n, int64_t row) {
    for (int64_t k = 0; k < n; ++k)
      for (int j = 0; j < M; ++j) {
        if (kPack) pp[k * M + j] = lp[j * row + k];
        else lp[j * row + k] = pp[k * M + j];
      }
  }
  void pad(int64_t p, int64_t count) {
    if (kPack) std::memset(phys + p, 0, count * sizeof(T));
  }
};

// Sub-byte elements: several per byte, the first in the low bits.
template <bool kPack>
struct SubByteOp {
  static constexpr bool kParallel = false;  // neighbours share bytes
  uint8_t* phys;
  uint8_t* log;
  int bits;
  void run(int64_t p, int64_t l, int64_t n, int64_t ps, int64_t ls) {
    const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t bit = (p + k * ps) * bits;
      uint8_t& byte = phys[bit / 8];
      const int shift = static_cast<int>(bit % 8);
      uint8_t& value = log[l + k * ls];
      if (kPack) byte = static_cast<uint8_t>((byte & ~(mask << shift)) | ((value & mask) << shift));
      else value = static_cast<uint8_t>((byte >> shift) & mask);
    }
  }
  void run2(int64_t p, int64_t l, int64_t n, int64_t ps, int64_t ls, int64_t m, int64_t ips,
            int64_t ils) {
    for (int64_t k = 0; k < n; ++k) run(p + k * ps, l + k * ls, m, ips, ils);
  }
  // pack zeroes the whole buffer first, so padding needs no work here.
  void pad(int64_t, int64_t) {}
};

template <bool kPack>
void copy(const TiledLayout& layout, uint8_t* phys, uint8_t* log, int itemsize) {
  const int bits = layout.element_bits();
  if (bits < 8) {
    if (kPack) std::memset(phys, 0, layout.physical_bytes());
    SubByteOp<kPack> op{phys, log, bits};
    Walker<SubByteOp<kPack>>(layout, op).run();
    return;
  }
  if (bits != itemsize * 8)
    throw std::invalid_argument("element_bits must equal the item size in bits");
  switch (itemsize) {
#define KVREF_CASE(N, T)                                                          \
  case N: {                                                                       \
    CopyOp<T, kPack> op{reinterpret_cast<T*>(phys), reinterpret_cast<T*>(log)};   \
    Walker<CopyOp<T, kPack>>(layout, op).run();                                   \
    return;                                                                       \
  }
    KVREF_CASE(1, uint8_t)
    KVREF_CASE(2, uint16_t)
    KVREF_CASE(4, uint32_t)
    KVREF_CASE(8, uint64_t)
#undef KVREF_CASE
    default:
      throw std::invalid_argument("itemsize must be 1, 2, 4 or 8 bytes");
  }
}

}  // namespace

void pack(const TiledLayout& layout, const uint8_t* logical, uint8_t* physical,
          int itemsize) {
  copy<true>(layout, physical, const_cast<uint8_t*>(logical), itemsize);
}

void unpack(const TiledLayout& layout, const uint8_t* physical, uint8_t* logical,
            int itemsize) {
  copy<false>(layout, const_cast<uint8_t*>(physical), logical, itemsize);
}

}  // namespace kvref
