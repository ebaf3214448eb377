// Bindings of the active-plan registry: the bytes-taking binding, and the old
// std::string one (nanobind's std::string accepts only str, refusing bytes).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "plans.h"

namespace kvref_bind {

using kvref::PlanRegistry;

void bind_plans(nb::module_& m) {
  nb::class_<PlanRegistry>(m, "PlanRegistry")
      .def(nb::init<int, int64_t>(), nb::arg("num_layers"), nb::arg("device_blocks"))
      .def("add",
           [](PlanRegistry& r, const std::string& uuid, nb::bytes request, bool is_sender) {
             r.add(uuid, request.c_str(), request.size(), is_sender);
           },
           nb::arg("uuid"), nb::arg("request"), nb::arg("is_sender"))
      .def("add_str",
           [](PlanRegistry& r, const std::string& uuid, const std::string& request,
              bool is_sender) { r.add(uuid, request.data(), request.size(), is_sender); },
           nb::arg("uuid"), nb::arg("request"), nb::arg("is_sender"))
      .def("remove", &PlanRegistry::remove, nb::arg("uuid"))
      .def("__contains__", &PlanRegistry::contains)
      .def("__len__", &PlanRegistry::size)
      .def("get",
           [](PlanRegistry& r, const std::string& uuid) {
             kvref::Plan p = r.get(uuid);
             nb::dict d;
             d["uuid"] = p.uuid;
             d["peer"] = p.peer;
             d["layer_ids"] = p.layer_ids;
             d["src_block_ids"] = p.src_block_ids;
             d["dst_block_ids"] = p.dst_block_ids;
             d["is_sender"] = p.is_sender;
             return d;
           });
}

}  // namespace kvref_bind
