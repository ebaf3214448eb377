#include "tiled_layout.h"

#include <algorithm>
#include <string>

#include "checked.h"

namespace kvref {

int TiledLayout::add_digit(Digit d) {
  digits_.push_back(d);
  return static_cast<int>(digits_.size()) - 1;
}

TiledLayout::TiledLayout(std::vector<int64_t> dims, const Layout& layout, int element_bits)
    : dims_(std::move(dims)), element_bits_(element_bits) {
  const size_t rank = dims_.size();
  const std::vector<int64_t>& minor_to_major = layout.minor_to_major;
  if (minor_to_major.size() != rank)
    throw std::invalid_argument("the layout has " + std::to_string(minor_to_major.size()) +
                                " dims but the shape has " + std::to_string(dims_.size()));
  if (element_bits <= 0 || element_bits > 64)
    throw std::invalid_argument("element_bits must be in 1..64");
  const bool empty = std::find(dims_.begin(), dims_.end(), 0) != dims_.end();
  for (int64_t d : dims_) {
    if (d < 0) throw std::invalid_argument("dims must be non-negative");
    // With a zero dim the product is zero, however large the others are.
    if (!empty) logical_elements_ = checked_mul(logical_elements_, d, "logical element count");
  }
  if (empty) logical_elements_ = 0;

  // Digits currently forming the shape, major to minor.
  std::vector<int> shape;
  for (auto it = minor_to_major.rbegin(); it != minor_to_major.rend(); ++it) {
    Digit root;
    root.extent = dims_[*it];
    root.logical_dim = static_cast<int>(*it);
    shape.push_back(add_digit(root));
  }
  // The arithmetic below walks the tile tree recursively: its depth is the
  // tile count, which Layout bounds (kMaxTiles).
  for (const auto& tile : layout.tiles) {
    while (shape.size() < tile.size()) shape.insert(shape.begin(), add_digit(Digit{}));
    std::vector<int> counts, inner;
    const size_t first = shape.size() - tile.size();
    for (size_t i = 0; i < tile.size(); ++i) {
      const int64_t t = tile[i];
      const int parent = shape[first + i];
      Digit count, within;
      count.extent = ceil_div(digits_[parent].extent, t);
      count.logical_dim = within.logical_dim = digits_[parent].logical_dim;
      count.parent = within.parent = parent;
      count.weight = t;
      within.extent = t;
      within.weight = 1;
      const int c = add_digit(count), w = add_digit(within);
      digits_[parent].count_child = c;
      digits_[parent].tile_child = w;
      digits_[parent].split = t;
      counts.push_back(c);
      inner.push_back(w);
    }
    shape.resize(first);
    shape.insert(shape.end(), counts.begin(), counts.end());
    shape.insert(shape.end(), inner.begin(), inner.end());
  }

  // Row-major strides over the final digits.
  leaf_stride_.assign(digits_.size(), 0);
  const bool no_slots = std::any_of(shape.begin(), shape.end(),
                                    [this](int leaf) { return digits_[leaf].extent == 0; });
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    leaf_stride_[*it] = physical_elements_;
    // A zero extent makes the buffer empty: strides past it are never used.
    if (!no_slots)
      physical_elements_ =
          checked_mul(physical_elements_, digits_[*it].extent, "physical element count");
  }
  if (no_slots) physical_elements_ = 0;
  const int64_t bits = checked_mul(physical_elements_, element_bits_, "physical bit count");
  physical_bytes_ = ceil_div(bits, 8);

  if (empty) return;  // no element to place: no loops to walk

  std::vector<int64_t> logical_stride(rank, 1);
  for (size_t d = rank; d-- > 1;) logical_stride[d - 1] = logical_stride[d] * dims_[d];

  for (int leaf : shape) {
    if (digits_[leaf].extent <= 1) continue;
    Loop loop;
    loop.digit = leaf;
    loop.extent = digits_[leaf].extent;
    loop.phys_stride = leaf_stride_[leaf];
    int64_t mult = 1;
    int node = leaf;
    while (digits_[node].parent >= 0) {
      mult = checked_mul(mult, digits_[node].weight, "tile weight");
      node = digits_[node].parent;
      loop.ancestors.emplace_back(node, mult);
    }
    loop.root = node;
    const int d = digits_[node].logical_dim;
    loop.logical_stride = d >= 0 ? checked_mul(mult, logical_stride[d], "logical stride") : 0;
    loops_.push_back(std::move(loop));
  }
}

void TiledLayout::contribute(int digit, int64_t value, int64_t* acc) const {
  const Digit& g = digits_[digit];
  if (g.split == 0) {
    *acc += value * leaf_stride_[digit];
    return;
  }
  contribute(g.count_child, value / g.split, acc);
  contribute(g.tile_child, value % g.split, acc);
}

int TiledLayout::root_of(int d) const {
  if (d < 0 || static_cast<size_t>(d) >= dims_.size())
    throw std::invalid_argument("dim out of range");
  for (size_t i = 0; i < digits_.size(); ++i)
    if (digits_[i].parent < 0 && digits_[i].logical_dim == d) return static_cast<int>(i);
  throw std::logic_error("no root digit for a dim");
}

// max over x in [0, limit) of the contribution of `digit` (limit >= 1). A split
// digit contributes count(x / t) + tile(x % t): either x's count is below the
// last one, so its tile part ranges over all of [0, t), or it is the last one,
// so its tile part ranges over [0, (limit - 1) % t].
int64_t TiledLayout::max_below(int digit, int64_t limit) const {
  const Digit& g = digits_[digit];
  if (g.split == 0) return (limit - 1) * leaf_stride_[digit];
  const int64_t last = (limit - 1) / g.split;
  int64_t at_last = 0;
  contribute(g.count_child, last, &at_last);
  int64_t best = at_last + max_below(g.tile_child, (limit - 1) % g.split + 1);
  if (last > 0)
    best = std::max(best, max_below(g.count_child, last) + max_below(g.tile_child, g.split));
  return best;
}

int64_t TiledLayout::dim_max(int d) const {
  const int root = root_of(d);
  return dims_[d] > 0 ? max_below(root, dims_[d]) : 0;
}

std::vector<int64_t> TiledLayout::dim_table(int d) const {
  const int root = root_of(d);
  std::vector<int64_t> table(dims_[d], 0);
  for (int64_t x = 0; x < dims_[d]; ++x) contribute(root, x, &table[x]);
  return table;
}

void TiledLayout::element_indices(int64_t* out) const {
  const size_t rank = dims_.size();
  if (logical_elements_ == 0) return;
  std::vector<std::vector<int64_t>> tables;
  for (size_t d = 0; d < rank; ++d) tables.push_back(dim_table(static_cast<int>(d)));
  if (rank == 0) {
    out[0] = 0;
    return;
  }
  // Odometer over all but the last dim; the last dim is a table add.
  std::vector<int64_t> coord(rank, 0);
  const int64_t last = dims_[rank - 1];
  const int64_t* last_table = tables[rank - 1].data();
  for (int64_t base = 0; base < logical_elements_; base += last) {
    int64_t outer = 0;
    for (size_t d = 0; d + 1 < rank; ++d) outer += tables[d][coord[d]];
    for (int64_t x = 0; x < last; ++x) out[base + x] = outer + last_table[x];
    for (size_t d = rank - 1; d-- > 0;) {
      if (++coord[d] < dims_[d]) break;
      coord[d] = 0;
    }
  }
}

}  // namespace kvref
