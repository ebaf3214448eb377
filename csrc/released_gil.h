// The GIL let go for a blocking call, and taken back safely at interpreter exit.
//
// A daemon thread that takes the GIL back while Python finalizes is ended by
// pthread_exit, whose unwinding through a C++ destructor (noexcept) calls
// std::terminate: "terminate called without an active exception", the process
// aborted. So at exit (an atexit hook, before finalizing starts) no thread but
// the exiting one takes the GIL back from a kvref call: each is parked for good
// and the process ends around it, as Python 3.14 does with its daemon threads.
#pragma once

#include <Python.h>

namespace kvref_bind {

class ReleasedGil {
 public:
  ReleasedGil();
  ~ReleasedGil();
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

// Called once at exit with the GIL held: from now on only this thread takes the
// GIL back from a kvref call; waits (GIL released, up to `seconds`) for the
// threads already taking it back.
void park_other_threads_at_exit(double seconds);

}  // namespace kvref_bind
