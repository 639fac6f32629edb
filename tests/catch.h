// Catch2 for ftrun's C++ tests, on Debian 12 (Catch2 2.13) and Debian 13
// (Catch2 3.x): every test includes this instead of a Catch2 header. Under
// Catch2 3 it gives the names the tests use as Catch2 2 spelled them
// (Catch::Contains for a substring, Approx unqualified).
#ifndef FTRUN_TESTS_CATCH_H_
#define FTRUN_TESTS_CATCH_H_
// (An include guard: GCC 12 skips a file that starts with #pragma once and
// then tests __has_include.)

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#include <string>

namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& needle) {
  return Matchers::ContainsSubstring(needle);
}
using Matchers::EndsWith;
using Matchers::StartsWith;
}  // namespace Catch
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif

#endif  // FTRUN_TESTS_CATCH_H_
