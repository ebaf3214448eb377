// Bindings of the page pool a zygote lends to its workers, and the NumPy
// memory handler that lends it to arrays made inside kvref.lent_arrays().
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION  // PyDataMem handlers came in 1.22
#define PY_ARRAY_UNIQUE_SYMBOL kvref_core_numpy_api
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "bindings.h"
#include "page_pool.h"

namespace kvref_bind {
namespace {

namespace pool = kvref::page_pool;

void* lend(void*, size_t bytes) {
  uint8_t* p = pool::take(static_cast<int64_t>(bytes));
  return p ? p : std::malloc(bytes);
}

void* lend_zeroed(void*, size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) return nullptr;
  uint8_t* p = pool::take(static_cast<int64_t>(bytes));  // take() zeroes what it lends
  return p ? p : std::calloc(count, size);
}

void* relend(void* ctx, void* old, size_t bytes) {
  const int64_t had = pool::lent_bytes(static_cast<uint8_t*>(old));
  if (!had) return std::realloc(old, bytes);
  void* p = lend(ctx, bytes);
  if (p) {
    std::memcpy(p, old, std::min(static_cast<size_t>(had), bytes));
    pool::give_back(static_cast<uint8_t*>(old));
  }
  return p;
}

void give_back(void*, void* p, size_t) {
  if (!pool::give_back(static_cast<uint8_t*>(p))) std::free(p);
}

PyDataMem_Handler lending_handler = {
    "kvref_page_pool", 1, {nullptr, lend, lend_zeroed, relend, give_back}};

}  // namespace

void bind_page_pool(nb::module_& m) {
  if (_import_array() < 0) throw nb::python_error();
  m.def("reserve_page_pool", &pool::reserve, nb::arg("slots"), nb::arg("slot_bytes"),
        "In a parent, before it forks workers: reserve `slots` regions of `slot_bytes`.");
  m.def("attach_page_pool", &pool::attach, nb::arg("slot"),
        "In a forked worker: lend this process's simulated device memory from `slot`.");
  m.def("page_pool_stats", [] {
    const pool::Stats s = pool::stats();
    nb::dict d;
    d["slots"] = s.slots;
    d["slot_bytes"] = s.slot_bytes;
    d["attached"] = s.attached;
    d["lent_bytes"] = s.lent_bytes;
    d["touched_bytes"] = s.touched_bytes;
    d["smallest_lent"] = pool::kSmallestLent;
    return d;
  }, "The pool as this process sees it.");
  // Never released: NumPy keeps a reference in each array it allocated, and
  // arrays may outlive the module at exit.
  PyObject* handler = PyCapsule_New(&lending_handler, "mem_handler", nullptr);
  if (!handler) throw nb::python_error();
  m.def("set_array_memory", [](nb::object handler_capsule) {
    return nb::steal(PyDataMem_SetHandler(handler_capsule.is_none() ? nullptr : handler_capsule.ptr()));
  }, nb::arg("handler").none(),
  "Make NumPy allocate this context's arrays with `handler` (None: NumPy's default); "
  "returns the handler it replaces.");
  m.attr("page_pool_array_memory") = nb::handle(handler);
  m.def("page_pool_attached", [] { return pool::stats().attached >= 0; },
        "Whether this process lends from a slot of the page pool.");
}

}  // namespace kvref_bind
