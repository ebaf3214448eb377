// Overflow-checked int64 arithmetic for sizes and offsets: a result that does
// not fit is an error naming the quantity, never a wrapped number.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvref {

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw std::overflow_error(std::string(what) + " overflows int64");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw std::overflow_error(std::string(what) + " overflows int64");
  return r;
}

// ceil(a / b) for a >= 0, b > 0, without forming a + b - 1.
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

}  // namespace kvref
