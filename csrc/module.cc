// The kvref._core extension module: its exceptions, and each concept's bindings (bind_*.cc).
#include "bindings.h"
#include "device.h"
#include "host_chunks.h"

NB_MODULE(_core, m) {
  m.doc() = "C++ core of kvref: tiled layouts, the simulated device, block transfers, plans.";
  // A process stopped mid-run (Ctrl-C) ends with objects that caches and
  // threads still hold; the process frees them, and a report of each in the
  // user's terminal would say nothing they can act on.
  nanobind::set_leak_warnings(false);
  nanobind::exception<kvref::DeviceError> device_error(m, "DeviceError", PyExc_RuntimeError);
  nanobind::exception<kvref::BufferNotReady>(m, "BufferNotReady", device_error.ptr());
  nanobind::exception<kvref::PoolExhausted>(m, "HostPoolExhausted", PyExc_ValueError);
  kvref_bind::bind_layout(m);
  kvref_bind::bind_device(m);
  kvref_bind::bind_mover(m);
  kvref_bind::bind_plans(m);
  m.def("park_other_threads_at_exit", &kvref_bind::park_other_threads_at_exit, nanobind::arg("seconds"),
        "At exit (atexit): no other thread takes the GIL back from a kvref call; see released_gil.h.");
}
