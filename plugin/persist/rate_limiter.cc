// Token bucket arithmetic for the flusher's rate limit.
#include "plugin/persist/rate_limiter.h"

#include <algorithm>
#include <cmath>

namespace ftrun {

RateLimiter::RateLimiter(uint64_t bytes_per_sec, uint64_t burst)
    : rate_(bytes_per_sec),
      burst_(burst != 0 ? burst : std::max<uint64_t>(bytes_per_sec / 10, 1u << 20)),
      tokens_(static_cast<double>(burst_)) {}

std::chrono::nanoseconds RateLimiter::Debit(uint64_t n, TimePoint now) {
  if (rate_ == 0) return std::chrono::nanoseconds(0);
  if (started_ && now > last_) {
    double elapsed = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(static_cast<double>(burst_), tokens_ + elapsed * static_cast<double>(rate_));
  }
  if (!started_ || now > last_) last_ = now;
  started_ = true;
  tokens_ -= static_cast<double>(n);
  if (tokens_ >= 0) return std::chrono::nanoseconds(0);
  double wait_s = -tokens_ / static_cast<double>(rate_);
  return std::chrono::nanoseconds(static_cast<int64_t>(std::ceil(wait_s * 1e9)));
}

}  // namespace ftrun
