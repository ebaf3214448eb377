// Bindings of the tiled-layout model. Errors become ValueError/OverflowError.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "bindings.h"
#include "checked.h"
#include "pack.h"
#include "tiled_layout.h"

namespace kvref_bind {

using kvref::TiledLayout;

namespace {

int64_t logical_bytes(const TiledLayout& layout, int itemsize) {
  return kvref::checked_mul(layout.logical_elements(), itemsize, "logical byte count");
}

}  // namespace

void bind_layout(nb::module_& m) {
  m.attr("MAX_TILES") = kvref::kMaxTiles;
  nb::class_<kvref::Layout>(m, "Layout")
      .def(nb::init<std::vector<int64_t>, std::vector<std::vector<int64_t>>, int64_t>(),
           nb::arg("minor_to_major"), nb::arg("tiles"), nb::arg("element_bits"))
      .def("__str__", &kvref::Layout::to_string)
      .def("equal", &kvref::Layout::equal, nb::arg("other"), nb::arg("ignore_element_size"),
           nb::arg("ignore_tiles"));

  nb::class_<TiledLayout>(m, "TiledLayout")
      .def(nb::init<std::vector<int64_t>, const kvref::Layout&, int>(), nb::arg("dims"),
           nb::arg("layout"), nb::arg("element_bits"))
      .def_prop_ro("logical_elements", &TiledLayout::logical_elements)
      .def_prop_ro("physical_elements", &TiledLayout::physical_elements)
      .def_prop_ro("physical_bytes", &TiledLayout::physical_bytes)
      .def_prop_ro("element_bits", &TiledLayout::element_bits)
      .def("dim_max", &TiledLayout::dim_max, nb::arg("dim"))
      .def("dim_table",
           [](const TiledLayout& l, int d) { return to_numpy(l.dim_table(d)); },
           nb::arg("dim"),
           "Physical element index contributed by each coordinate of one dim.")
      .def("element_indices",
           [](const TiledLayout& l) {
             std::vector<int64_t> out(l.logical_elements());
             l.element_indices(out.data());
             return to_numpy(std::move(out));
           },
           "Physical element index of every logical element, row-major.")
      .def("pack",
           [](const TiledLayout& l, ReadOnlyBytes logical, Bytes physical, int itemsize) {
             check_size("logical buffer", logical.size(), logical_bytes(l, itemsize));
             check_size("physical buffer", physical.size(), l.physical_bytes());
             ReleasedGil released;
             kvref::pack(l, logical.data(), physical.data(), itemsize);
           },
           nb::arg("logical"), nb::arg("physical"), nb::arg("itemsize"))
      .def("unpack",
           [](const TiledLayout& l, ReadOnlyBytes physical, Bytes logical, int itemsize) {
             check_size("physical buffer", physical.size(), l.physical_bytes());
             check_size("logical buffer", logical.size(), logical_bytes(l, itemsize));
             ReleasedGil released;
             kvref::unpack(l, physical.data(), logical.data(), itemsize);
           },
           nb::arg("physical"), nb::arg("logical"), nb::arg("itemsize"));
}

}  // namespace kvref_bind
