#include "layout.h"

#include <algorithm>
#include <stdexcept>

namespace kvref {

namespace {

// The text form joins with ","; messages with ", ", as Python prints a list.
std::string join(const std::vector<int64_t>& values, const char* separator = ",") {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += (i ? separator : "") + std::to_string(values[i]);
  return text;
}

}  // namespace

Layout::Layout(std::vector<int64_t> minor_to_major_, std::vector<std::vector<int64_t>> tiles_,
               int64_t element_bits_)
    : minor_to_major(std::move(minor_to_major_)), tiles(std::move(tiles_)), element_bits(element_bits_) {
  std::vector<int64_t> sorted = minor_to_major;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != static_cast<int64_t>(i))
      throw std::invalid_argument("minor_to_major [" + join(minor_to_major, ", ") + "] is not a permutation of 0.." +
                                  std::to_string(static_cast<int64_t>(sorted.size()) - 1));
  if (tiles.size() > kMaxTiles)
    throw std::invalid_argument("a layout of " + std::to_string(tiles.size()) + " tiles; at most " +
                                std::to_string(kMaxTiles) + " are supported (XLA's TPU layouts use one or two)");
  for (const auto& tile : tiles)
    if (tile.empty() || std::any_of(tile.begin(), tile.end(), [](int64_t t) { return t <= 0; }))
      throw std::invalid_argument("tile (" + join(tile, ", ") + ") must have one or more positive sizes");
  if (element_bits < 0)
    throw std::invalid_argument("element size E(" + std::to_string(element_bits) + ") must not be negative");
}

std::string Layout::to_string() const {
  std::string extra;
  for (const auto& tile : tiles) extra += "(" + join(tile) + ")";
  if (!extra.empty()) extra = "T" + extra;
  if (element_bits) extra += "E(" + std::to_string(element_bits) + ")";
  return "{" + join(minor_to_major) + (extra.empty() ? "" : ":" + extra) + "}";
}

bool Layout::equal(const Layout& other, bool ignore_element_size, bool ignore_tiles) const {
  return minor_to_major == other.minor_to_major && (ignore_tiles || tiles == other.tiles) &&
         (ignore_element_size || element_bits == other.element_bits);
}

}  // namespace kvref
