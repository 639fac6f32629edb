// Clock: where a component reads the time, so that its tests drive time by
// hand (ManualClock) instead of sleeping. Production code uses
// Clock::Steady(), the process's monotonic clock. (The coordinator, a pure
// state machine, takes the time as an argument of every call instead.)
#pragma once

#include <chrono>

namespace ftrun {

class Clock {
 public:
  using Time = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual Time Now() const = 0;
  // std::chrono::steady_clock.
  static const Clock& Steady();
};

// Time that moves only when told to.
class ManualClock : public Clock {
 public:
  Time Now() const override { return now_; }
  void Advance(std::chrono::nanoseconds d) { now_ += d; }

 private:
  Time now_ = std::chrono::steady_clock::now();
};

}  // namespace ftrun
