// The scan of the persist directory that a coordinator asks its host for
// (Coordinator::Options::scan_disk): the versions of the job complete on
// disk. Run on a DiskWorker (disk_worker.h) by whichever process hosts the
// coordinator: the runner, or a one-node job's agent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

// Lists the complete versions of `job` (world size `world`) in `dir`, newest
// first, logging a WARN for each version directory it skips and why. An
// error when the job's directory exists but cannot be listed.
Status ScanDiskVersions(const std::string& dir, const std::string& job, int world, std::vector<uint64_t>* newest_first);

}  // namespace ftrun
