// Deterministic test bytes for the transport contract tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace ftrun {

inline std::vector<char> Pattern(uint64_t seed, uint64_t length) {
  std::vector<char> v(length);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i + 8 <= length; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&v[i], &x, 8);
  }
  for (uint64_t i = length & ~7ull; i < length; ++i) v[i] = static_cast<char>(i);
  return v;
}

}  // namespace ftrun
