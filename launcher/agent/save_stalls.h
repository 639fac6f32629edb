// SaveStalls: the time this node's ranks spend inside their saves, as each
// rank's client reports it after every save (MsgType::kSaveStall: version,
// nanoseconds; no reply). Kept as histogram buckets for the metrics
// (ftrun_save_stall_seconds) and summed for the status file.
//
// Not thread-safe: called from the agent's event loop.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

class SaveStalls {
 public:
  // The buckets' upper bounds, in seconds (+Inf is implied after them).
  static const std::vector<double>& Bounds();
  SaveStalls() : buckets_(Bounds().size() + 1, 0) {}

  // A rank's report (DecodeSaveStall's payload); a malformed one is
  // refused and counts nothing.
  Status Report(std::string_view payload);
  void Add(double seconds);

  uint64_t count() const { return count_; }
  double sum_seconds() const { return sum_; }
  double max_seconds() const { return max_; }
  // Observations per bucket since the start (Bounds().size() + 1 of them).
  const std::vector<uint64_t>& buckets() const { return buckets_; }

 private:
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0;
  double sum_ = 0, max_ = 0;
};

}  // namespace ftrun
