// RateLimiter: a token bucket in bytes for the lazy flusher's disk writes.
// The bucket holds up to `burst` bytes and refills at `bytes_per_sec`; a
// write may take more than is there, leaving a debt that the caller pays by
// waiting. So over any stretch the bytes written are at most
// burst + rate x time, whatever the write sizes.
//
// It only does the arithmetic: Debit says how long to wait, the caller
// waits (and can be interrupted). Time is passed in, so tests check the
// token math without a clock. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

namespace ftrun {

class RateLimiter {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // bytes_per_sec 0 = unlimited. burst 0 = a tenth of a second's worth, at
  // least 1 MiB. The bucket starts full.
  RateLimiter(uint64_t bytes_per_sec, uint64_t burst);

  // Takes n bytes at time `now`; returns how long the caller must wait before
  // writing them (zero while the bucket holds enough).
  std::chrono::nanoseconds Debit(uint64_t n, TimePoint now);

  uint64_t bytes_per_sec() const { return rate_; }
  uint64_t burst() const { return burst_; }
  double tokens() const { return tokens_; }  // may be negative: a debt

 private:
  const uint64_t rate_;
  const uint64_t burst_;
  double tokens_;
  bool started_ = false;
  TimePoint last_{};
};

}  // namespace ftrun
