#include "released_gil.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace kvref_bind {
namespace {

std::atomic<bool> exiting{false};
std::atomic<int> taking_back{0};  // threads between deciding to take the GIL back and having it
std::thread::id exiting_thread;

[[noreturn]] void park() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

ReleasedGil::ReleasedGil() : state_(PyEval_SaveThread()) {}

ReleasedGil::~ReleasedGil() {
  taking_back.fetch_add(1);
  if (exiting.load() && std::this_thread::get_id() != exiting_thread) {
    taking_back.fetch_sub(1);
    park();
  }
  PyEval_RestoreThread(state_);
  taking_back.fetch_sub(1);
}

void park_other_threads_at_exit(double seconds) {
  exiting_thread = std::this_thread::get_id();
  exiting.store(true);
  // Those already on their way back get the GIL now, before finalizing starts.
  PyThreadState* state = PyEval_SaveThread();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (taking_back.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PyEval_RestoreThread(state);
}

}  // namespace kvref_bind
