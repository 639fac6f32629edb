// Process identity across pid reuse: a pid names a process only together
// with its start time (field 22 of /proc/<pid>/stat, clock ticks since
// boot). ftrun records the start time next to every pid it writes to a
// status file, and a reader compares it before it waits on or signals the
// pid, so a recycled pid never gets another process killed. Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace ftrun {

// The start time of `pid`, or 0 when there is no such process (or it is a
// zombie, which will never run again).
uint64_t ProcessStartTime(pid_t pid);

// True when `pid` is alive and started at `start_time` (as ProcessStartTime
// gave it when the pid was recorded). A start_time of 0 never matches.
bool SameProcess(pid_t pid, uint64_t start_time);

}  // namespace ftrun
