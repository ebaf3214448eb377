// Shared pieces of the nanobind bindings (bindings.h).
#include "bindings.h"

#include <stdexcept>

namespace kvref_bind {

void check_size(const char* what, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want)
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(got) +
                                " bytes, expected " + std::to_string(want));
}

nb::ndarray<nb::numpy, int64_t> to_numpy(std::vector<int64_t> values) {
  auto* data = new std::vector<int64_t>(std::move(values));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return nb::ndarray<nb::numpy, int64_t>(data->data(), {data->size()}, owner);
}

}  // namespace kvref_bind
