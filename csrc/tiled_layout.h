// The physical placement of an XLA array under a tiled layout.
//
// Tiling splits every logical dimension into "digits": a tile of size t turns a
// digit of extent E into a count digit (extent ceil(E/t), weight t) and a tile
// digit (extent t, weight 1). The final digits, laid out row-major, are the
// physical buffer. Because each digit belongs to exactly one logical dimension,
// an element's physical index is a sum of per-dimension contributions, and a
// digit coordinate is padding when some digit above it overflows its extent.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "layout.h"

namespace kvref {

struct Digit {
  int64_t extent = 1;
  int logical_dim = -1;  // -1: a major dim a tile of higher rank adds
  int parent = -1;
  int64_t weight = 1;  // value of one step of this digit in its parent's value
  int count_child = -1, tile_child = -1;
  int64_t split = 0;  // tile size this digit was split by, 0 when it is a leaf
};

// A physical dimension of extent > 1, in physical (major to minor) order.
struct Loop {
  int digit = 0;
  int64_t extent = 1;
  int64_t phys_stride = 1;     // in elements
  int64_t logical_stride = 0;  // in elements of the row-major logical array
  int root = -1;               // the logical (or added) dimension's root digit
  std::vector<std::pair<int, int64_t>> ancestors;  // (digit, multiplier)
};

class TiledLayout {
 public:
  // `element_bits`: what one element takes (the layout's E, else the type's storage size).
  TiledLayout(std::vector<int64_t> dims, const Layout& layout, int element_bits);

  int64_t logical_elements() const { return logical_elements_; }
  int64_t physical_elements() const { return physical_elements_; }
  int64_t physical_bytes() const { return physical_bytes_; }
  int element_bits() const { return element_bits_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  const std::vector<Digit>& digits() const { return digits_; }
  const std::vector<Loop>& loops() const { return loops_; }

  // Physical element index contributed by coordinate x of logical dim d.
  std::vector<int64_t> dim_table(int d) const;
  // The largest of those over every coordinate of dim d (the smallest is 0,
  // at x = 0), without enumerating them.
  int64_t dim_max(int d) const;
  // Physical element index of every logical element, in row-major order.
  void element_indices(int64_t* out) const;

 private:
  int add_digit(Digit d);
  void contribute(int digit, int64_t value, int64_t* acc) const;
  int64_t max_below(int digit, int64_t limit) const;
  int root_of(int d) const;

  std::vector<int64_t> dims_;
  int element_bits_;
  std::vector<Digit> digits_;
  std::vector<int64_t> leaf_stride_;  // per digit; 0 for non-leaves
  std::vector<Loop> loops_;
  int64_t logical_elements_ = 1;
  int64_t physical_elements_ = 1;
  int64_t physical_bytes_ = 0;
};

}  // namespace kvref
