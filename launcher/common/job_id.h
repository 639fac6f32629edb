// A job's id: it names the job's directory under the run dir, its shared
// memory, its persisted versions and its metrics, so the runner and every
// agent hold it to one rule.
#pragma once

#include <string>

#include "ftrun/status.h"

namespace ftrun {

// A fresh random job id ("job-1a2b3c4d").
std::string NewJobId();

// Ok when `id` is 1 to 63 letters, digits, '-', '_' and '.'; else
// InvalidArgument naming the id and the rule (`what` says where it came
// from, e.g. "job.id in run.yaml").
Status CheckJobId(const std::string& id, const std::string& what = "job id");

}  // namespace ftrun
