// Copies between a row-major logical array and its tiled physical bytes.
#pragma once

#include <cstdint>

#include "tiled_layout.h"

namespace kvref {

// logical: one element per `itemsize` bytes (sub-byte types: one per byte,
// value in the low bits). physical: layout.physical_bytes() bytes; pack writes
// zeros into every padding element.
void pack(const TiledLayout& layout, const uint8_t* logical, uint8_t* physical,
          int itemsize);
void unpack(const TiledLayout& layout, const uint8_t* physical, uint8_t* logical,
            int itemsize);

}  // namespace kvref
