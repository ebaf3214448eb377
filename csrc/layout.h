// An XLA layout as a value: minor_to_major, the tiles applied in order, and
// the element size in bits (0: the type's storage size). Checked whole by its
// constructor; one text form (XLA's, which kvref.Shape.parse reads back);
// compared as XLA's Layout::Equal does, ignoring what the caller asks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvref {

// Tiles one layout may apply (kvref.shape.MAX_TILES): the layout arithmetic
// recurses over the tile tree, as deep as the tile count.
constexpr size_t kMaxTiles = 8;

struct Layout {
  Layout(std::vector<int64_t> minor_to_major, std::vector<std::vector<int64_t>> tiles,
         int64_t element_bits);

  std::vector<int64_t> minor_to_major;
  std::vector<std::vector<int64_t>> tiles;
  int64_t element_bits = 0;

  // `{2,0,1:T(8,128)(2,1)E(4)}`
  std::string to_string() const;
  bool equal(const Layout& other, bool ignore_element_size, bool ignore_tiles) const;
  bool operator==(const Layout& other) const { return equal(other, false, false); }
};

}  // namespace kvref
