#include "launcher/agent/save_stalls.h"

#include <algorithm>

#include "plugin/ipc/wire.h"

namespace ftrun {

const std::vector<double>& SaveStalls::Bounds() {
  // From half a millisecond (a save of a few unchanged tensors) to 10 s.
  static const std::vector<double> kBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                              0.1,    0.25,  0.5,    1,     2.5,  5,     10};
  return kBounds;
}

Status SaveStalls::Report(std::string_view payload) {
  uint64_t version = 0;
  double seconds = 0;
  FTRUN_RETURN_IF_ERROR(DecodeSaveStall(payload, &version, &seconds));
  Add(seconds);
  return Status::Ok();
}

void SaveStalls::Add(double seconds) {
  const auto& b = Bounds();
  const size_t i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), seconds) - b.begin());
  buckets_[i]++;
  count_++;
  sum_ += seconds;
  max_ = std::max(max_, seconds);
}

}  // namespace ftrun
