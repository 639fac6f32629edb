#include "launcher/common/disk_scan.h"

#include "plugin/common/log.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {

Status ScanDiskVersions(const std::string& dir, const std::string& job, int world,
                        std::vector<uint64_t>* newest_first) {
  PersistReader reader(nullptr, dir, job, world);
  std::vector<std::string> skipped;
  Status s = reader.ListComplete(newest_first, &skipped);
  for (const auto& why : skipped) FTRUN_LOG_WARN("persist: {} ignored: {}", reader.job_dir(), why);
  return s.ok() ? s : s.Annotate("persist: cannot list " + reader.job_dir());
}

}  // namespace ftrun
