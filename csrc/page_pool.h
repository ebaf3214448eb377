// Pages a parent reserves once and lends to each of its forked workers in
// turn: a worker's large buffers land on pages an earlier worker already
// touched, which the machine still backs.
//
// Why: a worker's own anonymous memory is freed when it exits, and a virtual
// machine that reports free pages to its host (virtio-balloon free page
// reporting) hands them back; the next worker's first touch of memory then
// costs the host's fault as well, several times the touch itself. Shared
// memory the parent keeps mapped is never freed between workers.
//
// The parent reserves `slots` regions (one per worker running at once) before
// it forks; each worker attaches to a slot no other running worker holds.
// A fork inside a worker gives the child a private copy of the slot, so
// parent and child never share a buffer (the fork semantics every caller
// expects of anonymous memory).
#pragma once

#include <cstdint>

namespace kvref::page_pool {

// Smaller buffers are not lent: their pages are few, and a slot is for the
// buffers that cost a worker most.
constexpr int64_t kSmallestLent = int64_t{256} << 10;

struct Stats {
  int64_t slots = 0, slot_bytes = 0;
  int attached = -1;         // this process's slot, or -1
  int64_t lent_bytes = 0;    // lent now
  int64_t touched_bytes = 0;  // the slot's extent this process has touched
};

// In the parent, before it forks: reserve `slots` regions of `slot_bytes`
// (address space only; pages are backed as workers touch them, and stay
// backed until this process exits). Once per process.
void reserve(int slots, int64_t slot_bytes);
// In a forked worker: lend from `slot` from now on.
void attach(int slot);
// Zero-filled, page-aligned memory from the attached slot, or nullptr (not
// attached, too small to lend, or no room left: the caller maps its own).
uint8_t* take(int64_t bytes);
// Gives back what take() lent; false if `p` is not a block the pool lent.
bool give_back(uint8_t* p);
// The bytes lent at `p` (take's size rounded up to pages), or 0 if none are.
int64_t lent_bytes(const uint8_t* p);
Stats stats();

}  // namespace kvref::page_pool
