// The runner's scan of the persist directory for the coordinator (see
// Coordinator::Options::scan_disk): run on the runner's disk worker.
#include "launcher/runner/runner_impl.h"
#include "plugin/common/log.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {
namespace runner_impl {

std::vector<uint64_t> ScanDiskVersions(const std::string& dir, const std::string& job, int world) {
  PersistReader reader(nullptr, dir, job, world);
  std::vector<uint64_t> versions;
  std::vector<std::string> skipped;
  Status s = reader.ListComplete(&versions, &skipped);
  for (const auto& why : skipped) FTRUN_LOG_WARN("persist: {} ignored: {}", reader.job_dir(), why);
  if (!s.ok()) FTRUN_LOG_ERROR("persist: cannot read {}: {}", reader.job_dir(), s.message());
  return versions;
}

}  // namespace runner_impl
}  // namespace ftrun
