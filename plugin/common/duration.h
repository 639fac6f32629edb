// A duration as (fractional) milliseconds, for logs, status files and reports.
#pragma once

#include <chrono>

namespace ftrun {

inline double Ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace ftrun
