#include "launcher/agent/test_faults.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "plugin/common/log.h"
#include "plugin/persist/fault_env.h"

namespace ftrun {

Env* RestoreReadEnv() {
  static Env* const env = []() -> Env* {
    const char* spec = std::getenv("FTRUN_TEST_DISK_READ_FAULTS");
    if (spec == nullptr || *spec == '\0') return PosixEnv();
    static std::unique_ptr<FaultEnv> fault = std::make_unique<FaultEnv>(PosixEnv());
    std::string s(spec);
    size_t a = s.find(':');
    size_t b = a == std::string::npos ? a : s.find(':', a + 1);
    int err = std::atoi(s.substr(0, a).c_str());
    unsigned long long count = a == std::string::npos ? 0 : std::strtoull(s.c_str() + a + 1, nullptr, 10);
    std::string part = b == std::string::npos ? "" : s.substr(b + 1);
    fault->FailReads(err, count, part);
    FTRUN_LOG_WARN(
        "FTRUN_TEST_DISK_READ_FAULTS={}: restores fail their first {} reads of '{}' with errno {} "
        "(a test seam)",
        spec, count, part, err);
    return fault.get();
  }();
  return env;
}

}  // namespace ftrun
