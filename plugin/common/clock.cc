#include "plugin/common/clock.h"

namespace ftrun {
namespace {

class SteadyClock : public Clock {
 public:
  Time Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock& Clock::Steady() {
  static const SteadyClock clock;
  return clock;
}

}  // namespace ftrun
