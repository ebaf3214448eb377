// Shared pieces of the nanobind bindings; one bind_* function per concept.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "released_gil.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvref_bind {

namespace nb = nanobind;

using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ReadOnlyBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void check_size(const char* what, size_t got, int64_t want);

// A NumPy array that owns `values`.
nb::ndarray<nb::numpy, int64_t> to_numpy(std::vector<int64_t> values);

void bind_layout(nb::module_& m);
void bind_device(nb::module_& m);
void bind_mover(nb::module_& m);
void bind_plans(nb::module_& m);

}  // namespace kvref_bind
