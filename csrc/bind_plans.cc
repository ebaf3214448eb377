// Bindings of the active-plan registry: the bytes-taking binding, and the old
// std::string one (nanobind's std::string accepts only str, refusing bytes).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "plans.h"

namespace kvref_bind {

using kvref::PlanRegistry;

void bind_plans(nb::module_& m) {
  m.attr("MAX_PLAN_BYTES") = kvref::kMaxPlanBytes;  // a plan request's bound, declared in plans.h
  nb::class_<kvref::Plan>(m, "Plan")
      .def_ro("uuid", &kvref::Plan::uuid)
      .def_ro("peer", &kvref::Plan::peer)
      .def_ro("layer_ids", &kvref::Plan::layer_ids)
      .def_ro("src_block_ids", &kvref::Plan::src_block_ids)
      .def_ro("dst_block_ids", &kvref::Plan::dst_block_ids)
      .def_ro("is_sender", &kvref::Plan::is_sender)
      .def("__repr__", [](const kvref::Plan& p) {
        return "Plan(uuid=" + p.uuid + ", peer=" + p.peer + ", " + std::to_string(p.layer_ids.size()) +
               " layers, " + std::to_string(p.src_block_ids.size()) + " blocks, " +
               (p.is_sender ? "sender" : "receiver") + ")";
      });

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
      .def("get", &PlanRegistry::get, nb::arg("uuid"));
}

}  // namespace kvref_bind
